"""`vllm serve` arguments: what fi-cache reads from them (model, port, parallel sizes, MoE and
autotune switches) and the identity of a warm."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fi_cache.engines.scripts import runs_module
from fi_cache.errors import Refused

# Flags whose value is not part of "what is served": where it listens.
_ADDRESS_FLAGS = {"--port", "--host", "--uds"}
# `vllm serve` flags that take no value, so the token after them may be the model: every
# `--no-*`, `--enable-*` and `--disable-*` flag of 0.32 (BooleanOptionalAction) and 0.33/0.34
# (EnableDisableAction) but one, and these; listed from the nargs=0 actions of 0.32's own serve
# parser (entrypoints/cli/serve.py `subparser_init`) and, for 0.33 and 0.34, derived from their
# wheels' argparse calls (tests/engines/vllm/serve_flags.py). 0.34 adds two (engine/arg_utils.py
# 0.34:1074-1077 --checkpoint-prepare-on-startup, 1117-1120 --shuffle-safetensors-files).
_BOOL_PREFIXES = ("--no-", "--enable-", "--disable-")
_VALUE_FLAGS_WITH_BOOL_PREFIX = {"--disable-access-log-for-endpoints"}
_BOOL_FLAGS = {
    "--aggregate-engine-logging",
    "--allow-credentials",
    "--allow-deprecated-quantization",
    "--async-scheduling",
    "--checkpoint-prepare-on-startup",
    "--cohere-is-reasoning-model",
    "--cudagraph-metrics",
    "--data-parallel-external-lb",
    "--data-parallel-hybrid-lb",
    "--data-parallel-multi-port-external-lb",
    "--dcp-q-replicate",
    "--enforce-eager",
    "--exclude-tools-when-tool-choice-none",
    "--fail-on-environ-validation",
    "--fully-sharded-loras",
    "--grpc",
    "--headless",
    "--interleave-mm-strings",
    "--jit-monitor-verbose",
    "--kv-cache-metrics",
    "--kv-sharing-fast-prefill",
    "--language-model-only",
    "--log-error-stack",
    "--long-prefill-token-threshold-adaptive",
    "--mm-device-do-normalize",
    "--mm-encoder-only",
    "--monokernel",
    "--numa-bind",
    "--ray-workers-use-nsight",
    "--return-sampling-mask",
    "--return-tokens-as-token-ids",
    "--scheduler-reserve-full-isl",
    "--shuffle-safetensors-files",
    "--skip-mm-profiling",
    "--skip-tokenizer-init",
    "--sleep-mode-offload-cudagraph",
    "--specialize-active-lora",
    "--swa-bounded-replay",
    "--tokens-only",
    "--trust-remote-code",
    "--trust-request-chat-template",
    "--trust-request-mm-kwargs",
    "--use-fp64-gumbel",
    "--use-replayssm",
    "--use-tqdm-on-load",
    "-dpe",
    "-dph",
    "-dpm",
    "-ep",
    "-h",
    "--help",
}


def _is_bool_flag(name: str) -> bool:
    if name in _BOOL_FLAGS:
        return True
    return name.startswith(_BOOL_PREFIXES) and name not in _VALUE_FLAGS_WITH_BOOL_PREFIX


_SIZE_FLAGS = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--nnodes": "nnodes",
    "-n": "nnodes",
}
_AUTOTUNE_OFF_FLAGS = {"--disable-flashinfer-autotune", "--no-enable-flashinfer-autotune"}
_AUTOTUNE_FALSE = re.compile(r"\"enable_flashinfer_autotune\"\s*:\s*false")
# vLLM's parser rewrites `--kernel-config.enable_flashinfer_autotune false` (or `=false`) into
# `--kernel-config '{...}'` (utils/argparse_utils.py 0.25:403-405 ... 0.33:476-478).
_DOTTED_AUTOTUNE = "--kernel-config.enable_flashinfer_autotune"
# Only vLLM 0.33 has --disable-flashinfer-autotune (EnableDisableAction, argparse_utils.py:179,
# arg_utils.py:1839); 0.25-0.32 reject it as an unrecognised argument.
DISABLE_FLAG = "--disable-flashinfer-autotune"


@dataclass(frozen=True)
class ServeArgs:
    """What fi-cache needs to know from `vllm serve` arguments."""

    argv: tuple[str, ...]
    model: str | None
    port: int | None
    uses_ray: bool
    tp: int = 1
    dp: int = 1
    pp: int = 1
    nnodes: int = 1
    elastic_ep: bool = False
    expert_parallel: bool = False
    all2all_backend: str | None = None
    moe_backend: str | None = None
    autotune_off: bool = False  # -O0, --disable-flashinfer-autotune, kernel-config false
    disable_flag: bool = False  # --disable-flashinfer-autotune itself (vLLM 0.33+ only)
    model_at: int | None = None  # index of a positional model in argv (None: --model or none)
    model_tokens: tuple[int, ...] = ()  # indexes in argv that name the model (M, --model M)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def key(self) -> str:
        """Identity of a warm: the arguments without where the server listens, the model first
        however it is spelled (`M ...` and `... --model M` are one warm)."""
        kept: list[str] = [self.model] if self.model else []
        skip = False
        for i, arg in enumerate(self.argv):
            if skip or i in self.model_tokens:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if name in _ADDRESS_FLAGS:
                skip = "=" not in arg
                continue
            kept.append(arg)
        return hashlib.sha256("\0".join(kept).encode()).hexdigest()[:16]


def _int_flag(name: str, value: str | None) -> int:
    try:
        number = int(value or "")
    except ValueError:
        raise Refused(f"vLLM would reject {name} {value!r}: not a number") from None
    if number < 1 and name != "--port":
        raise Refused(f"vLLM would reject {name} {number}: must be at least 1")
    return number


def vllm_spelling(name: str) -> str:
    """An option name as vLLM reads it: `_` becomes `-` between the leading `--` and the first
    `.` (`--tensor_parallel_size`, `--kernel_config.enable_flashinfer_autotune`;
    utils/argparse_utils.py 0.32:337-357, run in tests/engines/vllm/test_vllm_args.py)."""
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def parse_serve_args(argv: Sequence[str]) -> ServeArgs:
    """The model (positional or --model), --port, parallel sizes, MoE and autotune switches."""
    found: dict[str, object] = {"model": None, "port": None, "uses_ray": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        name = vllm_spelling(name)
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        takes_value = arg.startswith("-") and not eq and not _is_bool_flag(name)
        if name == "--model" and value:
            found["model"] = value
            found["model_at"] = None
            found["model_tokens"] = (i,) if eq else (i, i + 1)
        elif name == "--port":
            found["port"] = _int_flag(name, value)
        elif name in _SIZE_FLAGS:
            found[_SIZE_FLAGS[name]] = _int_flag(name, value)
        elif name == "--distributed-executor-backend" and value == "ray":
            found["uses_ray"] = True
        elif name == "--enable-elastic-ep":
            found["elastic_ep"] = True
        elif name in ("--enable-expert-parallel", "-ep"):
            found["expert_parallel"] = True
        elif name == "--all2all-backend":
            found["all2all_backend"] = value
        elif name == "--moe-backend":
            found["moe_backend"] = value
        elif (
            name in _AUTOTUNE_OFF_FLAGS
            or (name in ("-O0", "-O", "--optimization-level") and (name == "-O0" or value == "0"))
            or (name == "--kernel-config" and value and _AUTOTUNE_FALSE.search(value))
            or (name == _DOTTED_AUTOTUNE and value is not None and value.lower() == "false")
        ):
            found["autotune_off"] = True
            found["disable_flag"] = found.get("disable_flag") or name == DISABLE_FLAG
        elif not arg.startswith("-") and found["model"] is None:
            found["model"] = arg
            found["model_at"] = i
            found["model_tokens"] = (i,)
        if name == "-O0" or (name.startswith("-O") and len(name) == 3):
            takes_value = False  # -O3 carries its level inline
        i += 2 if takes_value else 1
    return ServeArgs(tuple(argv), **found)  # type: ignore[arg-type]


def with_model_flag(argv: Sequence[str]) -> list[str]:
    """`argv` with a positional model spelled `--model M` (for parsers that take no positional)."""
    at = parse_serve_args(argv).model_at
    if at is None:
        return list(argv)
    return [*argv[:at], "--model", argv[at], *argv[at + 1 :]]


def require_model(args: ServeArgs) -> None:
    if not args.model:
        quantization = (
            " (-q after the command is vLLM's --quantization; fi-cache's own is --quiet there)"
            if "-q" in args.argv
            else ""
        )
        raise Refused(
            "no model in the vLLM arguments: give it as in `vllm serve`, e.g. "
            f"`fi-cache serve Qwen/Qwen3-8B --port 8000` (or --model NAME){quantization}"
        )


API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def split_launcher(argv: Sequence[str]) -> tuple[list[str] | None, list[str]]:
    """A pasted vLLM command line split into its launcher and its arguments: `vllm serve ARGS`
    ([] when that is plain `vllm`: the usual lookup finds it), `PATH/vllm serve ARGS` ([PATH/vllm])
    or `PYTHON -m vllm.entrypoints.openai.api_server ARGS` ([PYTHON, -m, module]); None when argv
    is just the arguments. vLLM takes one positional (the model), so `vllm serve` is never one."""
    if len(argv) >= 2 and argv[1] == "serve" and os.path.basename(argv[0]) == "vllm":
        return ([] if argv[0] == "vllm" else [argv[0]]), list(argv[2:])
    words = list(argv)
    if runs_module(words, API_SERVER_MODULE):
        return words[:3], words[3:]
    return None, words
