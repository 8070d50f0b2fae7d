"""`sglang serve` arguments: the few fi-cache reasons about (model, parallel sizes, MoE backend,
the autotune and determinism switches, where the server listens). Flag names: sglang/srt/
server_args.py 0.5.19:937-944 (--tp-size, alias --tensor-parallel-size), :2358-2364 (--ep-size,
aliases --expert-parallel-size, --ep); --pp-size, --dp-size, --attn-dp-size (0.5.22+), --nnodes,
--node-rank (arg_groups/fields/parallel.py 0.5.23:43-90, with their --pipeline-parallel-size,
--data-parallel-size, --attention-data-parallel-size aliases); --model-path (alias --model),
--host, --port; --dtype, --quantization (fields/model.py 0.5.23:160-184) and
--flashinfer-autotune-skip-ops (nargs="+", fields/exec_.py 0.5.23:398-407), which SGLang's
autotune key hashes."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from fi_cache.engines.scripts import runs_module
from fi_cache.errors import Refused
from fi_cache.versions import (
    SGLANG_A2A_EP_SPANNING,
    SGLANG_A2A_SETS_RUNNER,
    SGLANG_DETERMINISTIC_FLAG,
    SGLANG_DISABLE_AUTOTUNE_FLAG,
    SGLANG_LAUNCH_MODULE,
    SGLANG_PREFILL_CP_FLAG,
    SGLANG_RUNNER_ALIASES,
    SGLANG_WATERFILL_A2A,
    SGLANG_WATERFILL_FLAG,
    SGLANG_WATERFILL_KEEPS,
)

_SIZES = {
    "--tp-size": "tp",
    "--tensor-parallel-size": "tp",
    "--ep-size": "ep",
    "--expert-parallel-size": "ep",
    "--ep": "ep",
    "--pp-size": "pp",
    "--pipeline-parallel-size": "pp",
    "--dp-size": "dp",
    "--data-parallel-size": "dp",
    "--attn-dp-size": "attn_dp",
    "--attention-data-parallel-size": "attn_dp",
    "--nnodes": "nnodes",
}
_VALUED = (
    *_SIZES,
    "--model-path",
    "--model",
    "--moe-runner-backend",
    "--moe-a2a-backend",
    "--host",
    "--port",
    "--node-rank",
    "--dtype",
    "--quantization",
    "--cp-strategy",
)
_SKIP_OPS = "--flashinfer-autotune-skip-ops"  # one or more values (argparse nargs="+")
_SWITCHES = (
    SGLANG_DETERMINISTIC_FLAG,
    SGLANG_DISABLE_AUTOTUNE_FLAG,
    "--enable-dp-attention",
    SGLANG_WATERFILL_FLAG,
    SGLANG_PREFILL_CP_FLAG,
)
_CONFIG = "--config"  # a YAML file of more arguments (server_args.py 0.5.23:402-405, 683-686)


def _spelled(flag: str) -> str:
    """The flag `flag` stands for: itself, or the one of fi-cache's it is a prefix of (SGLang's
    argparse takes unique prefixes, e.g. `--tp 8`, as its docs write it). A prefix that is
    ambiguous in SGLang's parser is rejected there, so taking it here is never wrong."""
    if flag in _VALUED or flag in _SWITCHES or flag == _SKIP_OPS or len(flag) < 4:
        return flag
    matches = {f for f in (*_VALUED, *_SWITCHES, _SKIP_OPS) if f.startswith(flag)}
    return matches.pop() if len(matches) == 1 else flag


_ADDRESS_FLAGS = ("--host", "--port")  # where the server listens: not part of a warm's identity


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
    dp_attention: bool = False  # --enable-dp-attention: one TP group spans the DP ranks
    # --nnodes (server_args.py 0.5.18:1008): a multi-node server starts when every node does,
    # and nodes of rank >= 1 run no HTTP server (http_server.py 0.5.23:3163-3165).
    nnodes: int = 1
    pp: int = 1
    dp: int = 1  # --dp-size: replicas, or attention-DP ranks with --enable-dp-attention
    attn_dp: int = 1  # --attn-dp-size (0.5.22+): attention-DP ranks inside the TP group
    node_rank: int = 0
    # Settings from the environment that change what a start keeps (not arguments, but part of
    # a warm's identity): e.g. SGLANG_FLASHINFER_AUTOTUNE_CACHE=0.
    environment: tuple[str, ...] = ()
    dtype: str = "auto"  # --dtype as given
    quantization: str | None = None  # --quantization as given (SGLang may resolve one)
    skip_ops: tuple[str, ...] = ()  # --flashinfer-autotune-skip-ops
    a2a: str = "none"  # --moe-a2a-backend as SGLang resolves it
    # What model overrides start from (models.py): the runner and a2a after the aliases and
    # the EP size given, before SGLang's a2a passes; and the switches those overrides read.
    moe_given: tuple[str | None, str] = (None, "none")
    ep_given: int = 1
    waterfill: bool = False  # --enable-waterfill
    prefill_cp: bool = False  # --enable-prefill-cp
    cp_strategy: str | None = None  # --cp-strategy

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
        return json.dumps([*kept, *self.environment])

    def with_model_flag(self) -> list[str]:
        """argv with a positional model spelled `--model-path M`: `python -m
        sglang.launch_server` and `sglang serve` before 0.5.23 take no positional."""
        if self.model_at is None:
            return list(self.argv)
        at = self.model_at
        return [*self.argv[:at], "--model-path", self.argv[at], *self.argv[at + 1 :]]


def parse_sglang_args(argv: Sequence[str]) -> SglangArgs:
    """Raises Refused (exit 2) for a size that is not a positive integer, and for --config,
    whose YAML can set any of these where fi-cache does not look."""
    values: dict[str, str] = {}
    switches: set[str] = set()
    skip_ops: list[str] = []
    model, model_at = None, None
    args = list(argv)
    i = 0
    while i < len(args):
        given, eq, inline = args[i].partition("=")
        if given == _CONFIG:
            raise Refused(
                "SGLang's --config file is not read by fi-cache, and it can set the model, the "
                "parallel sizes and the switches fi-cache decides on: put them on the command line"
            )
        flag = _spelled(given)
        if flag in _VALUED:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            # --model is --model-path's alias (one argparse dest): the last one given wins.
            values[_SIZES.get(flag, "--model-path" if flag == "--model" else flag)] = value
            i += 1 if eq else 2
            continue
        if flag == _SKIP_OPS:  # nargs="+": the words up to the next flag (or the one after =)
            i += 1
            if eq:
                skip_ops.append(inline)
            while not eq and i < len(args) and not args[i].startswith("-"):
                skip_ops.append(args[i])
                i += 1
            continue
        if flag in _SWITCHES:
            switches.add(flag)
        elif not args[i].startswith("-") and model is None and i == 0:
            model, model_at = args[i], i  # 0.5.23 `sglang serve MODEL` (cli/serve.py:62-66)
        i += 1
    sizes = {}
    for name in ("tp", "ep", "pp", "dp", "attn_dp", "nnodes"):
        text = values.get(name, "1")
        if not text.isdigit() or int(text) < 1:
            flag = next(f for f, n in _SIZES.items() if n == name)
            raise Refused(f"SGLang argument {flag} {text!r} is not a positive integer")
        sizes[name] = int(text)
    node_rank = values.get("--node-rank", "0")
    if not node_rank.isdigit() or int(node_rank) >= sizes["nnodes"]:
        raise Refused(
            f"SGLang argument --node-rank {node_rank!r} is not a node of --nnodes "
            f"{sizes['nnodes']} (0 to {sizes['nnodes'] - 1})"
        )
    runner, a2a = values.get("--moe-runner-backend"), values.get("--moe-a2a-backend") or "none"
    if runner in SGLANG_RUNNER_ALIASES:  # resolved after parsing, as SGLang does
        runner, a2a = SGLANG_RUNNER_ALIASES[runner]
    moe_given, ep_given = (runner, a2a), sizes["ep"]
    waterfill = SGLANG_WATERFILL_FLAG in switches
    runner, a2a, sizes["ep"] = resolve_moe(runner, a2a, sizes["tp"], sizes["ep"], waterfill)
    flagged = values.get("--model-path")
    return SglangArgs(
        model=flagged or model,
        tp=sizes["tp"],
        ep=sizes["ep"],
        moe_backend=runner,
        deterministic=SGLANG_DETERMINISTIC_FLAG in switches,
        autotune_disabled=SGLANG_DISABLE_AUTOTUNE_FLAG in switches,
        argv=tuple(args),
        model_at=None if flagged else model_at,
        address={k: values[k] for k in _ADDRESS_FLAGS if k in values},
        dp_attention="--enable-dp-attention" in switches,
        nnodes=sizes["nnodes"],
        pp=sizes["pp"],
        dp=sizes["dp"],
        attn_dp=sizes["attn_dp"],
        node_rank=int(node_rank),
        dtype=values.get("--dtype", "auto"),
        quantization=values.get("--quantization"),
        skip_ops=tuple(skip_ops),
        a2a=a2a,
        moe_given=moe_given,
        ep_given=ep_given,
        waterfill=waterfill,
        prefill_cp=SGLANG_PREFILL_CP_FLAG in switches,
        cp_strategy=values.get("--cp-strategy"),
    )


def resolve_moe(
    runner: str | None, a2a: str, tp: int, ep: int, waterfill: bool, megamoe_env: bool = False
) -> tuple[str | None, str, int]:
    """(runner, a2a, EP size) after SGLang's a2a passes, in their order (moe_hook.py 0.5.23
    :292-331): waterfill's deepep (0.5.17's megamoe variable after it: versions.
    SGLANG_MEGAMOE_ENV), EP spanning the TP ranks, flashinfer_megamoe's runner."""
    if waterfill and a2a not in SGLANG_WATERFILL_KEEPS:
        a2a = SGLANG_WATERFILL_A2A
    if megamoe_env:
        a2a = "megamoe"
    if a2a in SGLANG_A2A_EP_SPANNING:
        ep = tp  # SGLang sets it so (arg_groups/overrides.py 0.5.23:1610-1620)
    if runner in (None, "auto") and a2a in SGLANG_A2A_SETS_RUNNER:
        runner = SGLANG_A2A_SETS_RUNNER[a2a]
    return runner, a2a, ep


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
    if runs_module(words, SGLANG_LAUNCH_MODULE):
        return words[:3], words[3:]
    return None, words


_TRUE, _FALSE = {"true", "1", "yes", "y"}, {"false", "0", "no", "n"}


def env_bool(value: str | None) -> bool | None:
    """SGLang's EnvBool (environ.py 0.5.23:77-85, 143-150): anything else means the default,
    " 0" and "0 " too (it lowers the value, never strips it)."""
    text = (value or "").lower()
    return True if text in _TRUE else False if text in _FALSE else None
