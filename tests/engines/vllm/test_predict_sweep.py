"""vLLM's prediction child reports its tuning sweep's pass token counts from vLLM's own
`_flashinfer_autotune_token_counts` over the model it builds on the meta device (what seeding
must cover on 0.33+: model/sweep.py). Real vLLM 0.32 CPU build (scripts/test.sh); the
0.33/0.34 code is run from the wheels in tests/model/test_sweep.py."""

from __future__ import annotations

import os
from pathlib import Path

from fi_cache.engines.vllm.predict import predict
from tests.conftest import TINY_FAST, VLLM_PYTHON, needs_vllm


@needs_vllm
def test_the_child_reports_vllms_own_sweep_token_counts(vllm_model: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "ns" / "vllm"),
    }
    argv = ["--model", str(vllm_model), *TINY_FAST, "--max-num-batched-tokens", "3000"]
    where = predict(VLLM_PYTHON, "0.32.0", argv, env, None)
    assert (where.sweep_tokens, where.sweep_unknown) == ((3000,), "")
