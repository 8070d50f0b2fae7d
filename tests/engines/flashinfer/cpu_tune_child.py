#!/usr/bin/env python3
"""A CPU stand-in for `python -m fi_cache.engines.flashinfer` (the tuning child), for tests
without a GPU.

Run with a real FlashInfer on PYTHONPATH (scripts/test.sh installs 0.6.17 and 0.6.18 beside a CPU
torch). Everything that decides what lands in the cache file is FlashInfer's own code and fi-cache's
driver: `fi_cache.engines.flashinfer.driver.run`, `flashinfer.autotune(True, cache=FILE)`,
`AutoTuner.choose_one` (buckets, profiles, keys), `save_configs` (layout, `_generation`), and for
`cutlass_fused_moe` fi-cache's real adapter (fi_cache/engines/flashinfer/ops.py) calling
FlashInfer's public `cutlass_fused_moe` with its real `MoERunner` (tactic lists, cache-key extras).

What stands in for the GPU (each marked CPU STAND-IN below):
1. GEMM ops: one CPU runner (`CpuMatmulRunner`, three ways to multiply) tuned through
   `AutoTuner.choose_one` under op `fi_cache_test::cpu_gemm`; FlashInfer's GEMMs need CUDA. A job
   (sent directly, bypassing the plan parser) with backend "no-cudnn" raises on every call, as
   FlashInfer's cuDNN GEMM did on a machine without cuDNN's Python frontend.
2. `AutoTuner._profile_single_kernel` (CUDA events): CPU wall time of the runner for GEMMs; for the
   MoE, a deterministic time per (GEMM, bucket, tactic, finalize mode), as tests/fixtures does.
3. The compiled CUTLASS MoE module: a fake whose runner reports G1 / G2 tactics (G2 depends on
   use_fused_finalize) and records every `init(...)` call to $FI_CACHE_TEST_RECORD, so a test can
   compare the call fi-cache makes for tactic counts with the one FlashInfer's MoERunner makes.
4. The device: jobs run on "cpu" and report an H200 (SM90); `get_compute_capability` answers
   (9, 0), `torch.cuda.device` is a no-op, and `_collect_metadata` returns the `_metadata` of the
   real H200 file tests/fixtures/h200/flashinfer-<version>-gemm.json.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import flashinfer
import torch
from flashinfer.autotuner import DynamicTensorSpec, TunableRunner, TuningConfig
from flashinfer.autotuner import autotuner as fi_at
from flashinfer.fused_moe import core as fi_moe_core
from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets, make_hybrid_bucket_mapper
from flashinfer.jit import fused_moe as fi_jit_moe

from fi_cache.engines.flashinfer import __main__ as child_main
from fi_cache.engines.flashinfer import driver, ops
from fi_cache.engines.flashinfer.plan import GemmOp

G1, G2_FUSED, G2_UNFUSED = 45, 81, 36  # illustrative counts, as in tests/fixtures
H200 = Path(__file__).resolve().parents[2] / "fixtures" / "h200"  # tests/fixtures/h200
RECORD = os.environ.get("FI_CACHE_TEST_RECORD")


# ---- CPU STAND-IN 1: a CPU GEMM runner tuned by FlashInfer's AutoTuner ---------------------
class CpuMatmulRunner(TunableRunner):
    def get_valid_tactics(self, inputs: list[torch.Tensor], profile: Any) -> list[int]:
        return [0, 1, 2]

    def forward(self, inputs: list[torch.Tensor], tactic: int = -1, **kwargs: Any) -> Any:
        a, b = inputs
        if tactic == 1:
            return (b.t() @ a.t()).t()
        if tactic == 2:
            return torch.cat([a[i : i + 8] @ b for i in range(0, a.shape[0], 8)])
        return a @ b


CPU_GEMM_CONFIG = TuningConfig(
    dynamic_tensor_specs=(
        DynamicTensorSpec(
            (0,), (0,), get_hybrid_num_tokens_buckets, make_hybrid_bucket_mapper(8192)
        ),
    )
)


class CpuGemm:
    """Stands in for mm_bf16/bmm_fp8/mm_fp8: same plan fields, a CPU runner."""

    def problems(self, op: GemmOp, cc: int) -> list[str]:
        return []

    def bytes_needed(self, op: GemmOp) -> int:
        return 0

    def tactic_counts(self, op: GemmOp, cc: int) -> None:
        return None

    def calls(self, op: GemmOp, device: Any, mode: str) -> Any:
        b = torch.randn(op.k, op.n)
        runner = CpuMatmulRunner()
        for m in op.tokens:
            a = torch.randn(m, op.k)
            for backend in op.backends:

                def run(a: torch.Tensor = a, backend: str = backend) -> Any:
                    if backend == "no-cudnn":  # what the H200 without cuDNN's frontend raised
                        raise RuntimeError("cuDNN is not available. Please install cuDNN")
                    tuner = fi_at.AutoTuner.get()
                    chosen, tactic = tuner.choose_one(
                        "fi_cache_test::cpu_gemm", [runner], CPU_GEMM_CONFIG, [a, b]
                    )
                    return chosen(inputs=[a, b], tactic=tactic)

                yield ops.Call(op, m, backend, run)


# ---- CPU STAND-IN 2: timing without CUDA events ----------------------------------------------
def _profile(
    self: Any, runner: Any, inputs: Any, tactic: Any, tuning_config: Any, **kw: Any
) -> float:
    gemm_idx = kw.get("gemm_idx")
    if gemm_idx is None:  # the CPU GEMM runner: real CPU time
        t0 = time.perf_counter()
        runner(inputs, tactic=tactic)
        return (time.perf_counter() - t0) * 1000
    bucket = int(inputs[0].shape[0])
    mode = "any" if gemm_idx == 1 else ("fused" if runner.use_fused_finalize else "unfused")
    h = hashlib.sha256(f"{gemm_idx}|{bucket}|{tactic}|{mode}".encode()).digest()
    return 0.010 + int.from_bytes(h[:4], "big") / 2**32 * 0.010


# ---- CPU STAND-IN 3: the compiled CUTLASS MoE module -----------------------------------------
class FakeRunner:
    def __init__(self, fused: bool) -> None:
        self.use_fused_finalize = fused

    def get_gemm1_tactic_count(self) -> int:
        return G1

    def get_gemm2_tactic_count(self) -> int:
        return G2_FUSED if self.use_fused_finalize else G2_UNFUSED

    def get_tactic_num(self) -> int:
        return G1 + self.get_gemm2_tactic_count()

    def get_tactic_occupancy(self, tactic: int) -> int:
        return 1

    def run_gemm_profile(self, *args: Any, **kwargs: Any) -> None:
        return None

    def run_moe(self, *args: Any, **kwargs: Any) -> None:
        return None


class FakeModule:
    def init(self, x_dtype: Any, weight_dtype: Any, output_dtype: Any, *flags: Any) -> FakeRunner:
        caller_file = sys._getframe(1).f_code.co_filename  # who called init: fi-cache or FlashInfer
        caller = "fi-cache" if "fi_cache" in caller_file else "flashinfer"
        if RECORD:
            with open(RECORD, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "caller": caller,
                            "args": [
                                str(x_dtype),
                                str(weight_dtype),
                                str(output_dtype),
                                *[bool(v) for v in flags],
                            ],
                        }
                    )
                    + "\n"
                )
        # FlashInfer's positional layout puts use_fused_finalize fifth among the flags.
        return FakeRunner(fused=bool(flags[4]))

    def set_deepgemm_jit_include_dirs(self, dirs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"fake CUTLASS MoE module: {name} is not available on CPU")

        return unavailable


class FakeSpec:
    module = FakeModule()

    def build_and_load(self) -> FakeModule:
        return self.module


# ---- CPU STAND-IN 4: the device ------------------------------------------------------------
def _install() -> None:
    fake = FakeSpec()
    fi_moe_core.gen_cutlass_fused_moe_sm90_module = lambda *a, **k: fake
    fi_jit_moe.gen_cutlass_fused_moe_sm90_module = lambda *a, **k: fake
    fi_moe_core.get_compute_capability = lambda device: (9, 0)
    fi_moe_core.device_support_pdl = lambda device: True  # what SM90 answers
    torch.cuda.device = lambda device: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.is_current_stream_capturing = lambda: False  # type: ignore[assignment]
    fi_at.AutoTuner._profile_single_kernel = _profile
    meta = json.loads((H200 / f"flashinfer-{flashinfer.__version__}-gemm.json").read_text())
    fi_at._collect_metadata = lambda: dict(meta["_metadata"])
    driver._device = lambda torch, device: (90, "NVIDIA H200 (CPU stand-in)")
    gemm = CpuGemm()
    for name in ("mm_bf16", "bmm_fp8", "mm_fp8"):
        ops.ADAPTERS[name] = gemm
    original = driver.Job.from_json
    driver.Job.from_json = classmethod(  # type: ignore[method-assign, assignment]
        lambda cls, data: replace(original(data), device="cpu")
    )
    child_main.Job = driver.Job  # type: ignore[attr-defined]
    if os.environ.get("FI_CACHE_TEST_HANG_OP"):
        _hang_before(os.environ["FI_CACHE_TEST_HANG_OP"], Path(os.environ["FI_CACHE_TEST_MARK"]))


def _hang_before(op_name: str, mark: Path) -> None:
    """A tune that hangs as it reaches `op_name` (what a stopped warm looks like to its
    parent): the ops before it are tuned in FlashInfer's memory, nothing is saved yet."""
    calls = driver._calls

    def hanging(job: Any, adapters: Any, device: Any) -> Any:
        for call in calls(job, adapters, device):
            if call.op.op == op_name:
                mark.write_text("hang")
                time.sleep(300)
            yield call

    driver._calls = hanging


if __name__ == "__main__":
    _install()
    sys.exit(child_main.main())
