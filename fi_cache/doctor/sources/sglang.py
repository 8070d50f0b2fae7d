"""SGLang's side of a diagnosis: its `serve` arguments, the servers running here, and where a
start from this shell would keep its cache and on which GPUs (engines/sglang/live.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.engines.sglang import layout as sglang_layout
from fi_cache.engines.sglang import live as sglang_live
from fi_cache.engines.sglang.args import SglangArgs, parse_sglang_args
from fi_cache.engines.sglang.live import Engine as LiveSglang


@dataclass(frozen=True)
class SglangSide:
    args: SglangArgs
    live: tuple[LiveSglang, ...]
    here: tuple[str, frozenset[str] | None]
    predicted: Path  # where plain `sglang serve` keeps its autotune files


def read(argv: Sequence[str] | None, environ: dict[str, str]) -> SglangSide:
    return SglangSide(
        parse_sglang_args(argv or ()),
        tuple(sglang_live.running()),
        (sglang_layout.user_cache_dir(environ), sglang_live.devices(environ)),
        sglang_layout.autotune_root(environ),
    )
