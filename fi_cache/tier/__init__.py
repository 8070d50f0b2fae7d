"""vLLM 0.34's fleet tier: the Mooncake store the `vllm preload` daemon shares FlashInfer tables
through (`--warmup-cache-stores mooncake`), seen, judged and fed by fi-cache (docs/fleet.md)."""
