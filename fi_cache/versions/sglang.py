"""SGLang's version facts (re-exported by fi_cache.versions: import them from there)."""

from __future__ import annotations

import re

from fi_cache.versions.release import V, Version, VersionRange, parse_version

# --- SGLang -------------------------------------------------------------------------------------
# Read in the sglang 0.5.9-0.5.23 wheels (docs/research/sglang-releases.md has the long form).
# FA = sglang/srt/model_executor/runner/flashinfer_autotune.py; env = sglang/srt/environ.py.

SGLANG_CACHE_DIR_ENV = "SGLANG_CACHE_DIR"
# env 0.5.12:655, 0.5.18:991, 0.5.23:1383: EnvStr(os.path.expanduser("~/.cache/sglang")); the set
# value is used as given (no expanduser: FA 0.5.23:190 `Path(envs.SGLANG_CACHE_DIR.get())`).
SGLANG_CACHE_DIR_DEFAULT = "~/.cache/sglang"
# `$SGLANG_CACHE_DIR/flashinfer/autotune/<flashinfer.__version__>/sm<maj><min>/<sha256(key)[:16]>/
# rank_tp{tp}_pp{pp}_dp{dp}.json` (0.5.12 model_runner.py:2561-2595; 0.5.14 runner/
# base_runner.py:372-400; FA 0.5.18:131-170, 0.5.23:164-215). 0.5.11 keeps nothing on disk.
SGLANG_AUTOTUNE_SUBDIR = ("flashinfer", "autotune")
SGLANG_PERSISTENT_CACHE = V("0.5.12")
SGLANG_ARCH_DIR = re.compile(r"^sm(\d+)$")  # f"sm{major}{minor}" of this rank's own GPU
SGLANG_KEY_DIR = re.compile(r"^[0-9a-f]{16}$")  # hashlib.sha256(key).hexdigest()[:16]
# 0.5.22+: `_gpu{torch uuid}` appended for --moe-runner-backend flashinfer_megamoe (FA 0.5.22
# :176-189, 0.5.23:201-214; "Engines sharing physical GPUs must use separate SGLANG_CACHE_DIRs").
SGLANG_RANK_FILE = re.compile(r"^rank_tp(\d+)_pp(\d+)_dp(\d+)(?:_gpu([0-9A-Za-z-]+))?\.json$")
SGLANG_GPU_SUFFIX = V("0.5.22")
# SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 (env 0.5.13:856, EnvBool(True)): one fresh file per rank and
# context entry in `<hash dir>/runs/`, never read back nor pruned: `{stem}.{%Y%m%d_%H%M%S}.json`
# (FA 0.5.18:181-190), `{stem}.{stamp}.{uuid4 hex}.json` from 0.5.22 (FA 0.5.22:280-284).
SGLANG_AUTOTUNE_CACHE_ENV = "SGLANG_FLASHINFER_AUTOTUNE_CACHE"
# An extra full-model EXTEND autotune pass when true (EnvBool(False): env 0.5.18:919, 0.5.21:1108,
# 0.5.23:1282; FA 0.5.23:443-444): a start with it tunes shapes a start without it never does.
SGLANG_AUTOTUNE_EXTEND_ENV = "SGLANG_FLASHINFER_AUTOTUNE_EXTEND"
SGLANG_RUNS_DIR = "runs"
SGLANG_RUNS_FROM = V("0.5.13")
SGLANG_RUN_FILE = re.compile(
    r"^rank_tp(\d+)_pp(\d+)_dp(\d+)(?:_gpu([0-9A-Za-z-]+))?\.(\d{8}_\d{6})(?:\.[0-9a-f]{32})?\.json$"
)
# The key hashes model path, dtype, quantization, MoE backend, TP/PP/DP/EP sizes and the HF config
# class (+ skip_ops= from 0.5.17, candidate_selection= from 0.5.23, draft_quant= for drafts):
# FA 0.5.23:172-189. Never the finalize mode: no FA of any release names FUSED_FINALIZE.
SGLANG_KEY_HAS_FINALIZE = False
SGLANG_KEY_FIELDS = (
    "model path (as given)",
    "dtype",
    "quantization",
    "MoE runner backend",
    "TP/PP/DP/EP sizes",
    "HF config class",
    "skip_ops (0.5.17+)",
    "candidate_selection (0.5.23+)",
)

# Where that key is computed: `flashinfer_autotune_cache_path` and
# `get_flashinfer_autotune_skip_ops` of this module (0.5.17:121-160 ... 0.5.23:164-214); seeding
# runs the installed release's own.
SGLANG_KEY_MODULE = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
# Skips a release adds to the user's --flashinfer-autotune-skip-ops and hashes with them:
# FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS = {"mxfp8_gemm"} in 0.5.17 (FA 0.5.17:34), empty from
# 0.5.18 (FA 0.5.18:41): why 0.5.17's dirs are not 0.5.18's.
SGLANG_WORKAROUND_SKIPS: tuple[frozenset[str], ...] = (frozenset({"mxfp8_gemm"}),)
# "Retune caches created before FlashInfer's default tactic joined the race" (FA 0.5.23:183-184):
# the key gains candidate_selection=v2_default, so earlier releases' files are re-tuned on purpose.
SGLANG_CANDIDATE_SELECTION = VersionRange(
    V("0.5.23"), None, "flashinfer_autotune.py 0.5.23:183-184"
)

# SGLANG_FLASHINFER_MOE_FUSED_FINALIZE, read per call and passed to FlashInfer as
# use_fused_finalize= (layers/moe/moe_runner/flashinfer_cutlass.py 0.5.18:239, flashinfer_cutedsl.py
# 0.5.18:359). Absent up to 0.5.17. Default on: env 0.5.18:900, 0.5.19:974, 0.5.20:1041; off:
# 0.5.21:1082, 0.5.22:1120, 0.5.23:1251.
SGLANG_FINALIZE_ENV = "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"
SGLANG_FINALIZE_FROM = V("0.5.18")
# SGLang saves the rank file after every autotune context, warm or not (flashinfer_autotune.py
# 0.5.21:297-298, 0.5.23:366-367), and FlashInfer's save_configs calls mkstemp in the cache dir
# outside any try (autotuner/autotuner.py 0.6.18:2619): a read-only namespace fails the start.
SGLANG_SAVES_EVERY_START = VersionRange(
    V("0.5.21"), None, "flashinfer_autotune.py 0.5.21:297-298, 0.5.23:366-367"
)
SGLANG_FINALIZE_DEFAULT_OFF = V("0.5.21")
# --enable-deterministic-inference sets the variable to "0" (server_args.py 0.5.18:8076-8077;
# arg_groups/serving_hook.py 0.5.19:404-405 ... 0.5.23:447-448) and, from 0.5.18, skips autotune
# (`should_run_flashinfer_autotune`: FA 0.5.18:59-62 ... 0.5.23:91). 0.5.12-0.5.17 still tune.
SGLANG_DETERMINISTIC_FLAG = "--enable-deterministic-inference"
SGLANG_DETERMINISTIC_SKIPS_TUNE = V("0.5.18")
SGLANG_DISABLE_AUTOTUNE_FLAG = "--disable-flashinfer-autotune"
# From 0.5.19, with TP > 1 and the cache on, each TP rank hashes its parsed file plus the current
# `_collect_metadata()` and on any disagreement every rank unlinks its file (FA 0.5.19:209-246,
# :257-260; 0.5.23:249-286). Under expert parallelism per-rank shapes never agree, so the cache
# is discarded every boot: sglang issue #40320 (open; PR #40420 unreleased as of 0.5.23).
SGLANG_RANK_DIGEST = VersionRange(V("0.5.19"), None, "FA 0.5.19:209-246, sglang #40320")
# FlashInfer each release pins (wheel METADATA Requires-Dist flashinfer_python==).
# FlashInfer's CuTe-DSL NVFP4 (w4a4) MoE runner, the one SGLang's flashinfer_cutedsl backend
# tunes: its key extras lack use_fused_finalize in 0.6.17 (fused_moe/cute_dsl/tuner.py :409-416)
# and 0.6.18 (:624-633, CuteDslFusedMoENvfp4Runner); 0.7.0 renames it CuteDslFusedMoERunner and
# adds the mode (tuner.py 0.7.0:451, :666-681, at :677; the same in 0.7.1). SGLang's path never
# has it, so both modes share entries.
CUTEDSL_NVFP4_RUNNER = "CuteDslFusedMoENvfp4Runner"
CUTEDSL_KEY_HAS_FINALIZE = V("0.7.0")
SGLANG_FLASHINFER_PIN: dict[str, str] = {
    "0.5.9": "0.6.3",
    "0.5.10.post1": "0.6.7.post3",
    "0.5.11": "0.6.8.post1",
    "0.5.12": "0.6.11.post1",
    "0.5.13": "0.6.12",
    "0.5.14": "0.6.12",
    "0.5.15.post1": "0.6.12",
    "0.5.16": "0.6.14",
    "0.5.17": "0.6.15.post1",
    "0.5.18": "0.6.17",
    "0.5.19": "0.6.18",
    "0.5.20": "0.6.18",
    "0.5.21": "0.6.18",
    "0.5.22": "0.7.1",
    "0.5.23": "0.7.2",
}
SGLANG_NEWEST_CHECKED = V("0.5.23")
# Before 0.5.18 SGLang passes no use_fused_finalize, so FlashInfer's default runs: fused
# (flashinfer/fused_moe/core.py 0.6.17:943, `use_fused_finalize: bool = True` of cutlass_fused_moe).
SGLANG_FINALIZE_BEFORE_ENV = "fused"

# What moves with SGLANG_CACHE_DIR, so what `--engine sglang` pins back to the user's own dir
# when it points SGLANG_CACHE_DIR into a namespace. (variable, subdir of SGLANG_CACHE_DIR, first
# release, source): variables SGLang defaults from it: SGLANG_DG_CACHE_DIR (env 0.5.18:27-37,
# :981 `_default_cache_subdir("deep_gemm")`; ~/.cache/deep_gemm before), SGLANG_CUTE_AOT_CACHE_DIR
# (env 0.5.20:1168), SGLANG_QWEN4_PLE_FILE_DIR (env 0.5.20:311), and the third-party caches
# `import sglang` setdefaults (sglang/__init__.py 0.5.18:11-14 -> env 0.5.18:1633-1657
# third_party_cache_defaults; TILELANG from env 0.5.21:1971).
SGLANG_DERIVED_CACHES: tuple[tuple[str, str, Version, str], ...] = (
    ("SGLANG_DG_CACHE_DIR", "deep_gemm", V("0.5.18"), "env 0.5.18:981"),
    ("SGLANG_CUTE_AOT_CACHE_DIR", "cute_aot", V("0.5.20"), "env 0.5.20:1168"),
    ("SGLANG_QWEN4_PLE_FILE_DIR", "ple", V("0.5.20"), "env 0.5.20:311"),
    ("TRITON_CACHE_DIR", "triton", V("0.5.18"), "env 0.5.18:1636"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor", V("0.5.18"), "env 0.5.18:1637"),
    ("CUDA_CACHE_PATH", "nv", V("0.5.18"), "env 0.5.18:1638"),
    ("TILELANG_CACHE_DIR", "tilelang", V("0.5.21"), "env 0.5.21:1971"),
    ("FLASHINFER_WORKSPACE_BASE", "", V("0.5.18"), "env 0.5.18:1641 (FlashInfer adds .cache/)"),
)
# Of those, the two a diffusion worker re-points: `_configure_persistent_torch_compile_cache`
# (multimodal_gen/runtime/managers/gpu_worker.py 0.5.18:183-216, 0.5.21:299-332, 0.5.23:356-389)
# moves TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR to $SGLANG_DIFFUSION_CACHE_ROOT/
# torch_compile_cache/ unless a value differs from `third_party_cache_defaults()` of the current
# SGLANG_CACHE_DIR and lies outside the temp dir (0.5.23:366-374): a value fi-cache pins is
# "explicit" there. So these are left unset and their dirs linked (`<ns>/sglang/inductor` -> the
# user's), pinned only where the link cannot be made.
SGLANG_LINKED_DERIVED = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})
# Dirs SGLang joins to SGLANG_CACHE_DIR itself, with no variable of their own: torch.compile's
# cache (compilation/backend.py 0.5.18:405-410), the Run:ai model streamer's (utils/
# runai_utils.py 0.5.18:123-130), built Rust extensions (rust_extensions/loader.py 0.5.18:299-300,
# 0.5.23:358-359). In 0.5.23 diffusion's flashinfer/autotune/flux3_prims_ts/... (multimodal_gen/
# .../flux3_image.py:435-446) is joined there too and moves with the autotune dir, as it should.
SGLANG_DIRECT_CACHES = ("torch_compile_cache", "model_streamer", "rust_extensions")
# Files SGLang joins to SGLANG_CACHE_DIR, linked to the user's (a link to a file that is not there
# reads as absent, and a write goes through it):
# - the custom all-reduce P2P probe, one per machine topology (not an autotune result: a store
#   shared by hosts must not hand one host's answer to another): `gpu_p2p_access_cache_for_{CVD}
#   .json` in os.path.expanduser(SGLANG_CACHE_DIR), CVD = $CUDA_VISIBLE_DEVICES as set, else
#   "0,1,..." over torch.cuda.device_count(); local rank 0 probes and writes it when missing, every
#   rank reads it after a barrier (custom_all_reduce_utils.py 0.5.17:260-322, 0.5.18/0.5.21/
#   0.5.23:261-323);
# - kernels.lock, which SGLang never writes: the user's pin of the Hub FA3 kernels, read from
#   SGLANG_CACHE_DIR as given when it exists, else the kernels are fetched unpinned from the Hub
#   (kernels/ops/attention/flash_attention_v3.py 0.5.17-0.5.23:16, :41-52).
SGLANG_P2P_FILE = "gpu_p2p_access_cache_for_{}.json"
SGLANG_KERNELS_LOCK = "kernels.lock"
# MoE all-to-all backends that span every rank: SGLang sets ep_size = tp_size for them
# (arg_groups/overrides.py 0.5.18:2566, 0.5.23:1578-1592 `_A2A_EP_SPANNING_BACKENDS`, :1610-1620).
SGLANG_A2A_EP_SPANNING = frozenset(
    {
        "megamoe",
        "deepep",
        "deepep_v2",
        "mooncake",
        "nixl",
        "ascend_fuseep",
        "flashinfer",
        "flashinfer_megamoe",
        "mori",
        "pplx",
    }
)
# `--moe-runner-backend megamoe` is DeepGEMM's MegaMoE, an alias of `--moe-a2a-backend megamoe`
# that leaves the runner `auto` (mega_moe_hook.py 0.5.23:259-276); `--moe-a2a-backend
# flashinfer_megamoe` turns an `auto` runner into flashinfer_megamoe (moe_hook.py 0.5.23:315-331).
# `--moe-a2a-backend deepep_v2` (0.5.21+; not in 0.5.18) turns an `auto` runner into deep_gemm,
# so the key dir hashes deep_gemm and FlashInfer's MoE is not tuned; any runner but deep_gemm
# makes SGLang refuse to start (moe_hook.py 0.5.21:331-350, 0.5.23:400-419).
SGLANG_RUNNER_ALIASES = {"megamoe": ("auto", "megamoe")}  # runner -> (runner, a2a)
SGLANG_A2A_SETS_RUNNER = {  # a2a -> what an auto runner becomes
    "flashinfer_megamoe": "flashinfer_megamoe",
    "deepep_v2": "deep_gemm",
}
# --enable-waterfill turns any other --moe-a2a-backend into deepep, which then spans EP
# (`_a2a_backend_overrides`, arg_groups/overrides.py 0.5.17:2459-2464, 0.5.18:2584-2589,
# 0.5.21:1527-1532, 0.5.23:1599-1604; run before `_a2a_ep_size`: moe_hook.py 0.5.23:292-293).
SGLANG_WATERFILL_FLAG = "--enable-waterfill"
SGLANG_WATERFILL_KEEPS = frozenset({"deepep", "megamoe"})
SGLANG_WATERFILL_A2A = "deepep"
# 0.5.17 only: SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE=1 (EnvBool(False), env 0.5.17:1202) makes the a2a
# megamoe right after waterfill's pass (overrides.py 0.5.17:2465-2470), so EP spans TP too.
SGLANG_MEGAMOE_ENV = "SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE"
SGLANG_MEGAMOE_ENV_RANGE = VersionRange(V("0.5.17"), V("0.5.18"), "overrides.py 0.5.17:2465-2470")
# Model overrides (run after parsing, before the a2a passes: pipeline.py 0.5.23:225, :295) that
# move the MoE layout. DeepSeek family (`_register_for`, model_overrides/deepseek_v2.py 0.5.21
# :16-29, 0.5.23:37-50) with --enable-prefill-cp: DP attention over the --dp-size ranks
# (enable_dp_attention=True overrides.py 0.5.17:580, :650, 0.5.18:622, :692, deepseek_v2.py
# 0.5.21:88, :159; attn_dp_size = attn_dp x dp and dp_size 1 in 0.5.23
# :110-114, :196-198, model_override_base.py 0.5.23:229-247), and the MoE on deepep, EP = TP, for
# a DSA model (arch in the list and `index_topk` set: configs/model_config.py 0.5.23:191-212)
# with --cp-strategy zigzag (0.5.18:624-626, 0.5.21:90-92, 0.5.23:115-118) or any other, MLA,
# one (0.5.18:688-696, 0.5.21:157-165, 0.5.23:191-202; MLA: model_config.py 0.5.23:1367-1397,
# Pixtral only with kv_lora_rank).
SGLANG_PREFILL_CP_FLAG = "--enable-prefill-cp"
SGLANG_DEEPSEEK_FAMILY = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "Glm5NextForConditionalGeneration",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
    }
)
SGLANG_DSA_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
# MiniMax-M3.1 NVFP4 (--quantization minimax_m3_nvfp4, or SGLang's reading of a config that
# declares mxfp8 with NVFP4 packed experts: model_overrides/minimax_m3.py 0.5.23:18-34, :46-54),
# 0.5.23 (0.5.21 has no such rule; 0.5.22 not read): off Blackwell an auto runner becomes marlin
# (:94-102); on Blackwell (SM 10x-12x with CUDA >= 12.8: utils/common.py 0.5.23:274-302) the
# a2a becomes megamoe, EP = TP, and an auto runner deep_gemm (:103-114), unless the runner is
# flashinfer_trtllm_routed.
SGLANG_MINIMAX_M3 = VersionRange(V("0.5.23"), None, "model_overrides/minimax_m3.py 0.5.23:37-122")
SGLANG_MINIMAX_M3_ARCHS = frozenset(
    {
        "MiniMaxM3SparseForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration",
    }
)
SGLANG_MINIMAX_M3_NVFP4 = "minimax_m3_nvfp4"
SGLANG_BLACKWELL = ((10, 11, 12), (12, 8))  # compute-capability majors, least CUDA
# SGLang copies every SGL_X over SGLANG_X at import (environ.py 0.5.12:715-720, 0.5.18:1623-1630,
# 0.5.23:2298-2305 `_handle_deprecated_envs`): a legacy twin wins over the new name.
SGLANG_LEGACY_PREFIX = ("SGL_", "SGLANG_")
SGLANG_DEFAULT_PORT = 30000  # server_args.py 0.5.18:1278 `port: ... = 30000`
SGLANG_LAUNCH_MODULE = "sglang.launch_server"  # `python -m sglang.launch_server ARGS`


def sglang_finalize_default(version: str | None) -> str | None:
    """The finalize mode SGLang `version` runs when the variable is unset: None where it does not
    read the variable (before 0.5.18) or the version is unknown."""
    v = parse_version(version)
    if v is None or v < SGLANG_FINALIZE_FROM:
        return None
    return "unfused" if v >= SGLANG_FINALIZE_DEFAULT_OFF else "fused"


def sglang_caches_moved(version: str | None) -> list[tuple[str, str]]:
    """(variable, subdir) of the caches SGLang `version` derives from SGLANG_CACHE_DIR
    (SGLANG_DERIVED_CACHES); an unknown version: all of them, as the newest checked does."""
    v = parse_version(version)
    return [(var, sub) for var, sub, first, _ in SGLANG_DERIVED_CACHES if v is None or v >= first]
