"""fi_cache/engines/flashinfer/ops.py builds each op's call the way the plan describes it:
FlashInfer keys an entry by every input's shape and dtype, so a call made differently from the
engine's misses.

FlashInfer's GEMMs need CUDA, so the calls are built (on CPU, in a child process with a real
FlashInfer on its path) and inspected, not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FI_VERSIONS, ROOT, flashinfer_dir

_INSPECT = """
import json, sys, torch
from fi_cache.engines.flashinfer import ops, plan
p = plan.loads(sys.argv[1])
out = []
for op in p.ops:
    for call in ops.ADAPTERS[op.op].calls(op, torch.device("cpu"), "fused"):
        args, kw = call.run.args, call.run.keywords
        out.append({
            "fn": call.run.func.__name__, "tokens": call.tokens, "backend": kw["backend"],
            "shapes": [list(a.shape) for a in args if isinstance(a, torch.Tensor)],
            "dtypes": [str(a) for a in (*args, kw.get("out_dtype")) if isinstance(a, torch.dtype)],
        })
print(json.dumps(out))
"""


def _calls(version: str, text: str) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(flashinfer_dir(version)), str(ROOT)])}
    p = subprocess.run(
        [sys.executable, "-c", _INSPECT, text], env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)  # type: ignore[no-any-return]


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_bmm_fp8_calls_carry_the_plans_scales_and_output_dtype(version: str) -> None:
    plain, vllm_style = _calls(
        version,
        "tokens = [16]\n"
        '[[ops]]\nop = "bmm_fp8"\nn = 64\nk = 128\n'
        '[[ops]]\nop = "bmm_fp8"\nn = 64\nk = 128\nout_dtype = "fp16"\na_scale_shape = [1]\n',
    )
    # A (batch, tokens, k), B (batch, k, n), then the scales; the output dtype is positional.
    assert plain["fn"] == vllm_style["fn"] == "bmm_fp8"
    assert plain["shapes"] == [[1, 16, 128], [1, 128, 64], [], []]
    assert plain["dtypes"] == ["torch.bfloat16"]
    assert vllm_style["shapes"] == [[1, 16, 128], [1, 128, 64], [1], []]
    assert vllm_style["dtypes"] == ["torch.float16"]


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_mm_bf16_calls_carry_the_plans_output_dtype(version: str) -> None:
    calls = _calls(
        version,
        '[[ops]]\nop = "mm_bf16"\nn = 64\nk = 128\ntokens = [1, 8]\nout_dtype = "fp16"\n'
        'backends = ["cublaslt", "cudnn"]\n',
    )
    assert [(c["tokens"], c["backend"]) for c in calls] == [
        (1, "cublaslt"),
        (1, "cudnn"),
        (8, "cublaslt"),
        (8, "cudnn"),
    ]
    assert {json.dumps(c["dtypes"]) for c in calls} == {'["torch.float16"]'}
    assert calls[0]["shapes"] == [[1, 128], [128, 64]]
