"""fi-cache: namespace, inspect, verify and diagnose FlashInfer autotune caches for vLLM."""

__version__ = "0.1.0"
