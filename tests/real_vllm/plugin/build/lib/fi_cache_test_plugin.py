"""Test-only vLLM general plugin (installed into the test suite's vLLM venv, never shipped).

With FI_CACHE_TEST_HASH_OUT set, each worker appends one JSON line: the FlashInfer autotune cache
hash vLLM's own `flashinfer_autotune_cache_hash` computes from the config the worker ended up
with, which is what fi-cache's prediction must match. The CPU worker never runs kernel_warmup
(no FlashInfer), so its warm-up step is where the hash is read.
"""

from __future__ import annotations

import json
import os
import types


def register() -> None:
    out = os.environ.get("FI_CACHE_TEST_HASH_OUT")
    if not out:
        return
    from vllm.v1.worker import cpu_worker

    cls = cpu_worker.CPUWorker
    if getattr(cls, "_fi_cache_wrapped", False):
        return
    original = cls.compile_or_warm_up_model

    def compile_or_warm_up_model(self):  # type: ignore[no-untyped-def]
        from vllm.model_executor.warmup.flashinfer_autotune_cache import (
            flashinfer_autotune_cache_hash,
        )

        runner = types.SimpleNamespace(vllm_config=self.vllm_config)
        with open(out, "a") as f:
            f.write(json.dumps({"hash": flashinfer_autotune_cache_hash(runner)}) + "\n")
        return original(self)

    cls.compile_or_warm_up_model = compile_or_warm_up_model
    cls._fi_cache_wrapped = True
