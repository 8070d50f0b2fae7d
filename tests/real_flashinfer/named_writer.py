"""Write a v1 file with FlashInfer's real AutoTuner (choose_one, `autotune(True, cache=FILE)`'s
save) under a given op and runner name, for the files fi-cache tells apart by name or op:

    PYTHONPATH=.cache/flashinfer-0.6.18 python -m tests.real_flashinfer.named_writer FILE OP RUNNER

FlashInfer's sparse-MLA decode kernels need an SM120 GPU, so the runner is a CPU STAND-IN (three
ways to multiply) with the real one's class name (`_SparseMlaDecodeDsv3Runner`, mla/
_sparse_mla_sm120.py 0.6.18:755) tuned under the op name FlashInfer gives it
(`sparse_mla_sm120_decode_dsv3_2`, :1191), for token counts 1, 16 and 128. What lands in the file
(key layout, buckets, `_metadata` of the real H200 file, ordering) is FlashInfer's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import flashinfer
import torch
from flashinfer.autotuner import autotuner as fi_at

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines" / "flashinfer"))
import cpu_tune_child  # CPU timing and the H200's metadata


def main() -> int:
    path, op, runner_name = sys.argv[1:4]
    cpu_tune_child._install()
    runner = type(runner_name, (cpu_tune_child.CpuMatmulRunner,), {})()
    b = torch.randn(64, 64)
    with flashinfer.autotune(True, cache=path):
        for m in (1, 16, 128):
            fi_at.AutoTuner.get().choose_one(
                op, [runner], cpu_tune_child.CPU_GEMM_CONFIG, [torch.randn(m, 64), b]
            )
    print(flashinfer.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
