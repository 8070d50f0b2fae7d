"""A tuning plan: which FlashInfer operations to tune, at which shapes, for which finalize modes.

Pure: parse a TOML plan into frozen dataclasses (every problem is a PlanError naming the op), write
one back out, and answer which ops a finalize mode's namespace gets. Nothing here imports torch or
FlashInfer; the checks that need the GPU run in fi_cache/engines/flashinfer/driver.py.

    tokens = [1, 16, 128, 1024]        # default for every op: the token counts each op is run at

    [[ops]]
    op = "mm_bf16"                     # a (tokens x k) @ b (k x n), bf16
    n = 2048
    k = 4096
    backends = ["cublaslt", "cudnn"]

    [[ops]]
    op = "cutlass_fused_moe"
    dtype = "bf16"
    hidden_size = 2048
    intermediate_size = 768            # per expert, before tensor parallelism
    num_experts = 128
    top_k = 8
    finalize = ["fused", "unfused"]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fi_cache.errors import Refused
from fi_cache.store.namespace import FINALIZE_MODES, FinalizeMode
from fi_cache.versions import GEMM_BACKENDS, MM_BF16_BF16_OUT_ONLY, MOE_DTYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

MOE_OP = "cutlass_fused_moe"
GEMM_OPS = tuple(GEMM_BACKENDS)  # mm_bf16, bmm_fp8, mm_fp8
KNOWN_OPS = (*GEMM_OPS, MOE_OP)
MAX_TOKENS = 1 << 20  # beyond any engine's max_num_batched_tokens; a typo, not a plan
MAX_DIM = 1 << 20
MAX_PLAN_BYTES = 1 << 20  # a plan is a few KB of TOML; more is the wrong file
DEFAULT_TOKENS = (1, 16, 128, 1024)
# FlashInfer's own default backend for each GEMM (the `backend=` default of the function).
DEFAULT_BACKEND = {"mm_bf16": "cudnn", "bmm_fp8": "cublas", "mm_fp8": "trtllm_low_latency"}


class PlanError(Refused):
    """A plan FlashInfer cannot be asked to tune; exit 2 before any tuning starts."""


@dataclass(frozen=True)
class GemmOp:
    op: str  # one of GEMM_OPS
    n: int
    k: int
    tokens: tuple[int, ...]
    backends: tuple[str, ...]
    batch: int = 1  # bmm_fp8 only
    index: int = 0  # 1-based position in the plan, for messages
    # How the engine calls the op: FlashInfer keys entries by every input's shape and dtype, so a
    # cache hits only calls made the same way (vLLM's dynamic FP8 activation scale is shape (1,)).
    out_dtype: str = "bf16"  # mm_bf16, bmm_fp8
    a_scale_shape: tuple[int, ...] = ()  # bmm_fp8: () is a 0-d tensor
    b_scale_shape: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        batch = f" batch={self.batch}" if self.op == "bmm_fp8" else ""
        call = (f" out={self.out_dtype}" if self.out_dtype != "bf16" else "") + "".join(
            f" {name}={list(shape)}"
            for name, shape in (("a_scale", self.a_scale_shape), ("b_scale", self.b_scale_shape))
            if shape
        )
        return f"{self.op}{batch} n={self.n} k={self.k}{call}"

    @property
    def n_calls(self) -> int:
        return len(self.tokens) * len(self.backends)


@dataclass(frozen=True)
class MoeOp:
    dtype: str  # activations and weights: one of MOE_DTYPES
    hidden_size: int
    intermediate_size: int  # per expert, whole (the plan divides by tp_size)
    num_experts: int  # whole model (the plan divides by ep_size)
    top_k: int
    tokens: tuple[int, ...]
    finalize: tuple[FinalizeMode, ...] = ("fused",)
    tune_max_num_tokens: int = 0  # 0: the largest of `tokens`
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0
    index: int = 0
    op: str = field(default=MOE_OP, init=False)

    @property
    def label(self) -> str:
        return (
            f"{MOE_OP} {self.dtype} h={self.hidden_size} i={self.intermediate_size} "
            f"e={self.num_experts} top_k={self.top_k}"
            + (f" tp={self.tp_size}" if self.tp_size > 1 else "")
            + (f" ep={self.ep_size}" if self.ep_size > 1 else "")
        )

    @property
    def n_calls(self) -> int:
        return len(self.tokens)

    @property
    def max_tokens(self) -> int:
        return self.tune_max_num_tokens or max(self.tokens)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep_size

    @property
    def local_intermediate(self) -> int:
        return self.intermediate_size // self.tp_size


Op = GemmOp | MoeOp


@dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...]
    source: str = "<plan>"

    @property
    def modes(self) -> tuple[FinalizeMode, ...]:
        """The namespaces a warm of this plan fills: every MoE op's modes, else fused only."""
        wanted = {m for op in self.ops if isinstance(op, MoeOp) for m in op.finalize}
        return tuple(m for m in FINALIZE_MODES if m in wanted) or ("fused",)

    def for_mode(self, mode: FinalizeMode) -> tuple[Op, ...]:
        """What one namespace gets: every GEMM, and the MoE ops that list this mode."""
        return tuple(op for op in self.ops if not isinstance(op, MoeOp) or mode in op.finalize)


# --- parsing ------------------------------------------------------------------------------------


def loads(text: str, source: str = "<plan>") -> Plan:
    """Parse a TOML plan. Raises PlanError (exit 2) naming `source` and the op at fault."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"not valid TOML ({exc})", source) from None
    except RecursionError:
        raise PlanError("TOML nested too deeply to be a plan", source) from None
    except ValueError as exc:  # tomllib's int(): over sys.get_int_max_str_digits() digits
        raise PlanError(f"not a plan: {str(exc).split(':')[0]}", source) from None
    return from_mapping(data, source)


def from_mapping(data: Mapping[str, Any], source: str = "<plan>") -> Plan:
    unknown = sorted(set(data) - {"tokens", "ops"})
    if unknown:
        raise PlanError(f"unknown top-level key {unknown[0]!r} (expected tokens, [[ops]])", source)
    default_tokens: tuple[int, ...] = DEFAULT_TOKENS
    if "tokens" in data:
        default_tokens = _tokens(data["tokens"], "tokens", source)
    raw_ops = data.get("ops")
    if not isinstance(raw_ops, list) or not raw_ops:
        raise PlanError("no operations: add at least one [[ops]] table", source)
    ops = tuple(parse_op(raw, i, default_tokens, source) for i, raw in enumerate(raw_ops, 1))
    # FlashInfer keeps one MoE bucket list per process (MoERunner.refine_tuning_config is cached
    # per value and sets it only on a miss): MoE ops with other maxima would get the wrong list.
    maxima = sorted({op.max_tokens for op in ops if isinstance(op, MoeOp)})
    if len(maxima) > 1:
        raise PlanError(
            f"{MOE_OP} ops need one tune_max_num_tokens (their largest token count) per plan, "
            f"not {maxima}: FlashInfer keeps one MoE bucket list per process",
            source,
        )
    return Plan(ops, source)


def parse_op(raw: Any, index: int, default_tokens: tuple[int, ...], source: str) -> Op:
    if not isinstance(raw, dict):
        raise PlanError(f"op {index}: each [[ops]] entry must be a table", source)
    name = raw.get("op")
    where = f"op {index} ({name})" if name in KNOWN_OPS else f"op {index}"
    if name not in KNOWN_OPS:
        what = "has no `op = ...`" if name is None else f"unknown op {name!r}"
        raise PlanError(f"{where}: {what}; known: {', '.join(KNOWN_OPS)}", source)
    fields_ = _Fields(raw, where, source)
    allowed = _MOE_KEYS if name == MOE_OP else _GEMM_KEYS | _GEMM_EXTRA_KEYS.get(name, set())
    if extra := sorted(set(raw) - allowed):  # first, so a typo is named as itself
        fields_.fail(f"unknown key {extra[0]!r} (known: {', '.join(sorted(allowed - {'op'}))})")
    tokens = fields_.tokens(default_tokens)
    if name == MOE_OP:
        return _moe(fields_, tokens, index)
    return _gemm(fields_, name, tokens, index)


_GEMM_KEYS = {"op", "n", "k", "tokens", "backends"}
_GEMM_EXTRA_KEYS = {
    "mm_bf16": {"out_dtype"},
    "bmm_fp8": {"batch", "out_dtype", "a_scale_shape", "b_scale_shape"},
}
OUT_DTYPES = ("bf16", "fp16")  # what mm_bf16 and bmm_fp8 can write (mm_bf16: not every backend)
_MOE_KEYS = {
    "op",
    "dtype",
    "hidden_size",
    "intermediate_size",
    "num_experts",
    "top_k",
    "finalize",
    "tokens",
    "tune_max_num_tokens",
    "tp_size",
    "tp_rank",
    "ep_size",
    "ep_rank",
}


def _gemm(f: _Fields, name: str, tokens: tuple[int, ...], index: int) -> GemmOp:
    n, k = f.dim("n"), f.dim("k")
    batch = f.dim("batch", 1) if name == "bmm_fp8" else 1
    backends = f.strings("backends", (DEFAULT_BACKEND[name],))
    known = GEMM_BACKENDS[name]
    for b in backends:
        if b not in known:
            f.fail(f"unknown backend {b!r} for {name}; known: {', '.join(known)}")
    if name in ("bmm_fp8", "mm_fp8"):
        # cuBLASLt FP8 GEMMs need 16-byte aligned rows: k and n multiples of 16 (1 byte each).
        for dim, value in (("n", n), ("k", k)):
            if value % 16:
                f.fail(f"{dim} = {value}: FP8 GEMMs need a multiple of 16")
    if name == "mm_fp8" and k % 128:
        f.fail(f"k = {k}: the trtllm_low_latency FP8 GEMM needs a multiple of 128 (block size)")
    out_dtype = f.string("out_dtype", "bf16")
    if out_dtype not in OUT_DTYPES:
        f.fail(f"out_dtype {out_dtype!r}: expected {' or '.join(OUT_DTYPES)}")
    if name == "mm_bf16" and out_dtype != "bf16":
        for b in backends:
            if b in MM_BF16_BF16_OUT_ONLY:
                f.fail(f"the {b} backend writes bf16 only, not out_dtype {out_dtype!r}")
    scales = (f.scale_shape("a_scale_shape"), f.scale_shape("b_scale_shape"))
    return GemmOp(name, n, k, tokens, backends, batch, index, out_dtype, *scales)


def _moe(f: _Fields, tokens: tuple[int, ...], index: int) -> MoeOp:
    dtype = f.string("dtype", "bf16")
    if dtype not in MOE_DTYPES:
        f.fail(
            f"dtype {dtype!r}: fi-cache tunes cutlass_fused_moe for {', '.join(MOE_DTYPES)} "
            "(quantised MoE needs its scales; not supported yet)"
        )
    hidden, inter = f.dim("hidden_size"), f.dim("intermediate_size")
    experts, top_k = f.dim("num_experts"), f.dim("top_k")
    finalize = f.strings("finalize", ("fused",))
    for mode in finalize:
        if mode not in FINALIZE_MODES:
            f.fail(f"finalize {mode!r}: expected {' or '.join(FINALIZE_MODES)}")
    tp, ep = f.dim("tp_size", 1), f.dim("ep_size", 1)
    tp_rank, ep_rank = f.rank("tp_rank"), f.rank("ep_rank")
    tune_max = f.dim("tune_max_num_tokens", 0) if "tune_max_num_tokens" in f.raw else 0
    if top_k > experts:
        f.fail(f"top_k = {top_k} is more than num_experts = {experts}")
    if experts % ep:
        f.fail(f"num_experts = {experts} does not split over ep_size = {ep}")
    if inter % tp:
        f.fail(f"intermediate_size = {inter} does not split over tp_size = {tp}")
    if tp_rank >= tp or ep_rank >= ep:
        f.fail(f"tp_rank/ep_rank ({tp_rank}/{ep_rank}) must be below tp_size/ep_size ({tp}/{ep})")
    if tune_max and tune_max < max(tokens):
        f.fail(f"tune_max_num_tokens = {tune_max} is below the largest token count {max(tokens)}")
    modes = tuple(m for m in FINALIZE_MODES if m in finalize)
    return MoeOp(
        dtype,
        hidden,
        inter,
        experts,
        top_k,
        tokens,
        modes,
        tune_max,
        tp,
        tp_rank,
        ep,
        ep_rank,
        index,
    )


class _Fields:
    """Typed reads from one [[ops]] table; every problem names the op."""

    def __init__(self, raw: dict[str, Any], where: str, source: str) -> None:
        self.raw = raw
        self.where = where
        self.source = source

    def fail(self, message: str) -> None:
        raise PlanError(f"{self.where}: {message}", self.source)

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.raw:
            if default is None:
                self.fail(f"missing {key!r}")
            return default
        return self.raw[key]

    def dim(self, key: str, default: int | None = None) -> int:
        value = self._get(key, default)
        if not _is_int(value) or not 0 < value <= MAX_DIM:
            self.fail(f"{key} = {value!r}: expected a whole number from 1 to {MAX_DIM}")
        return int(value)

    def rank(self, key: str) -> int:
        value = self._get(key, 0)
        if not _is_int(value) or value < 0:
            self.fail(f"{key} = {value!r}: expected a whole number from 0")
        return int(value)

    def string(self, key: str, default: str) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            self.fail(f"{key} = {value!r}: expected a string")
        return str(value)

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(key, list(default))
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            self.fail(f"{key} = {value!r}: expected a non-empty list of strings")
        return tuple(dict.fromkeys(value))  # order kept, duplicates dropped

    def scale_shape(self, key: str) -> tuple[int, ...]:
        """A per-tensor FP8 scale: a 0-d tensor ([]) or one element ([1]), as engines pass it."""
        value = self._get(key, [])
        if not isinstance(value, list) or not all(map(_is_int, value)) or value not in ([], [1]):
            self.fail(f"{key} = {value!r}: expected [] (a 0-d tensor) or [1] (per-tensor scale)")
        return tuple(value)

    def tokens(self, default: tuple[int, ...]) -> tuple[int, ...]:
        if "tokens" not in self.raw:
            return default
        return _tokens(self._get("tokens", None), f"{self.where}: tokens", self.source)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tokens(value: Any, what: str, source: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise PlanError(f"{what}: expected a non-empty list of token counts", source)
    for t in value:
        if not _is_int(t) or not 0 < t <= MAX_TOKENS:
            raise PlanError(f"{what}: {t!r} is not a token count from 1 to {MAX_TOKENS}", source)
    return tuple(sorted(set(value)))


# --- writing ------------------------------------------------------------------------------------


def dumps(plan: Plan, header: Iterable[str] = ()) -> str:
    """TOML text that `loads` reads back into the same plan (comments from `header` on top)."""
    # Every header line is a comment, however many lines one entry has (it may quote a path).
    lines = [f"# {line}".rstrip() for h in header for line in (h.splitlines() or [""])]
    for op in plan.ops:
        lines += ["", "[[ops]]", f"op = {_toml(op.op)}"]
        for f in fields(op):
            if f.name in ("op", "index"):
                continue
            value = getattr(op, f.name)
            if value == f.default and f.name not in ("finalize",):
                continue  # defaults stay implicit, so the file says only what matters
            lines.append(f"{f.name} = {_toml(value)}")
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


# --- the job a tuning child runs (JSON over a pipe) ---------------------------------------------


def op_to_json(op: Op) -> dict[str, Any]:
    return {f.name: getattr(op, f.name) for f in fields(op)}


def op_from_json(data: Mapping[str, Any]) -> Op:
    """Inverse of op_to_json (the child trusts its parent; shapes were checked there)."""
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "op"
    }
    if data.get("op") == MOE_OP:
        return MoeOp(**values)
    return GemmOp(op=str(data["op"]), **values)
