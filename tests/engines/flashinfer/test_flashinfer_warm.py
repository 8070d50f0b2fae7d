"""The pure parts of fi_cache/engines/flashinfer/warm.py: what is refused before a tuning child
starts, what makes two warms "the same", which MoE tactic counts a namespace's manifest records."""

from __future__ import annotations

from typing import Any

import pytest

from fi_cache.engines.flashinfer import plan as plans
from fi_cache.engines.flashinfer.warm import _counts, plan_key, static_problems
from fi_cache.environment import Environment, Gpu, VllmInfo
from fi_cache.model.fingerprint import Fingerprint

GOOD = """
tokens = [1, 16]

[[ops]]
op = "mm_bf16"
n = 64
k = 64
backends = ["cudnn", "cublaslt"]

[[ops]]
op = "bmm_fp8"
n = 64
k = 64

[[ops]]
op = "cutlass_fused_moe"
hidden_size = 256
intermediate_size = 128
num_experts = 8
top_k = 2
finalize = ["fused", "unfused"]
"""
H200 = Gpu(0, "NVIDIA H200", "9.0", "GPU-1")
A100 = Gpu(0, "NVIDIA A100-SXM4-80GB", "8.0", "GPU-2")


def _env(*gpus: Gpu) -> Environment:
    return Environment(Fingerprint(), gpus, VllmInfo(None, None, None), None)


def _op(text: str) -> plans.Plan:
    return plans.loads(f"[[ops]]\n{text}\n", "p.toml")


def test_no_gpu_listed_leaves_the_reason_to_the_child() -> None:
    assert static_problems(plans.loads(GOOD), _env()) == []
    cutlass = _op('op = "mm_bf16"\nn = 64\nk = 64\nbackends = ["cutlass"]')
    assert static_problems(cutlass, _env()) == []


def test_a_plan_the_h200_runs_has_no_problem() -> None:
    assert static_problems(plans.loads(GOOD), _env(H200)) == []


@pytest.mark.parametrize(
    "gpu, op, words",
    [
        (
            H200,
            'op = "mm_bf16"\nn = 64\nk = 64\nbackends = ["cutlass"]',
            "the cutlass backend does not run on NVIDIA H200 (SM90) (runs on SM100, SM103, SM107)",
        ),
        (
            H200,
            'op = "mm_fp8"\nn = 128\nk = 128',
            "the trtllm_low_latency backend does not run on NVIDIA H200 (SM90)",
        ),
        # FP8 needs SM89 or newer.
        (
            A100,
            'op = "bmm_fp8"\nn = 64\nk = 64\nbackends = ["cublas"]',
            "the cublas backend does not run on NVIDIA A100-SXM4-80GB (SM80)",
        ),
        (
            A100,
            'op = "cutlass_fused_moe"\nhidden_size = 256\nintermediate_size = 128\n'
            "num_experts = 8\ntop_k = 2",
            "FlashInfer's CUTLASS MoE does not run on NVIDIA A100-SXM4-80GB (SM80)",
        ),
    ],
    ids=["mm-bf16-cutlass-sm90", "mm-fp8-sm90", "bmm-fp8-sm80", "moe-sm80"],
)
def test_what_the_listed_gpu_cannot_run(gpu: Gpu, op: str, words: str) -> None:
    [problem] = static_problems(_op(op), _env(gpu))
    assert problem.startswith("op 1 (") and words in problem


def test_every_problem_is_listed_with_its_op() -> None:
    plan = plans.loads(
        GOOD + '\n[[ops]]\nop = "mm_bf16"\nn = 64\nk = 64\nbackends = ["cutlass", "tgv"]\n'
    )
    problems = static_problems(plan, _env(A100))
    assert [p.split(":")[0] for p in problems] == [
        "op 2 (bmm_fp8)",
        "op 3 (cutlass_fused_moe)",
        "op 4 (mm_bf16)",
        "op 4 (mm_bf16)",
    ]


def test_the_first_listed_gpu_decides() -> None:
    """FlashInfer tunes on the current (first visible) device."""
    moe = _op(
        'op = "cutlass_fused_moe"\nhidden_size = 256\nintermediate_size = 128\n'
        "num_experts = 8\ntop_k = 2"
    )
    assert static_problems(moe, _env(H200, A100)) == []
    assert len(static_problems(moe, _env(A100, H200))) == 1


def test_plan_key_differs_by_mode_and_by_text() -> None:
    key = plan_key(GOOD, "fused")
    assert key.startswith("flashinfer:") and key == plan_key(GOOD, "fused")
    assert plan_key(GOOD, "unfused") != key
    assert plan_key(GOOD.replace("n = 64", "n = 128", 1), "fused") != key
    assert plan_key(GOOD + "\n", "fused") != key  # the text, as the user wrote it


def _event(g1: int, fused: int, unfused: int, index: int = 1) -> dict[str, Any]:
    return {
        "event": "counts",
        "index": index,
        "op": "moe",
        "gemm1": g1,
        "gemm2": {"fused": fused, "unfused": unfused},
    }


def test_counts_of_agreeing_moe_ops_are_recorded() -> None:
    events = [
        {"event": "call", "i": 1},
        _event(45, 81, 36, index=1),
        _event(45, 81, 36, index=2),
        {"event": "done"},
    ]
    assert _counts(events) == {"gemm1": 45, "gemm2": {"fused": 81, "unfused": 36}}


def test_counts_of_disagreeing_moe_ops_are_not() -> None:
    """Two MoE dtypes with different tactic lists: no single count fits the namespace."""
    assert _counts([_event(45, 81, 36), _event(40, 81, 36, index=2)]) is None
    assert _counts([_event(45, 81, 36), _event(45, 80, 36, index=2)]) is None


def test_no_moe_op_no_counts() -> None:
    assert _counts([{"event": "call"}, {"event": "called"}, {"event": "done"}]) is None
    assert _counts([]) is None
