"""What FlashInfer's autotuner looks up for the ops fi-cache plans (`warm --engine flashinfer`):
the custom op each call tunes under and the token buckets it rounds a call to. Read in the
FlashInfer 0.6.17, 0.6.18 and 0.7.2.post1 wheels; the same in all three."""

from __future__ import annotations

# The custom op each plan op's FlashInfer call tunes under (`AutoTuner.choose_one(NAME, ...)`:
# gemm/gemm_base.py 0.6.17:1459,1492; 0.6.18:1714,1897; 0.7.2.post1:2620,2809;
# trtllm_low_latency_gemm.py 0.6.17/0.6.18:197, 0.7.2.post1:198); cutlass_fused_moe tunes two
# (fused_moe/core.py, MOE_OPS). The token count is the second-last dim of the first input
# (DynamicTensorSpec (0,), (-2,): gemm_base.py 0.6.18:1206-1209; the MoE's x is (tokens, hidden)).
PLAN_OP_CUSTOM_OPS: dict[str, tuple[str, ...]] = {
    "mm_bf16": ("bf16_gemm",),
    "bmm_fp8": ("fp8_gemm",),
    "mm_fp8": ("trtllm_low_latency_gemm",),
    "cutlass_fused_moe": ("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"),
}
# The token buckets of these GEMMs and of the CUTLASS MoE (`get_hybrid_num_tokens_buckets`,
# `map_to_hybrid_bucket[_uncapped]`: fused_moe/utils.py 0.6.17:184-291, 0.6.18:184-291,
# 0.7.2.post1:217-324; the GEMMs' tuning configs gemm_base.py 0.6.18:1206-1209, the MoE's
# fused_moe/core.py 0.6.18:881-882): powers of 2 up to 256, steps of 256 up to 2048, of 512 up
# to 4096, then powers of 2, and the largest token count tuned; a call rounds up to the next
# bucket (the MoE's capped at its tune_max_num_tokens).
HYBRID_POWER_OF_2_UNTIL = 256
HYBRID_STEPS = ((2048, 256), (4096, 512))  # (up to, step)
