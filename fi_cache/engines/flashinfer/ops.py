"""The FlashInfer operations a plan can tune: their inputs, their call, FlashInfer's own checks.

Imported only by the tuning child (fi_cache/engines/flashinfer/driver.py): this is where torch and
FlashInfer come in. Each op builds inputs the way a caller at run time would (FlashInfer's defaults:
no bias, PDL off, output allocated by FlashInfer), so the keys FlashInfer writes are the keys it
looks up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from fi_cache.engines.flashinfer.plan import GemmOp, MoeOp, Op
from fi_cache.versions import GEMM_BACKEND_CCS, MOE_ARCH_MODULES, moe_init_flags

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # plan names (MoE dtype, out_dtype)
_FP8 = torch.float8_e4m3fn
_SCALE = 0.05  # small weights keep bf16 sums finite; tuning times do not depend on values


@dataclass(frozen=True)
class Call:
    """One call of a FlashInfer op at one token count (under autotune(True) it tunes)."""

    op: Op
    tokens: int
    backend: str
    run: Callable[[], object]

    @property
    def label(self) -> str:
        return f"{self.op.label} [{self.backend}]"


class Adapter(Protocol):
    def problems(self, op: Any, cc: int) -> list[str]:
        """Why this GPU (compute capability `cc`, e.g. 90) cannot run `op`; [] when it can."""

    def bytes_needed(self, op: Any) -> int:
        """Device memory the inputs take at the largest token count."""

    def calls(self, op: Any, device: torch.device, mode: str) -> Iterator[Call]:
        """The calls to make, inputs allocated lazily (one op's tensors alive at a time)."""

    def tactic_counts(self, op: Any, cc: int) -> dict[str, Any] | None:
        """GEMM tactic counts FlashInfer's compiled runner reports (MoE), else None."""


def _randn(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return (torch.randn(*shape, device=device) * _SCALE).to(dtype)


def _flashinfer_problems(fn: Any, op: GemmOp, cc: int) -> list[str]:
    """FlashInfer's own `is_backend_supported`, else the table in fi_cache.versions."""
    out = []
    for backend in op.backends:
        if backend == "auto":
            continue  # FlashInfer ranks whatever runs here
        check = getattr(fn, "is_backend_supported", None)
        try:
            ok = bool(check(backend, cc)) if check else cc in GEMM_BACKEND_CCS[op.op, backend]
        except (KeyError, ValueError, TypeError):
            ok = False  # this FlashInfer does not know the backend at all
        if not ok:
            out.append(f"{op.label}: FlashInfer's {backend} backend does not run on SM{cc}")
    return out


class _Gemm:
    name: str
    in_bytes = 2  # per element of a and b

    def function(self) -> Any:
        import flashinfer.gemm

        return getattr(flashinfer.gemm, self.name)

    def problems(self, op: GemmOp, cc: int) -> list[str]:
        return _flashinfer_problems(self.function(), op, cc)

    def bytes_needed(self, op: GemmOp) -> int:
        m = max(op.tokens)
        return op.batch * (m * op.k * self.in_bytes + op.k * op.n * self.in_bytes + m * op.n * 2)

    def tactic_counts(self, op: GemmOp, cc: int) -> dict[str, Any] | None:
        return None

    def calls(self, op: GemmOp, device: torch.device, mode: str) -> Iterator[Call]:
        raise NotImplementedError


class MmBf16(_Gemm):
    name = "mm_bf16"

    def calls(self, op: GemmOp, device: torch.device, mode: str) -> Iterator[Call]:
        fn = self.function()
        # b is (k, n) column-major, as the docstring asks: a transposed (n, k) tensor.
        b = _randn(op.n, op.k, dtype=torch.bfloat16, device=device).t()
        for m in op.tokens:
            a = _randn(m, op.k, dtype=torch.bfloat16, device=device)
            for backend in op.backends:
                call = partial(fn, a, b, out_dtype=_DTYPES[op.out_dtype], backend=backend)
                yield Call(op, m, backend, call)


class BmmFp8(_Gemm):
    name = "bmm_fp8"
    in_bytes = 1

    def calls(self, op: GemmOp, device: torch.device, mode: str) -> Iterator[Call]:
        fn = self.function()
        b = _randn(op.batch, op.n, op.k, dtype=_FP8, device=device).transpose(-2, -1)
        # Scale shapes and the output dtype are part of FlashInfer's key: the plan's, not ours.
        a_scale, b_scale = (
            torch.ones(shape, dtype=torch.float32, device=device)
            for shape in (op.a_scale_shape, op.b_scale_shape)
        )
        for m in op.tokens:
            a = _randn(op.batch, m, op.k, dtype=_FP8, device=device)
            for backend in op.backends:
                call = partial(fn, a, b, a_scale, b_scale, _DTYPES[op.out_dtype], backend=backend)
                yield Call(op, m, backend, call)


class MmFp8(_Gemm):
    name = "mm_fp8"
    in_bytes = 1

    def function(self) -> Any:
        import flashinfer

        return flashinfer.mm_fp8

    def calls(self, op: GemmOp, device: torch.device, mode: str) -> Iterator[Call]:
        import flashinfer

        fn = self.function()
        raw = _randn(op.n, op.k, dtype=_FP8, device=device)
        b = flashinfer.prepare_low_latency_gemm_weights(raw, {})
        alpha = torch.tensor(1.0, dtype=torch.float32, device=device)
        for m in op.tokens:
            a = _randn(m, op.k, dtype=_FP8, device=device)
            for backend in op.backends:
                yield Call(op, m, backend, partial(fn, a, b, alpha, backend=backend))


class CutlassFusedMoe:
    """flashinfer.fused_moe.cutlass_fused_moe: GEMM1 and GEMM2 tuned per finalize mode."""

    def problems(self, op: MoeOp, cc: int) -> list[str]:
        if cc not in MOE_ARCH_MODULES:
            archs = ", ".join(f"SM{a}" for a in sorted(MOE_ARCH_MODULES))
            return [f"{op.label}: FlashInfer's CUTLASS MoE has no module for SM{cc} ({archs})"]
        return []

    def bytes_needed(self, op: MoeOp) -> int:
        size = 2  # bf16 / fp16
        weights = op.local_experts * 3 * op.local_intermediate * op.hidden_size * size
        acts = op.max_tokens * (op.hidden_size * size * 2 + op.top_k * 8)
        return weights + acts

    def calls(self, op: MoeOp, device: torch.device, mode: str) -> Iterator[Call]:
        from flashinfer.fused_moe import cutlass_fused_moe

        dtype = _DTYPES[op.dtype]
        # SwiGLU experts: fc1 is [E, 2 * I, H] (gate and up), fc2 is [E, H, I], per rank.
        e, i, h = op.local_experts, op.local_intermediate, op.hidden_size
        fc1 = _randn(e, 2 * i, h, dtype=dtype, device=device)
        fc2 = _randn(e, h, i, dtype=dtype, device=device)
        kwargs: dict[str, Any] = {
            "tp_size": op.tp_size,
            "tp_rank": op.tp_rank,
            "ep_size": op.ep_size,
            "ep_rank": op.ep_rank,
            "tune_max_num_tokens": op.max_tokens,
            "use_fused_finalize": mode == "fused",
        }
        for m in op.tokens:
            x = _randn(m, h, dtype=dtype, device=device)
            logits = torch.randn(m, op.num_experts, device=device)
            scales, experts = torch.topk(torch.softmax(logits, dim=-1), op.top_k, dim=-1)
            args: list[Any] = [x, experts.to(torch.int32), scales.float(), fc1, fc2, dtype, []]
            run = partial(cutlass_fused_moe, *args, **kwargs)
            yield Call(op, m, f"cutlass, {mode} finalize", run)

    def tactic_counts(self, op: MoeOp, cc: int) -> dict[str, Any] | None:
        """g1 and g2 for both modes, from the compiled runner FlashInfer itself built."""
        import flashinfer
        from flashinfer.jit import fused_moe as jit_moe

        module = getattr(jit_moe, MOE_ARCH_MODULES[cc])(use_fast_build=False).build_and_load()
        dtype = _DTYPES[op.dtype]
        flags = moe_init_flags(flashinfer.__version__)
        counts: dict[str, Any] = {"gemm2": {}}
        for mode in ("fused", "unfused"):
            values = [name == "use_fused_finalize" and mode == "fused" for name in flags]
            runner = module.init(dtype, dtype, dtype, *values)
            counts["gemm1"] = int(runner.get_gemm1_tactic_count())
            counts["gemm2"][mode] = int(runner.get_gemm2_tactic_count())
        return counts


ADAPTERS: dict[str, Adapter] = {
    "mm_bf16": MmBf16(),
    "bmm_fp8": BmmFp8(),
    "mm_fp8": MmFp8(),
    "cutlass_fused_moe": CutlassFusedMoe(),
}


def flashinfer_version() -> str:
    """Import FlashInfer (raises ImportError with its reason) and say which one it is."""
    fi = importlib.import_module("flashinfer")
    return str(getattr(fi, "__version__", "unknown"))
