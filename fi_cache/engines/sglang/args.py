"""`sglang serve` arguments: the few fi-cache reasons about (model, parallel sizes, MoE backend,
the autotune and determinism switches, where the server listens). Flag names: sglang/srt/
server_args.py 0.5.19:937-944 (--tp-size, alias --tensor-parallel-size), :2358-2364 (--ep-size,
aliases --expert-parallel-size, --ep); --model-path (alias --model), --host, --port."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fi_cache.errors import Refused
from fi_cache.versions import (
    SGLANG_DETERMINISTIC_FLAG,
    SGLANG_DISABLE_AUTOTUNE_FLAG,
    SGLANG_LAUNCH_MODULE,
)

_SIZES = {"--tp-size": "tp", "--tensor-parallel-size": "tp", "--ep-size": "ep",
          "--expert-parallel-size": "ep", "--ep": "ep"}  # fmt: skip
_VALUED = (*_SIZES, "--model-path", "--model", "--moe-runner-backend", "--host", "--port")
_ADDRESS_FLAGS = ("--host", "--port")  # where the server listens: not part of a warm's identity
_PYTHON = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class SglangArgs:
    model: str | None = None
    tp: int = 1
    ep: int = 1
    moe_backend: str | None = None
    deterministic: bool = False
    autotune_disabled: bool = False
    argv: tuple[str, ...] = ()
    model_at: int | None = None  # index of a positional model (`sglang serve MODEL`, 0.5.23)
    address: dict[str, str] = field(default_factory=dict)  # --host / --port as given

    @property
    def key(self) -> str:
        """Identity of a warm: the arguments without where the server listens, the model first
        however it is spelled (`M ...` and `... --model-path M` are one warm)."""
        kept: list[str] = [self.model] if self.model else []
        args = list(self.with_model_flag())
        i = 0
        while i < len(args):
            name, eq, _ = args[i].partition("=")
            if name in ("--model-path", "--model") or name in _ADDRESS_FLAGS:
                i += 1 if eq else 2
            else:
                kept.append(args[i])
                i += 1
        return json.dumps(kept)

    def with_model_flag(self) -> list[str]:
        """argv with a positional model spelled `--model-path M`: `python -m
        sglang.launch_server` and `sglang serve` before 0.5.23 take no positional."""
        if self.model_at is None:
            return list(self.argv)
        at = self.model_at
        return [*self.argv[:at], "--model-path", self.argv[at], *self.argv[at + 1 :]]


def parse_sglang_args(argv: Sequence[str]) -> SglangArgs:
    """Raises Refused (exit 2) for a size that is not a positive integer."""
    values: dict[str, str] = {}
    model, model_at = None, None
    args = list(argv)
    i = 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        if flag in _VALUED:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            values[_SIZES.get(flag, flag)] = value
            i += 1 if eq else 2
            continue
        if not args[i].startswith("-") and model is None and i == 0:
            model, model_at = args[i], i  # 0.5.23 `sglang serve MODEL` (cli/serve.py:62-66)
        i += 1
    sizes = {}
    for name in ("tp", "ep"):
        text = values.get(name, "1")
        if not text.isdigit() or int(text) < 1:
            raise Refused(f"SGLang argument --{name}-size {text!r} is not a positive integer")
        sizes[name] = int(text)
    flagged = values.get("--model-path") or values.get("--model")
    return SglangArgs(
        model=flagged or model,
        tp=sizes["tp"],
        ep=sizes["ep"],
        moe_backend=values.get("--moe-runner-backend"),
        deterministic=SGLANG_DETERMINISTIC_FLAG in args,
        autotune_disabled=SGLANG_DISABLE_AUTOTUNE_FLAG in args,
        argv=tuple(args),
        model_at=None if flagged else model_at,
        address={k: values[k] for k in _ADDRESS_FLAGS if k in values},
    )


def require_model(args: SglangArgs) -> None:
    if not args.model:
        raise Refused(
            "no model in the SGLang arguments: give it as in `sglang serve`, e.g. "
            "`fi-cache serve --engine sglang --model-path Qwen/Qwen3-8B --port 30000`"
        )


def split_launcher(argv: Sequence[str]) -> tuple[list[str] | None, list[str]]:
    """A pasted SGLang command line split into its launcher and its arguments: `sglang serve
    ARGS` ([] when that is plain `sglang`), `PATH/sglang serve ARGS` ([PATH/sglang]) or `PYTHON
    -m sglang.launch_server ARGS` ([PYTHON, -m, module]); None when argv is just the arguments."""
    if len(argv) >= 2 and argv[1] == "serve" and os.path.basename(argv[0]) == "sglang":
        return ([] if argv[0] == "sglang" else [argv[0]]), list(argv[2:])
    words = list(argv)
    if words[1:3] == ["-m", SGLANG_LAUNCH_MODULE] and _PYTHON.fullmatch(os.path.basename(words[0])):
        return words[:3], words[3:]
    return None, words


_TRUE, _FALSE = {"true", "1", "yes", "y"}, {"false", "0", "no", "n"}


def env_bool(value: str | None) -> bool | None:
    """SGLang's EnvBool (environ.py 0.5.23:77-85, 143-150): anything else means the default."""
    text = (value or "").strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None
