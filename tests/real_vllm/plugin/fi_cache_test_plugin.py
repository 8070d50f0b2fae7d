"""Test-only vLLM general plugin: in the worker, record the FlashInfer autotune cache hash vLLM computes."""
import json, os, types


def register():
    out = os.environ.get("FI_CACHE_TEST_HASH_OUT")
    if not out:
        return
    try:
        from vllm.v1.worker import cpu_worker
    except Exception:
        return
    cls = cpu_worker.CPUWorker
    if getattr(cls, "_fi_cache_wrapped", False):
        return
    orig = cls.compile_or_warm_up_model

    def wrapped(self):
        from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_cache_hash
        h = flashinfer_autotune_cache_hash(types.SimpleNamespace(vllm_config=self.vllm_config))
        with open(out, "a") as f:
            import fi_cache_parts
            f.write(json.dumps({"hash": h, "pid": os.getpid(), "parts": fi_cache_parts.parts(self.vllm_config)}) + "\n")
        return orig(self)

    cls.compile_or_warm_up_model = wrapped
    cls._fi_cache_wrapped = True
