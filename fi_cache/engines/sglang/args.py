"""`sglang serve` arguments: the few fi-cache reasons about (parallel sizes, MoE backend, the
autotune and determinism switches). Flag names: sglang/srt/server_args.py 0.5.19:937-944
(--tp-size, alias --tensor-parallel-size), :2358-2364 (--ep-size, aliases --expert-parallel-size,
--ep)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fi_cache.errors import Refused
from fi_cache.versions import SGLANG_DETERMINISTIC_FLAG, SGLANG_DISABLE_AUTOTUNE_FLAG

_SIZES = {"--tp-size": "tp", "--tensor-parallel-size": "tp", "--ep-size": "ep",
          "--expert-parallel-size": "ep", "--ep": "ep"}  # fmt: skip


@dataclass(frozen=True)
class SglangArgs:
    model: str | None = None
    tp: int = 1
    ep: int = 1
    moe_backend: str | None = None
    deterministic: bool = False
    autotune_disabled: bool = False


def parse_sglang_args(argv: Sequence[str]) -> SglangArgs:
    """Raises Refused (exit 2) for a size that is not a positive integer."""
    values: dict[str, str] = {}
    model = None
    args = list(argv)
    i = 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        takes = flag in _SIZES or flag in ("--model-path", "--model", "--moe-runner-backend")
        if takes:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            values[_SIZES.get(flag, flag)] = value
            i += 1 if eq else 2
            continue
        if not args[i].startswith("-") and model is None and i == 0:
            model = args[i]  # 0.5.23 `sglang serve MODEL` (cli/serve.py:62-66)
        i += 1
    sizes = {}
    for name in ("tp", "ep"):
        text = values.get(name, "1")
        if not text.isdigit() or int(text) < 1:
            raise Refused(f"SGLang argument --{name}-size {text!r} is not a positive integer")
        sizes[name] = int(text)
    return SglangArgs(
        model=values.get("--model-path") or values.get("--model") or model,
        tp=sizes["tp"],
        ep=sizes["ep"],
        moe_backend=values.get("--moe-runner-backend"),
        deterministic=SGLANG_DETERMINISTIC_FLAG in args,
        autotune_disabled=SGLANG_DISABLE_AUTOTUNE_FLAG in args,
    )


_TRUE, _FALSE = {"true", "1", "yes", "y"}, {"false", "0", "no", "n"}


def env_bool(value: str | None) -> bool | None:
    """SGLang's EnvBool (environ.py 0.5.23:77-85, 143-150): anything else means the default."""
    text = (value or "").strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None
