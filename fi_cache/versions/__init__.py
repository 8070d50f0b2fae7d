"""Every version-dependent fact fi-cache relies on, in one place, each with its source: this
module (FlashInfer, vLLM), versions/sglang.py (SGLang) and versions/tuning.py (what FlashInfer's
autotuner looks up for a plan's ops), whose names it re-exports with the types of
versions/release.py, so every fact is imported from `fi_cache.versions`.

Sources are FlashInfer, vLLM and SGLang release wheels (`pip download --no-deps NAME==VER`,
unzip) and the public issue threads named beside each fact. When a new release changes one,
change it here only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from fi_cache.versions.release import V as V  # re-exported, as are the three below
from fi_cache.versions.release import Version as Version
from fi_cache.versions.release import VersionRange as VersionRange
from fi_cache.versions.release import parse_version as parse_version

# --- FlashInfer v1 cache file -------------------------------------------------------------------

# The `_metadata` fields FlashInfer compares on load (flashinfer/autotuner/autotuner.py,
# `_collect_metadata`, 0.6.15-0.6.18; 0.7.x adds cutlass_dsl_version).
METADATA_FIELDS: tuple[str, ...] = (
    "flashinfer_version",
    "cuda_version",
    "cublas_version",
    "cudnn_version",
    "cudnn_frontend_version",
    "gpu",
)
METADATA_FIELDS_07: tuple[str, ...] = (*METADATA_FIELDS, "cutlass_dsl_version")

# Saved values FlashInfer treats as "could not detect" (soft mismatch; a missing field too) and
# as "matches anything" (autotuner.py 0.6.18 `_INDETERMINATE_META_VALUES`, `_classify_...`).
INDETERMINATE_VALUES = frozenset({"unknown", "None"})
WILDCARD = "*"

# Reserved top-level names (autotuner.py 0.6.18: _METADATA_KEY, _NAMESPACED_RECORDS_KEY,
# _CACHE_GENERATION_KEY). Entry keys always start with "(".
METADATA_KEY = "_metadata"
RECORDS_KEY = "_records"
GENERATION_KEY = "_generation"

# --- Fused MoE keys -----------------------------------------------------------------------------

MOE_OPS = frozenset({"trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"})
MOE_GEMM2_OP = "trtllm::fused_moe::gemm2"
# 0.6.18's MoELayer ranks the same CUTLASS runner's stages under these names
# (flashinfer/fused_moe/runners.py:475,484: f"moe_{backend_key}_sm{arch}_gemm1/2").
MOE_STAGE_OP = re.compile(r"^moe_\w+_sm\d+_gemm([12])$")

# MoERunner.get_cache_key_extras, by tuple length (flashinfer/fused_moe/core.py).
# 20 fields: 0.6.18rc2 .. 0.7.0; 17 fields: 0.7.4 dropped tp_rank, ep_rank, cluster_rank.
_MOE_EXTRAS_20 = (
    "x_dtype",
    "weight_dtype",
    "output_dtype",
    "top_k",
    "tp_size",
    "tp_rank",
    "ep_size",
    "ep_rank",
    "cluster_size",
    "cluster_rank",
    "enable_alltoall",
    "use_deepseek_fp8_block_scale",
    "use_w4_group_scaling",
    "use_mxfp8_act_scaling",
    "use_wfp4afp8_humming",
    "min_latency_mode",
    "enable_pdl",
    "activation_type",
    "use_packed_weights",
    "use_fused_finalize",
)
_MOE_EXTRAS_17 = tuple(f for f in _MOE_EXTRAS_20 if f not in {"tp_rank", "ep_rank", "cluster_rank"})
MOE_EXTRAS_FIELDS: dict[int, tuple[str, ...]] = {20: _MOE_EXTRAS_20, 17: _MOE_EXTRAS_17}
FINALIZE_FIELD = "use_fused_finalize"


# FlashInfer: what each release writes and reads (autotuner.py of each wheel).
FLASHINFER_CACHE_FILE = V("0.6.7")  # `autotune(cache=PATH)` exists
FLASHINFER_KEY_EXTRAS = V("0.6.13")  # keys are 4-tuples (extras); before: 3-tuples
FLASHINFER_FINALIZE_IN_KEY = V("0.6.18rc2")  # MoERunner extras carry use_fused_finalize
FLASHINFER_GENERATION = V("0.6.18rc2")  # `_records` / `_generation`; 0.6.17 crashes on `_records`
FLASHINFER_V2_STORE = V("0.7.0")  # opt-in managed store <root>/v2/<env>/


def flashinfer_keys_carry_finalize(version: str | None) -> bool | None:
    """Do MoE keys written by this FlashInfer record the finalize mode? None if unknown."""
    v = parse_version(version)
    return None if v is None else v >= FLASHINFER_FINALIZE_IN_KEY


def flashinfer_writes_generation(version: str | None) -> bool | None:
    v = parse_version(version)
    return None if v is None else v >= FLASHINFER_GENERATION


# --- Tuning FlashInfer ops directly (warm --engine flashinfer) ----------------------------------

# Backends each GEMM accepts (`backend=` Literal of flashinfer/gemm/gemm_base.py: mm_bf16,
# bmm_fp8, mm_fp8; "cute-dsl" is 0.6.18+, "auto" ranks every suitable backend).
GEMM_BACKENDS: dict[str, tuple[str, ...]] = {
    "mm_bf16": ("cudnn", "cutlass", "tgv", "cublaslt", "tinygemm", "cutile", "cute-dsl", "auto"),
    "bmm_fp8": ("cudnn", "cublas", "cutlass", "cute-dsl", "auto"),
    "mm_fp8": ("trtllm_low_latency",),
}
# mm_bf16 backends that write bf16 only: their requirement checks raise for another out_dtype
# (flashinfer/gemm/gemm_base.py _tgv_gemm_requirement, _tinygemm_mm_bf16_requirement,
# _cute_dsl_mm_bf16_requirement in 0.6.17 - 0.7.4; cutlass, cublaslt, cudnn, cutile take fp16).
MM_BF16_BF16_OUT_ONLY = ("tgv", "tinygemm", "cute-dsl")
# Compute capabilities (major*10+minor) a backend runs on: FlashInfer's own
# `FN.is_backend_supported(backend, cc)`, asked on CPU for cc 70-121 (70, 72, 75, 80, 86, 87, 89,
# 90, 100, 101, 103, 107, 110, 120, 121) with 0.6.17 and 0.6.18; the union of both (they differ
# only for cute-dsl, which 0.6.17 lacks). mm_fp8 has no such method: its only backend loads
# trtllm-gen cubins built for SM100-family GPUs (jit/gemm/core.py
# gen_trtllm_low_latency_gemm_module; sm107 variant for Rubin), downloaded on first use. The
# tuning child asks FlashInfer again at run time; this table lets `warm` refuse early, so it must
# never be narrower than FlashInfer.
GEMM_CCS_ASKED = frozenset({70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 107, 110, 120, 121})
GEMM_BACKEND_CCS: dict[tuple[str, str], frozenset[int]] = {
    ("mm_bf16", "cudnn"): frozenset({80, 86, 87, 89, 90, 100, 103, 110, 120, 121}),
    ("mm_bf16", "cublaslt"): frozenset({80, 86, 87, 89, 90, 100, 103, 110, 120, 121}),
    ("mm_bf16", "tinygemm"): frozenset({90, 100, 103, 110, 120, 121}),
    ("mm_bf16", "cutile"): frozenset({90, 100, 103, 110, 120, 121}),
    ("mm_bf16", "cutlass"): frozenset({100, 103, 107}),
    ("mm_bf16", "tgv"): frozenset({100, 103}),
    ("mm_bf16", "cute-dsl"): frozenset({100, 103}),
    ("bmm_fp8", "cudnn"): frozenset({89, 90, 100, 103, 107, 110, 120, 121}),
    ("bmm_fp8", "cublas"): frozenset({89, 90, 100, 103, 107, 110, 120, 121}),
    ("bmm_fp8", "cutlass"): frozenset({100, 103, 107, 110, 120, 121}),
    ("bmm_fp8", "cute-dsl"): frozenset({107}),
    ("mm_fp8", "trtllm_low_latency"): frozenset({100, 103, 107}),
}
# cutlass_fused_moe: the device archs `get_cutlass_fused_moe_module(backend)` builds a module
# for, and the JIT generator it uses (fused_moe/core.py:299-311 in 0.6.17, same in 0.6.18).
MOE_ARCH_MODULES: dict[int, str] = {
    89: "gen_cutlass_fused_moe_sm89_module",
    90: "gen_cutlass_fused_moe_sm90_module",
    100: "gen_cutlass_fused_moe_sm100_module",
    107: "gen_cutlass_fused_moe_sm100_module",
    110: "gen_cutlass_fused_moe_sm100_module",
    103: "gen_cutlass_fused_moe_sm103_module",
    120: "gen_cutlass_fused_moe_sm120_module",
    121: "gen_cutlass_fused_moe_sm120_module",
}
# Unquantised MoE dtypes fi-cache builds inputs for (the CUTLASS module's x/weight dtype).
MOE_DTYPES: tuple[str, ...] = ("bf16", "fp16")
# The compiled runner's `init(x_dtype, weight_dtype, output_dtype, *flags)`: the flags after the
# dtypes, in order (fused_moe/core.py `module.init(`: 0.6.17:393 has 5; 0.6.18:693, 0.7.0:756 and
# 0.7.4:994 add use_wfp4afp8_humming). Used to read GEMM tactic counts for both finalize modes.
MOE_INIT_FLAGS_HUMMING = V("0.6.18rc1")  # 0.6.17 lacks it, 0.6.18 has it; rcs not checked
_MOE_INIT_FLAGS = (
    "use_deepseek_fp8_block_scale",
    "use_w4_group_scaling",
    "use_mxfp8_act_scaling",
    "use_packed_weights",
    "use_fused_finalize",
)


def moe_init_flags(version: str | None) -> tuple[str, ...]:
    """The flag names FlashInfer `version`'s CUTLASS MoE runner `init` takes after the dtypes."""
    v = parse_version(version)
    if v is not None and v >= MOE_INIT_FLAGS_HUMMING:
        return (*_MOE_INIT_FLAGS, "use_wfp4afp8_humming")
    return _MOE_INIT_FLAGS


# --- vLLM ---------------------------------------------------------------------------------------

# `vllm/envs.py` gains this name with vLLM PR #54948 (issue #54945); absent up to 0.33.
VLLM_FINALIZE_ENV = "VLLM_FLASHINFER_MOE_FUSED_FINALIZE"
VLLM_CACHE_DIR_ENV = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
VLLM_CACHE_SUBDIR = "flashinfer_autotune_cache"  # under $VLLM_CACHE_ROOT (default ~/.cache/vllm)
# kernel_warmup.py: one shared file 0.25-0.31; per-rank files from 0.32 (single GPU: dp0_rank0).
VLLM_CACHE_FILE = "autotune_configs.json"
VLLM_RANK_FILE = re.compile(r"^autotune_configs_dp(\d+)_rank(\d+)\.json$")
VLLM_CACHE_FILE_RE = re.compile(r"^autotune_configs(?:_dp\d+_rank\d+)?\.json$")
# From 0.32 the MoE/GEMM tune reads only the per-rank files (kernel_warmup.py 0.32:453-458); a
# plain `<hash>/autotune_configs.json` beside them is the SM120-family sparse-MLA decode warmup's
# own v1 file: `autotune(True, cache=<hash>/autotune_configs.json)` around a mixed dummy run, then
# rank 0's copy written for every rank (warmup/flashinfer_sparse_mla_warmup.py 0.32:131,147,178,
# 211; 0.33:134,164,187,220). Any op that runs then is tuned into it; FlashInfer 0.6.17/0.6.18
# key the sparse-MLA decode itself as `sparse_mla_sm120_decode_dsv3_2` / `_dsv4`
# (mla/_sparse_mla_sm120.py 0.6.18:1191,1337); 0.7.2.post1 calibrates it elsewhere
# (sparse_mla_sm120_cpb.json under FLASHINFER_AUTOTUNE_DIR, mla/_sparse_mla_sm120/_calibration.py
# :1128-1140), so its file holds only the other ops of that run.
VLLM_SPARSE_MLA_FROM = V("0.32.0")
SPARSE_MLA_OP_PREFIX = "sparse_mla_sm120"
# FlashInfer writes a v1 file only where it is told: `autotune(tune_mode, cache=None)` and
# `save_configs(path)` have no default name (autotuner/autotuner.py 0.6.17:644-646,2115;
# 0.6.18:783-785,2459; 0.7.2.post1:835-837,3471). `autotune_config.json` is the name FlashInfer's
# own config-caching example dumps to (flashinfer PR #2554) and what vllm PR #57579 (open) calls
# FlashInfer's dump; no vLLM release reads it (0.32.0 and 0.33.0 name only autotune_configs.json
# and _dp{d}_rank{r}: warmup/flashinfer_autotune_cache.py 0.33:57-65, kernel_warmup.py
# 0.32:453-458).
FLASHINFER_DUMP_FILE = "autotune_config.json"
# vLLM 0.33 keeps FlashInfer's v2 store instead of a v1 file when it runs one rank on one node:
# no elastic EP, pp <= 1, FlashInfer with autotune_v2 (0.7.0+), one node, world size 1
# (model_executor/warmup/flashinfer_autotune_cache.py 0.33:79-111; utils/flashinfer.py:362-371).
VLLM_V2_STORE = V("0.33.0")
# --disable-flashinfer-autotune (EnableDisableAction) is 0.33's; 0.25-0.32 have only
# --[no-]enable-flashinfer-autotune (engine/arg_utils.py 0.32:1802) and reject the command line
# (vLLM 0.32's own parser, run in tests/engines/vllm/test_vllm_args.py).
VLLM_DISABLE_AUTOTUNE_FLAG = V("0.33.0")
# Its root: expanduser($VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR) (0.33 :114-123), else FlashInfer's
# get_default_cache_root(): $FLASHINFER_AUTOTUNE_CACHE_DIR as given, else
# ${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer/autotune (FlashInfer 0.7.2.post1
# autotune_cache.py:160-167, jit/env.py:66-70). No vLLM hash, version or arch is in that path.
FLASHINFER_AUTOTUNE_ROOT_ENV = "FLASHINFER_AUTOTUNE_CACHE_DIR"


class ArchUnknown(ValueError):
    """FlashInfer itself gets no arch here (it raises, or its detection gives up)."""


def _arch_name(major: int, minor: str, cuda: Version | None) -> tuple[int, str]:
    """compilation_context._normalize_cuda_arch (FlashInfer 0.7.2.post1 :81-109; 0.6.16-0.6.18
    :61): SM9x "a"; SM120 "f" from CUDA 12.9, "a" on 12.8 (0.7.1rc1+: compilation_context.py
    0.7.1rc1:99-103; 0.6.x and 0.7.0 raise below 12.9, not modelled), raise below; SM121+ "a"
    from CUDA 12.9, raise below; SM10+ "a"; below SM90 none. `cuda` is nvcc's version, else
    torch's (jit/cpp_ext.py:68-87)."""
    if major == 9 or (major >= 10 and major != 12):
        return major, f"{minor}a"
    if major == 12:
        if minor == "0" and (cuda is None or cuda >= V("12.9")):
            return major, "0f"
        if minor == "0" and cuda is not None and cuda >= V("12.8"):
            return major, "0a"
        if minor != "0" and (cuda is None or cuda >= V("12.9")):
            return major, f"{minor}a"
        raise ArchUnknown(f"SM12{minor} needs CUDA >= {'12.8' if minor == '0' else '12.9'}")
    return major, minor


def vllm_arch(
    compute_caps: list[str], cuda_version: str | None = None, arch_list: str | None = None
) -> str | None:
    """vLLM's arch dir level: the last level of FlashInfer's JIT workspace dir (jit/env.py
    0.7.2.post1 :382-391): the set of normalised capabilities of every visible GPU, or of
    `FLASHINFER_CUDA_ARCH_LIST` (split on single spaces; an explicit suffix is kept: "9.0 9.0a"
    is one arch, "90a"), sorted by (major, minor), joined by "_" ("80_90a_100a"). None where
    FlashInfer gets none: a malformed list (its import raises), or a GPU it cannot normalise
    (detection stops at the first such GPU, compilation_context.py :128-133)."""
    cuda = parse_version(cuda_version)
    names: set[tuple[int, str]] = set()
    for cap in arch_list.split(" ") if arch_list is not None else compute_caps:
        major, dot, minor = cap.partition(".")
        if not (major.isdigit() and dot and minor):
            return None  # FlashInfer: int() or unpacking raises at import
        try:
            if minor[-1].isalpha() and arch_list is not None:
                names.add((int(major), minor))
            else:
                names.add(_arch_name(int(major), minor, cuda))
        except ArchUnknown:
            if arch_list is not None:
                return None  # raised at FlashInfer's import
            break  # the detection loop's except: the GPUs before this one stay
    if not names:
        return None
    return "_".join(f"{ma}{mi}" for ma, mi in sorted(names))


# --- Known-bad vLLM configurations (doctor) -----------------------------------------------------


@dataclass(frozen=True)
class MoeTacticLists:
    """The CUTLASS fused MoE's tactic ids for one (FlashInfer, SM, dtype): GEMM1 ids
    [0, gemm1), then GEMM2 ids per finalize mode as consecutive (config family, count) runs."""

    flashinfer: VersionRange
    sm: int
    dtype: str
    gemm1: int
    gemm2: dict[str, tuple[tuple[str, int], ...]]
    source: str

    def gemm2_count(self, mode: str) -> int:
        return sum(n for _, n in self.gemm2[mode])


# Measured on an NVIDIA H200 (2026-12-01, bf16, Qwen3-30B-A3B shapes, a bf16-only test build of
# FlashInfer's own fused_moe_90: same lists as the stock module, which come from
# MoeGemmRunner::getConfigs): g1 45, g2 81 fused / 45 unfused on 0.6.17 and 0.6.18
# (tests/fixtures/h200-moe-run/*/counts.json). Order from getTmaWarpSpecializedConfigs (fused:
# base, finalize, swap-AB base, swap-AB finalize; unfused: base, swap-AB base) then the SM80
# grouped configs, confirmed by a sweep of every GEMM2 tactic (tests/fixtures/h200-moe/
# determinism-0.6.17.json: exactly the 36 finalize ids 63-80 and 99-116 were not bit-stable).
MOE_TACTIC_LISTS: tuple[MoeTacticLists, ...] = (
    MoeTacticLists(
        VersionRange(V("0.6.17"), V("0.6.19"), "measured 0.6.17 and 0.6.18 on an H200"),
        90,
        "bf16",
        45,
        {
            "fused": (
                ("base", 18),
                ("finalize", 18),
                ("swap_base", 18),
                ("swap_finalize", 18),
                ("sm80", 9),
            ),
            "unfused": (("base", 18), ("swap_base", 18), ("sm80", 9)),
        },
        "H200 run of benchmarks/moe_h200 (counts.json), layout from cutlass_heuristic",
    ),
)


# The SM of a GPU FlashInfer names in `_metadata.gpu` (torch's device name), for files that say
# no arch: NVIDIA's compute-capability table (developer.nvidia.com/cuda-gpus): Hopper is 9.0.
GPU_SM = (
    ("NVIDIA H100", 90),
    ("NVIDIA H200", 90),
    ("NVIDIA H800", 90),
    ("NVIDIA H20", 90),
    ("NVIDIA GH200", 90),
)


def sm_of_gpu(name: str | None) -> int | None:
    for prefix, sm in GPU_SM:
        if name and name.startswith(prefix):
            return sm
    return None


def moe_tactic_lists(version: str | None, sm: int | None, dtype: str) -> MoeTacticLists | None:
    v = parse_version(version)
    for lists in MOE_TACTIC_LISTS:
        if v is not None and v in lists.flashinfer and lists.sm == sm and lists.dtype == dtype:
            return lists
    return None


# MoE output all-reduced over TP after FlashInfer's combine already reduced it (GSM8K 0.93 -> 0.81).
# FlashInfer's combine already sums the top-k outputs, yet the prepare/finalize reports it
# unreduced, so the MoE output is all-reduced over TP again: output_is_reduced() False in 0.14.1
# and 0.15.0 (fused_moe/flashinfer_cutlass_prepare_finalize.py:57-58, all2all condition
# fused_moe/config.py 0.14.1:863-864 `dp_size > 1 and use_ep`), 0.15.1 ... 0.21.0
# flashinfer_nvlink_two_sided.py:52-53, True from 0.22.0 (PR #41382). 0.14.1 is the oldest read.
DOUBLE_REDUCE = VersionRange(V("0.14.1"), V("0.22.0"), "vLLM PR #41382 (fixed in 0.22.0)")
# The backend also came from VLLM_ALL2ALL_BACKEND when --all2all-backend was not given
# (config/parallel.py 0.14.1:530-536, 0.15.1:542-548); gone in 0.16.0 (grep of its parallel.py).
ALL2ALL_ENV = "VLLM_ALL2ALL_BACKEND"
ALL2ALL_ENV_READ = VersionRange(V("0.14.1"), V("0.16.0"), "config/parallel.py 0.15.1:542-548")
DOUBLE_REDUCE_BACKENDS = frozenset(
    {"flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided"}
)
# World size > 1 with a warm cache can deadlock start-up: one shared file, broadcast by the leader
# and loaded by every rank, so a rank-keyed entry hits on rank 0 only and the others wait in the
# tuning all-reduce (kernel_warmup.py 0.27:278-298 ... 0.31:449-482). 0.32 has per-rank files and
# loads only when every rank has a matching one (kernel_warmup.py:394-401, 453-476, PR #57635).
# 0.32+: every rank of the tune group (the world group; a stage's TP group with pp > 1) needs
# its own file with equal (json.dumps(_metadata, sort_keys=True), count of other top-level
# fields), else every rank tunes again (kernel_warmup.py 0.32:384-401,453-476; 0.33:388-426).
VLLM_RANK_GATE = VersionRange(V("0.32.0"), None, "kernel_warmup.py 0.32:384-401, 0.33:388-426")
WARM_CACHE_HANG = VersionRange(V("0.27.0"), V("0.32.0"), "vLLM issues #57423, #54618")
# 0.33+: when every rank's file passes that gate (cache_hit), the tuning sweep is skipped
# (`if not cache_hit: _run_flashinfer_autotune_dummy_runs(...)`, kernel_warmup.py 0.33:517-518,
# 0.34:623-624); 0.32 ran it over the loaded file (0.32:493), tuning only what it lacked. The
# sweep's passes: max_num_batched_tokens, then each deferred-MoE bound (0.33:318-343,
# 0.34:422-447), widened by a drafter's M (0.33:353-366, 0.34:459-471), each tuned at
# FlashInfer's hybrid buckets up to it (0.34:473; versions/tuning.py).
VLLM_SWEEP_SKIPPED_ON_HIT = V("0.33.0")
# A read-only cache dir fails vLLM's start where it writes the file whatever it loaded: 0.25/0.26
# rewrite it after loading (kernel_warmup.py 0.25:204, 0.26:263), 0.27-0.31 every rank rewrites
# it before loading (0.27:280 ... 0.31:451). 0.32/0.33 save only after tuning something (0.32
# :503-504, 0.33 :531-532): fully warm, they survive; 0.33's v2 store always does (FlashInfer
# logs the failed write and goes on, autotune_cache.py 0.7.2.post1 :359-386).
READ_ONLY_FAILS = VersionRange(V("0.25.0"), V("0.32.0"), "kernel_warmup.py 0.25-0.31")
# The persistent cache is used only with world size 1 (no log line says so).
CACHE_SINGLE_RANK_ONLY = VersionRange(V("0.25.0"), V("0.27.0"), "kernel_warmup.py 0.25-0.26")
# First vLLM with a persistent FlashInfer autotune cache at all.
VLLM_PERSISTENT_CACHE = V("0.25.0")
# Variables vLLM stopped reading in 0.24.0 (VLLM_USE_FLASHINFER_MOE_INT4 stayed): vllm/envs.py diff.
REMOVED_ENV_SINCE = V("0.24.0")
REMOVED_ENV_EXACT = frozenset(
    {
        "VLLM_USE_FLASHINFER_MOE_FP4",
        "VLLM_USE_FLASHINFER_MOE_FP8",
        "VLLM_USE_FLASHINFER_MOE_FP16",
        "VLLM_FLASHINFER_MOE_BACKEND",
    }
)
REMOVED_ENV_PREFIX = "VLLM_USE_FLASHINFER_MOE_MXFP4"
# Newest vLLM release checked for VLLM_FLASHINFER_MOE_FUSED_FINALIZE (absent in every one so far)
# and for every vLLM fact of this table (0.34.0 re-read in its wheel: the block below).
VLLM_NEWEST_CHECKED = V("0.34.0")

# --- vLLM 0.34 (read in the 0.33.0 and 0.34.0 wheels; tests/engines/vllm/test_vllm_034.py) ------
# Unchanged 0.33 -> 0.34, function source byte-identical: the v1/v2 choice
# (flashinfer_autotune_cache.py 0.34:78-110 use_flashinfer_autotune_v2), the rank file names
# (:56-75), sync_flashinfer_autotune_cache (:125) and the gate (kernel_warmup.py 0.34:494-532).
# Changed: the hash dir. 0.34 hashes vLLM's compile factors with vLLM's own hash_factors, the
# sha256 of their sorted JSON (flashinfer_autotune_cache.py 0.34:32-37, config/utils.py
# 0.34:416-418); 0.33 took the sha256 of compute_hash()'s 10-char md5 (0.33:32-38). Every hash
# dir of 0.33 is another dir on 0.34; fi-cache's prediction runs the release's own function.
VLLM_HASH_FROM_FACTORS = V("0.34.0")
# Both hash the source text of the IR-op implementations the default priority lists name
# (IrOpPriorityConfig "_impls": config/kernel.py 0.34:40-64, IrOpImpl.uuid = hash of
# inspect.getfile(impl) ir/op.py 0.34:627-638; CUDA's lists platforms/cuda.py 0.34:753-775,
# 0.33:712-734: vllm_c and native, oink first for rms norms under VLLM_USE_OINK_OPS, triton and
# native for gelu_and_mul_sparse). The files, relative to vLLM's site dir (0.32-0.34):
VLLM_IR_PROVIDER_FILES: tuple[str, ...] = (
    "vllm/ir/ops/activation.py",  # native gelu_and_mul_sparse
    "vllm/ir/ops/layernorm.py",  # native rms_norm, fused_add_rms_norm
    "vllm/kernels/oink_ops.py",
    "vllm/kernels/triton/activation.py",
    "vllm/kernels/vllm_c.py",
)
# The GPU worker sets cache_config.block_size from its attention backends before the hash
# (unless --block-size is given; for hybrid models always: mamba page alignment), and
# block_size is hashed (config/cache.py 0.34:418-461 does not ignore it):
# update_block_size_for_backend (platforms/interface.py 0.34:759-797, called by
# v1/executor/multiproc_executor.py 0.34:835-836, 0.33:801-802).
VLLM_BLOCK_SIZE_BY_WORKER = V("0.33.0")
# What is tuned, outside the hash: VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS (envs.py 0.34:1910-1917;
# set: exactly those ops skipped, empty: none) else the defaults of _flashinfer_autotune_skip_ops
# (kernel_warmup.py 0.34:398-419): 0.34's extensible KV cache (on unless unsupported:
# config/vllm.py 0.34:3190-3254; --[no-]enable-extensible-kv-cache) skips
# trtllm_batch_decode_mla (:406-410) and is not hashed (config/cache.py 0.34:458).
VLLM_SKIP_OPS_ENV = "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"
VLLM_SKIP_OPS = V("0.33.0")
VLLM_EXTENSIBLE_KV = V("0.34.0")
VLLM_EXTENSIBLE_KV_SKIPS = "trtllm_batch_decode_mla"
# 0.34 moved the GPU model runner: vllm/v1/worker/gpu_model_runner.py is gone, the runner is
# vllm/v1/worker/gpu/model_runner.py (flashinfer_autotune_cache.py 0.34:18).
VLLM_GPU_RUNNER_MOVED = V("0.34.0")
# 0.34 pins FlashInfer exactly (METADATA Requires-Dist: flashinfer-python==0.7.3; 0.33:
# ==0.7.2.post1); PyPI has 0.7.2.post1 and 0.7.4 but no 0.7.3, so `pip install vllm==0.34.0`
# cannot resolve and every 0.34 runs a FlashInfer other than its pin.
VLLM_FLASHINFER_PINS: dict[Version, str] = {V("0.33.0"): "0.7.2.post1", V("0.34.0"): "0.7.3"}
FLASHINFER_NOT_ON_PYPI = frozenset({"0.7.3"})
# model_config.is_moe: the first of these present in the HF text config above 0
# (transformers_utils/config.py 0.34:65-70 CONFIG_FIELD_ALIASES["num_experts"], read by
# model_arch_config_convertor.py 0.34:179-190), else a "moe" block of block_configs (:159-177).
VLLM_EXPERT_FIELDS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")

# MoE keys carry tp_rank, ep_rank and cluster_rank (MoERunner.get_cache_key_extras, 20 fields:
# fused_moe/core.py 0.6.18:707-736, 0.7.1:770-799) until 0.7.2rc3 dropped them (17 fields,
# core.py 0.7.2rc3:770-800, 0.7.2.post1:750-780: "ranks that tune together must share persisted
# entries"); 0.7.2rc1/rc2 are not on PyPI. Each rank of a sharded model needs its own entries there.
MOE_KEY_HAS_RANKS = VersionRange(
    V("0.6.18rc2"),
    V("0.7.2rc3"),
    "fused_moe/core.py 0.6.18:707-736, 0.7.1:770-799; none in 0.7.2:770-800",
)  # SGLang passes them: layers/moe/moe_runner/flashinfer_cutlass.py 0.5.21:321-324


# --- Unfused MoE finalize on vLLM: how a (vLLM, FlashInfer) pair reaches it -----------------------
# Three routes, decided by `unfused_route` (docs/serving.md "Deterministic MoE finalize"):
# - "env": the vLLM reads VLLM_FLASHINFER_MOE_FUSED_FINALIZE (PR #54948 builds; no release yet)
#   and passes use_fused_finalize= to FlashInfer itself.
# - "plugin": FlashInfer >= 0.7.4 and a vLLM that passes no use_fused_finalize. FlashInfer 0.7.4's
#   cutlass_fused_moe takes `use_fused_finalize: Optional[bool] = None` and then runs unfused when
#   torch.are_deterministic_algorithms_enabled() (flashinfer/fused_moe/core.py 0.7.4:1572,
#   1811-1812; cutlass_fused_moe_workspace_size alike :1986, 2037-2038), so fi-cache's vLLM general
#   plugin (fi_cache/engines/vllm/plugin/) turns torch's deterministic algorithms on in every
#   vLLM process. vLLM's FlashInfer CUTLASS experts call it without the flag
#   (model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py 0.32.0:365-389,
#   0.33.0:365-389, 0.34.0:372-396; no `use_fused_finalize` outside models/flint in any of the
#   three). vLLM loads `vllm.general_plugins` in the API server, the engine core and every
#   worker (v1/worker/worker_base.py 0.32.0:276, 0.33.0:289, 0.34.0:305; v1/engine/core.py
#   0.32.0:129, 0.34.0:149), only those named in VLLM_PLUGINS when it is set (a plain
#   comma split: envs.py 0.34.0:1232-1236; plugins/__init__.py 0.32.0-0.34.0:64).
# - "impossible": FlashInfer < 0.7.4 (`use_fused_finalize: bool = True`, core.py
#   0.7.2.post1:1309; 0.7.3 not checked), or a vLLM that passes use_fused_finalize but does not
#   read the variable.
FLASHINFER_FINALIZE_FOLLOWS_TORCH = V("0.7.4")
# Releases whose flashinfer_cutlass_moe.py was read: none passes use_fused_finalize.
VLLM_NO_FINALIZE_ARG_CHECKED = frozenset({V("0.32.0"), V("0.33.0"), V("0.34.0")})
# The file that calls FlashInfer's CUTLASS MoE (fused_moe/experts/ from 0.32), read at launch.
VLLM_CUTLASS_MOE_FILE = "flashinfer_cutlass_moe.py"
VLLM_CUTLASS_MOE_DIR = "vllm/model_executor/layers/fused_moe"
FINALIZE_ARG = "use_fused_finalize"
# fi-cache's plugin: its entry point name (what VLLM_PLUGINS must name) and its switch.
PLUGIN_NAME = "fi_cache_deterministic"
PLUGIN_ENV = "FI_CACHE_DETERMINISTIC"  # "1": warn-only; "strict": torch raises
# torch refuses deterministic cuBLAS without it (torch docs, use_deterministic_algorithms).
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE_DEFAULT = ":4096:8"

UnfusedRoute = Literal["env", "plugin", "impossible"]


def unfused_route(
    reads_env: bool | None, flashinfer: str | None, passes_arg: bool | None
) -> tuple[UnfusedRoute | None, str]:
    """How a vLLM start reaches unfused finalize, and why; None: cannot tell. `reads_env`: its
    envs.py names VLLM_FLASHINFER_MOE_FUSED_FINALIZE; `passes_arg`: its CUTLASS MoE call passes
    use_fused_finalize (None: not known)."""
    if reads_env:
        return "env", f"vLLM reads {VLLM_FINALIZE_ENV}"
    # Not knowing whether it reads the variable, a vLLM the plugin cannot reach may still.
    out: UnfusedRoute | None = "impossible" if reads_env is False else None
    if passes_arg:
        return out, f"this vLLM passes {FINALIZE_ARG} to FlashInfer itself"
    fi = parse_version(flashinfer)
    if fi is None:
        return None, "no FlashInfer version to judge"
    if fi < FLASHINFER_FINALIZE_FOLLOWS_TORCH:
        return out, (
            f"FlashInfer {fi} runs fused finalize whatever torch's deterministic mode; "
            f"{FLASHINFER_FINALIZE_FOLLOWS_TORCH}+ follows it"
        )
    if passes_arg is None:
        return None, f"cannot read this vLLM's {VLLM_CUTLASS_MOE_FILE}"
    return "plugin", (
        f"FlashInfer {fi} runs unfused finalize under torch's deterministic algorithms, which "
        "fi-cache's vLLM plugin turns on"
    )


def vllm_passes_finalize_arg(version: str | None) -> bool | None:
    """From the table alone (no vLLM to read): False for the releases checked, else None."""
    v = parse_version(version)
    return False if v in VLLM_NO_FINALIZE_ARG_CHECKED else None


from fi_cache.versions.sglang import *  # noqa: E402, F403  (one import path for every fact)

# --- vLLM 0.34's shared tier (`vllm preload --warmup-cache-stores mooncake`): versions/tier.py --
from fi_cache.versions.tier import *  # noqa: E402, F403  (the Mooncake keys and their rules)
from fi_cache.versions.tuning import *  # noqa: E402, F403  (what FlashInfer's tuner looks up)
