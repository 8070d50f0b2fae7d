"""SGLang's autotune key dir for a start, by SGLang's own code: `flashinfer_autotune_cache_path`
of the installed release (versions.SGLANG_KEY_MODULE), run over stand-ins for what it reads of
the worker. It hashes the model argument as given, the resolved dtype, quantisation and MoE
backend, the parallel sizes, the HF config class and the skip ops (versions.SGLANG_KEY_FIELDS).

Four of those only SGLang's worker knows (it resolves `auto`s and loads the HF config). They are
solved from the key dir an earlier warm of the same model wrote: the few values they can take
are tried until SGLang's code gives that dir's name back. Nothing here guesses: a start whose
key cannot be reproduced that way is not seeded.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import itertools
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fi_cache.engines.sglang.args import SglangArgs
from fi_cache.versions import SGLANG_KEY_DIR, SGLANG_WORKAROUND_SKIPS

# --dtype words (fields/model.py 0.5.23:160-176) -> str() of the torch dtype the key hashes.
DTYPES = {
    "half": "torch.float16",
    "float16": "torch.float16",
    "bfloat16": "torch.bfloat16",
    "float": "torch.float32",
    "float32": "torch.float32",
}
# The MoE runner backends under which SGLang tunes (its `auto` resolves to one of them, or to
# another backend when FlashInfer FP4/FP8 GEMMs are what it tunes).
BACKENDS = (
    "flashinfer_cutlass",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutedsl",
    "flashinfer_mxfp4",
    "auto",
    "triton",
    "triton_kernel",
    "deep_gemm",
    "cutlass",
)
_NEEDED = (
    "FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS",
    "get_flashinfer_autotune_skip_ops",
    "flashinfer_autotune_cache_path",
)


class KeyCodeChanged(ValueError):
    """The release's key code is not what fi-cache knows how to run."""


@dataclass(frozen=True)
class KeyInputs:
    model_path: str
    dtype: str  # str() of the torch dtype: "torch.bfloat16"
    quantization: str | None
    moe_backend: str
    tp: int
    pp: int
    attn_dp: int
    ep: int
    hf_class: str
    skip_ops: frozenset[str]  # the user's; the release adds its own workaround skips


class KeyCode:
    """One release's key function, compiled from its source text."""

    def __init__(self, source: str, where: str) -> None:
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise KeyCodeChanged(f"{where}: {exc.msg}") from None
        body = [n for n in tree.body if _defines(n) & {*_NEEDED, "annotations"}]
        if "flashinfer_autotune_cache_path" not in set().union(*map(_defines, body)):
            raise KeyCodeChanged(f"{where} has no flashinfer_autotune_cache_path")
        self.where = where
        self._code = compile(ast.Module(body=body, type_ignores=[]), where, "exec")

    def key(self, inputs: KeyInputs, base: Path | None = None) -> str:
        """The 16-hex key dir name SGLang's code gives for `inputs`; the code makes the dir, so
        under `base` (a scratch dir; a fresh one when None)."""
        if base is None:
            with tempfile.TemporaryDirectory(prefix="fi-cache-sglang-key-") as tmp:
                return self.key(inputs, Path(tmp))
        rel = self._call(inputs, base).relative_to(base).parts
        if (
            len(rel) != 6
            or rel[:2] != ("flashinfer", "autotune")
            or not SGLANG_KEY_DIR.match(rel[4])
        ):
            raise KeyCodeChanged(f"{self.where} names {'/'.join(rel)}: not a key dir")
        return rel[4]

    def skips(self) -> frozenset[str]:
        """The skip ops the release adds to the user's (its workaround skips)."""
        return frozenset(self._run(_inputs_for_skips(), "get_flashinfer_autotune_skip_ops"))

    def _call(self, inputs: KeyInputs, base: Path) -> Path:
        path = self._run(inputs, "flashinfer_autotune_cache_path", base)
        if not isinstance(path, Path):
            raise KeyCodeChanged(f"{self.where}: the key function returned {type(path).__name__}")
        return path

    def _run(self, inputs: KeyInputs, name: str, base: Path | None = None) -> Any:
        runner, glb = _stand_ins(inputs, base or Path(tempfile.gettempdir()))
        try:
            exec(self._code, glb)
            return glb[name](runner)
        except KeyCodeChanged:
            raise
        except Exception as exc:  # the release reads something the stand-ins do not have
            raise KeyCodeChanged(f"{self.where}: {type(exc).__name__}: {exc}") from None


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return {a.name for a in node.names}
    return set()


def _inputs_for_skips() -> KeyInputs:
    return KeyInputs("", "", None, "", 1, 1, 1, 1, "", frozenset())


def _stand_ins(inputs: KeyInputs, base: Path) -> tuple[Any, dict[str, Any]]:
    """The model runner and module globals the key code reads, in every release's spelling
    (server_args in 0.5.17, runtime-context bags from 0.5.18, mr.* sizes in 0.5.21)."""
    ns = SimpleNamespace
    skips = sorted(inputs.skip_ops) or None
    parallel = ns(
        tp_size=inputs.tp,
        pp_size=inputs.pp,
        attn_dp_size=inputs.attn_dp,
        moe_ep_size=inputs.ep,
        tp_rank=0,
        pp_rank=0,
        dp_rank=0,
    )
    server_args = ns(
        model_path=inputs.model_path,
        quantization=inputs.quantization,
        moe_runner_backend=inputs.moe_backend,
        flashinfer_autotune_skip_ops=skips,
    )
    model_config = ns(
        quantization=inputs.quantization, hf_config=type(inputs.hf_class or "Config", (), {})()
    )
    runner = ns(
        device="cuda",
        dtype=inputs.dtype,
        ps=parallel,
        server_args=server_args,
        model_config=model_config,
        is_draft_worker=False,
        gpu_id=0,
        tp_size=inputs.tp,
        attn_dp_size=inputs.attn_dp,
        moe_ep_size=inputs.ep,
        tp_rank=0,
        dp_rank=0,
    )
    platform = ns(get_device_uuid=lambda _i: "0")
    modules = {
        "flashinfer": ns(__version__="0"),
        "sglang.srt.platforms": ns(current_platform=platform),
    }

    def only_stand_ins(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in modules:
            return modules[name]
        if name == "__future__":
            return __import__(name, *args, **kwargs)
        raise KeyCodeChanged(f"the key code imports {name}")

    glb: dict[str, Any] = {
        "__builtins__": {**vars(builtins), "__import__": only_stand_ins},
        "Path": Path,
        "hashlib": hashlib,
        "torch": ns(cuda=ns(get_device_capability=lambda _d: (9, 0))),
        "envs": ns(SGLANG_CACHE_DIR=ns(get=lambda: str(base))),
        "get_model": lambda: ns(model_path=inputs.model_path, quantization=inputs.quantization),
        "get_exec": lambda: ns(
            moe=ns(moe_runner_backend=inputs.moe_backend),
            kernel=ns(flashinfer_autotune_skip_ops=skips),
        ),
        "get_parallel": lambda: parallel,
        "get_server_args": lambda: server_args,
    }
    return runner, glb


# --- solving the worker's values from a dir an earlier warm wrote ------------------------------


def sizes(args: SglangArgs) -> dict[str, int]:
    """The parallel sizes the key hashes, as SGLang sets them from these arguments
    (layout.rank_layout's attention-DP rule)."""
    attn_dp = args.attn_dp if args.attn_dp > 1 else (args.dp if args.dp_attention else 1)
    return {"tp": args.tp, "pp": args.pp, "attn_dp": attn_dp, "ep": args.ep}


def config_classes(config: Mapping[str, Any] | None) -> list[str]:
    """HF config class names a config.json may load as: from `architectures` (Qwen3MoeForCausalLM
    -> Qwen3MoeConfig) and from `model_type` (qwen3_moe -> Qwen3MoeConfig)."""
    if not config:
        return []
    names: list[str] = []
    for arch in config.get("architectures") or ():
        if isinstance(arch, str):
            for tail in ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model"):
                if arch.endswith(tail) and len(arch) > len(tail):
                    names.append(arch[: -len(tail)] + "Config")
                    break
    mt = config.get("model_type")
    if isinstance(mt, str) and mt:
        words = mt.replace("-", "_").split("_")
        names.append("".join(w[:1].upper() + w[1:] for w in words) + "Config")
    return list(dict.fromkeys(names))


def quantizations(args: SglangArgs, config: Mapping[str, Any] | None) -> list[str | None]:
    if args.quantization:
        return [args.quantization]
    qc = (config or {}).get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    found: list[str | None] = [None]
    if isinstance(method, str) and method:
        found += [method, method.replace("-", "_")]
        if method == "modelopt":
            found += ["modelopt_fp8", "modelopt_fp4"]
    return list(dict.fromkeys(found))


def solve(
    code: KeyCode, args: SglangArgs, config: Mapping[str, Any] | None, key: str
) -> KeyInputs | None:
    """The inputs for which `code` gives `key` for a start of `args`, or None."""
    dtypes = [DTYPES[args.dtype]] if args.dtype in DTYPES else sorted(set(DTYPES.values()))
    backend = args.moe_backend
    backends = [backend] if backend and backend != "auto" else list(BACKENDS)
    user = frozenset(args.skip_ops)
    skip_sets = list(dict.fromkeys([user, *(user | w for w in SGLANG_WORKAROUND_SKIPS)]))
    base = KeyInputs(args.model or "", "", None, "", **sizes(args), hf_class="", skip_ops=user)
    with tempfile.TemporaryDirectory(prefix="fi-cache-sglang-key-") as tmp:
        for cls, dtype, quant, moe, skips in itertools.product(
            config_classes(config), dtypes, quantizations(args, config), backends, skip_sets
        ):
            guess = replace(
                base, hf_class=cls, dtype=dtype, quantization=quant, moe_backend=moe, skip_ops=skips
            )
            if code.key(guess, Path(tmp)) == key:
                return guess
    return None


def carried(
    solved: KeyInputs, solved_args: SglangArgs, args: SglangArgs, code: KeyCode
) -> tuple[KeyInputs | None, str | None]:
    """This start's inputs: its own arguments, and the worker's values of `solved` (an earlier
    warm's of the same model, dtype and quantisation arguments: seeds.same_model) where the
    arguments that decide them are the same; (None, why) when a value cannot be known, or when
    SGLang would not reuse those tactics."""
    backend = args.moe_backend if args.moe_backend and args.moe_backend != "auto" else None
    if backend is None:  # auto's answer carries only where what it depends on is the same
        if (solved_args.moe_backend or "auto") != "auto" or sizes(args) != sizes(solved_args):
            return None, "--moe-runner-backend auto is resolved by SGLang's worker"
        backend = solved.moe_backend
    # The key's skips are the user's plus the release's own (solve matched them as the user's).
    old_skips = solved.skip_ops | code.skips()
    if extra := sorted((frozenset(args.skip_ops) | code.skips()) - old_skips):
        return None, (
            f"this start skips tuning {', '.join(extra)}, which the earlier warm tuned: SGLang "
            "keys a different skip policy apart so that its tactics are not reused"
        )
    n = sizes(args)
    inputs = replace(
        solved,
        model_path=args.model or "",
        moe_backend=backend,
        skip_ops=frozenset(args.skip_ops),
        tp=n["tp"],
        pp=n["pp"],
        attn_dp=n["attn_dp"],
        ep=n["ep"],
    )
    return inputs, None


def rank_paths(
    root: Path, fi_arch: tuple[str, str], key: str, names: Iterable[str]
) -> Iterator[Path]:
    """`root/<flashinfer>/<sm..>/<key>/rank_<name>.json` for each rank name."""
    for name in names:
        yield root.joinpath(*fi_arch, key, f"rank_{name}.json")
