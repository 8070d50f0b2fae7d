"""Where SGLang keeps things when fi-cache is not in charge: its cache dir as SGLang reads it, and
the rank files a deployment's schedulers write there."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fi_cache.engines.sglang.args import SglangArgs
from fi_cache.versions import (
    SGLANG_AUTOTUNE_SUBDIR,
    SGLANG_CACHE_DIR_DEFAULT,
    SGLANG_CACHE_DIR_ENV,
    SGLANG_LEGACY_PREFIX,
)


def legacy_name(name: str) -> str:
    """SGLANG_X's legacy twin, SGL_X."""
    legacy, new = SGLANG_LEGACY_PREFIX
    return legacy + name.removeprefix(new)


def effective(environ: Mapping[str, str], name: str) -> str | None:
    """The value SGLang sees for SGLANG_X: its legacy twin SGL_X when set, which SGLang copies
    over it at import (versions.SGLANG_LEGACY_PREFIX), else SGLANG_X itself."""
    twin = legacy_name(name)
    return environ[twin] if twin in environ else environ.get(name)


def user_cache_dir(environ: Mapping[str, str]) -> str:
    """The user's SGLANG_CACHE_DIR as SGLang's derived defaults read it (expanduser: environ.py
    0.5.23:31-37), with the HOME of `environ` (the one SGLang will see)."""
    path = effective(environ, SGLANG_CACHE_DIR_ENV) or SGLANG_CACHE_DIR_DEFAULT
    home = environ.get("HOME")
    if home and (path == "~" or path.startswith("~/")):
        return home + path[1:]
    return os.path.expanduser(path)


def autotune_root(environ: Mapping[str, str]) -> Path:
    """`$SGLANG_CACHE_DIR/flashinfer/autotune`: a set value as given, as flashinfer_autotune.py
    0.5.23:190 joins it (no `~` expansion); the default expanded at import."""
    value = effective(environ, SGLANG_CACHE_DIR_ENV)
    base = Path(value) if value is not None else Path(user_cache_dir(environ))
    return base.joinpath(*SGLANG_AUTOTUNE_SUBDIR)


@dataclass(frozen=True)
class RankLayout:
    """The rank files of one SGLang deployment (names without `rank_` and `.json`), in launch
    order, and those this node's schedulers write; `on_worker`: what in the names or the dir
    is known only on the GPU worker."""

    ranks: tuple[str, ...]
    node: tuple[str, ...]
    on_worker: tuple[str, ...]


def rank_layout(args: SglangArgs) -> RankLayout:
    """What SGLang 0.5.12-0.5.23's schedulers name their files: `tp{t}_pp{p}_dp{d}` with t the
    rank in the TP group, d the replica (plain --dp-size) or, with --enable-dp-attention /
    --attn-dp-size, t // (tp / attn_dp) (compute_dp_attention_world_info, dp_attention.py
    0.5.12:240-254); every node runs every replica's share of TP ranks and PP stages
    (`_calculate_rank_ranges`, entrypoints/engine.py 0.5.23:2045-2077; data_parallel_controller
    .py 0.5.23:694-712)."""
    attn_dp = args.attn_dp if args.attn_dp > 1 else (args.dp if args.dp_attention else 1)
    replicas = 1 if attn_dp > 1 else args.dp
    attn_tp = max(args.tp // attn_dp, 1)
    every = [
        f"tp{t}_pp{p}_dp{t // attn_tp if attn_dp > 1 else d}"
        for d in range(replicas)
        for p in range(args.pp)
        for t in range(args.tp)
    ]
    per_pp = max(args.pp // args.nnodes, 1)
    nodes_per_pp = max(args.nnodes // args.pp, 1)
    stage = args.node_rank // nodes_per_pp
    per_node_tp = max(args.tp // nodes_per_pp, 1)
    share = args.node_rank % nodes_per_pp
    pps = range(per_pp * stage, per_pp * (stage + 1))
    tps = range(per_node_tp * share, per_node_tp * (share + 1))
    node = [r for r in every if _tp_pp(r)[0] in tps and _tp_pp(r)[1] in pps]
    worker = [
        "the key dir (sha256 of model path, dtype, quantization, sizes and the HF config "
        "class: flashinfer_autotune.py 0.5.23:172-191)"
    ]
    if args.moe_backend == "flashinfer_megamoe":  # as args resolve it
        worker.append("the `_gpu<uuid>` suffix of MegaMoE's files (0.5.22+: each GPU's UUID)")
    return RankLayout(tuple(every), tuple(node), tuple(worker))


def _tp_pp(rank: str) -> tuple[int, int]:
    tp, pp, _ = rank.split("_")
    return int(tp[2:]), int(pp[2:])
