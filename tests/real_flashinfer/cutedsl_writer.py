"""Write an SGLang rank file of CuTe-DSL NVFP4 MoE entries the way FlashInfer 0.6.18 keys them,
tuned in one finalize mode, with FlashInfer's real AutoTuner (choose_one, save_configs):

    PYTHONPATH=.cache/flashinfer-0.6.18 python -m tests.real_flashinfer.cutedsl_writer FILE MODE

FlashInfer's CuTe-DSL kernels need CUDA and nvidia-cutlass-dsl even to import, so the runner is a
CPU STAND-IN with the real one's name and cache-key extras (CuteDslFusedMoENvfp4Runner,
flashinfer/fused_moe/cute_dsl/tuner.py 0.6.18:410, extras :624-633: activation, SwiGLU alpha /
beta / limit, SiTU beta / linear beta; it stores use_fused_finalize but keys without it) under
the op name the wrapper uses (cute_dsl/fused_moe.py 0.6.18:854 `CuteDslMoEWrapper::run::{act}`).
What lands in the file (key layout, `_metadata`, ordering) is FlashInfer's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import flashinfer
import torch
from flashinfer.autotuner import TunableRunner
from flashinfer.autotuner import autotuner as fi_at

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines" / "flashinfer"))
import cpu_tune_child  # CPU timing and the H200's metadata


class CuteDslFusedMoENvfp4Runner(TunableRunner):  # CPU STAND-IN: the real one's name and extras
    def __init__(self, use_fused_finalize: bool) -> None:
        self.use_fused_finalize = use_fused_finalize  # kept, as 0.6.18 does, but never keyed
        self.activation_type = 0  # Swiglu
        self.swiglu_alpha = self.swiglu_beta = self.swiglu_limit = None
        self.situ_beta = self.situ_linear_beta = None

    def get_cache_key_extras(self, inputs: list[torch.Tensor]) -> tuple[Any, ...]:
        return (
            int(self.activation_type),
            self.swiglu_alpha,
            self.swiglu_beta,
            self.swiglu_limit,
            self.situ_beta,
            self.situ_linear_beta,
        )

    def get_valid_tactics(self, inputs: list[torch.Tensor], profile: Any) -> list[int]:
        return [0, 1, 2, 3] if self.use_fused_finalize else [0, 1]

    def forward(self, inputs: list[torch.Tensor], tactic: int = -1, **kwargs: Any) -> Any:
        a, b = inputs
        return a @ b


def main() -> int:
    path, mode = sys.argv[1], sys.argv[2]
    cpu_tune_child._install()
    runner = CuteDslFusedMoENvfp4Runner(mode == "fused")
    b = torch.randn(64, 64)
    with flashinfer.autotune(True, cache=path):
        for m in (1, 16, 128):
            fi_at.AutoTuner.get().choose_one(
                "CuteDslMoEWrapper::run::Swiglu",
                [runner],
                cpu_tune_child.CPU_GEMM_CONFIG,
                [torch.randn(m, 64), b],
            )
    print(flashinfer.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
