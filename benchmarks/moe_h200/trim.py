"""A bf16-only TEST BUILD of FlashInfer's own SM90 CUTLASS fused-MoE module (`fused_moe_90`).

FlashInfer JIT-compiles `fused_moe_90` from 182 CUDA translation units on first use (about 45 min
on 16 cores), almost all of them for other dtypes. This script builds only what bf16 x bf16 needs,
from the installed FlashInfer's own sources and its own kernel generator (about 41 units, 6-7 min):
the same kernels and the same tactic lists as the stock module (the lists come from
`MoeGemmRunner::getConfigs`, not from what was compiled). Results measured with it are results of
a TEST BUILD and are quoted as such. What differs from the stock module:
  - the binding's runner constructor builds only the bf16 x bf16 runner, and the runner
    instantiation file keeps only bf16 (plus the three finalize-routing instantiations);
  - generated kernels: only bf16 x bf16 (SM90 TMA warp-specialized and SM80 fused-gated
    launchers, same generator), regrouped GROUP per file;
  - `-DENABLE_FP8_BLOCK_SCALE` is dropped (read only inside fp8_blockscale_gemm.cu, a runner bf16
    never uses, which becomes a stub).

    python trim.py sources FLASHINFER_PKG_DIR OUT_DIR [GROUP]   # no torch or CUDA needed
    python trim.py ninja OUT_DIR                                # with FlashInfer importable

`sources` writes the two patched sources beside FlashInfer's own and the generated kernels into
OUT_DIR; `ninja` asks FlashInfer for its full `fused_moe_90` JitSpec (flags, includes, link line),
swaps in the trimmed source list, writes build.ninja and prints a JSON summary (the .so it builds
and the AOT path where FlashInfer looks for a prebuilt module). Works for FlashInfer 0.6.17 and
0.6.18 (0.6.18's constructor also defines a `make_humming_runner` lambda, cut with the rest).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
from pathlib import Path

BINDING = "flashinfer_cutlass_fused_moe_binding.cu"
INSTANTIATION = "cutlass_fused_moe_instantiation.cu"
_KEEP_COMMENT = (
    "    // keep consistent with "
    "cpp/tensorrt_llm/plugins/mixtureOfExperts/mixtureOfExpertsPlugin.cpp"
)
_HUMMING = "    auto make_humming_runner = [&] {"  # FlashInfer 0.6.18+
_RUNNER_IF = "    if (!mKernelRunner) {"


def _binding_bf16(src: str) -> str:
    start = src.index(_HUMMING) if _HUMMING in src else src.index(_KEEP_COMMENT)
    assert src.count(_RUNNER_IF) == 1
    end = src.index(_RUNNER_IF)
    block = (
        "    // fi-cache test build: only the bf16 x bf16 runner (the class the full module picks\n"
        "    // for bf16 activations and weights; other dtypes are not built).\n"
        "    if (mActivationDtype == dl_bfloat16 && mWeightDtype == dl_bfloat16) {\n"
        "      mKernelRunner = std::make_shared<kernels::CutlassMoeFCRunner<__nv_bfloat16, "
        "__nv_bfloat16>>();\n"
        "    }\n"
    )
    patched = src[:start] + block + src[end:]
    assert "make_humming_runner" not in patched
    return patched


def _instantiation_bf16(src: str) -> str:
    head = src[: src.index("namespace tensorrt_llm::kernels::cutlass_kernels {")]
    return (
        head
        + """namespace tensorrt_llm::kernels::cutlass_kernels {
// fi-cache test build: bf16 x bf16 only (the full file also has float, half, fp8, fp4, int).
#ifdef ENABLE_BF16
template class CutlassMoeFCRunner<__nv_bfloat16, __nv_bfloat16>;
#endif
INSTANTIATE_FINALIZE_MOE_ROUTING(half, half, half);
INSTANTIATE_FINALIZE_MOE_ROUTING(float, float, float);
#ifdef ENABLE_BF16
INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);
#endif
}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""
    )


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def sources(pkg: Path, out: Path, group: int) -> list[Path]:
    cb = pkg / "data" / "csrc" / "fused_moe" / "cutlass_backend"
    (cb / "flashinfer_cutlass_fused_moe_binding_bf16.cu").write_text(
        _binding_bf16((cb / BINDING).read_text())
    )
    (cb / "cutlass_fused_moe_instantiation_bf16.cu").write_text(
        _instantiation_bf16((cb / INSTANTIATION).read_text())
    )
    # FlashInfer's own kernel generator, loaded without importing flashinfer (no torch needed).
    stubs = ["flashinfer", "flashinfer.jit", "flashinfer.jit.gemm", "flashinfer.jit.gemm.cutlass"]
    for name in stubs:
        stub = types.ModuleType(name)
        stub.__path__ = []  # type: ignore[attr-defined]
        sys.modules.setdefault(name, stub)
    cpp = types.ModuleType("flashinfer.jit.cpp_ext")
    cpp.is_cuda_version_at_least = lambda v: True  # type: ignore[attr-defined]  # nvcc 13.0 there
    sys.modules["flashinfer.jit.cpp_ext"] = cpp
    gdir = pkg / "jit" / "gemm" / "cutlass"
    cl = _load("flashinfer.jit.gemm.cutlass.cutlass_library", gdir / "cutlass_library.py")
    gk = _load("flashinfer.jit.gemm.cutlass.generate_kernels", gdir / "generate_kernels.py")
    bf16 = cl.DataType.bf16
    sm90 = [
        op
        for op in gk.generate_sm90_grouped_gemm_operations(True)
        if op.act_type == bf16 and op.weight_type == bf16
    ]
    sm80 = [op for op in gk.generate_sm80_operations(True) if op.dtype == bf16]
    launchers = "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/"
    files = []
    for ops, sub, inl, tag in [
        (sm90, "gemm_grouped/90", launchers + "moe_gemm_tma_ws_launcher.inl", "sm90"),
        (sm80, "gemm_grouped/80", launchers + "fused_moe_gemm_launcher_sm80.inl", "sm80"),
    ]:
        for i in range(0, len(ops), group):
            f = out / sub / f"trim_bf16_{tag}_group{i // group}.generated.cu"
            f.parent.mkdir(parents=True, exist_ok=True)
            gk.write_file([inl], ops[i : i + group], str(f))
            files.append(f)
    print(f"# bf16 ops: sm90 {len(sm90)}, sm80 {len(sm80)}; {len(files)} files", file=sys.stderr)
    return files


_KEEP_STATIC = {
    "moe_gemm_tma_warp_specialized_input.cu",
    "moe_gemm_kernels_bf16_bf16.cu",
    "fp8_blockscale_gemm.cu",
    "moe_gemm_mixed_utils.cu",
    "deepgemm_jit_setup.cu",
    "envUtils.cpp",
    "logger.cpp",
    "stringUtils.cpp",
    "tllmException.cpp",
    "memoryUtils.cu",
    "preQuantScaleKernel.cu",
    "cutlass_heuristic.cpp",
    "lora.cpp",
}


def ninja(trimgen: Path, name: str = "fused_moe_90_trim_bf16") -> dict[str, object]:
    from flashinfer.jit import env as jit_env
    from flashinfer.jit import fused_moe as jfm
    from flashinfer.jit.cpp_ext import get_cuda_path

    full = jfm.gen_cutlass_fused_moe_sm90_module()
    cb = jit_env.FLASHINFER_CSRC_DIR / "fused_moe" / "cutlass_backend"
    static = [p for p in full.sources if p.name in _KEEP_STATIC]
    assert len(static) == len(_KEEP_STATIC), sorted(_KEEP_STATIC - {p.name for p in static})
    gen = sorted(trimgen.rglob("*.generated.cu"))
    heavy = [p for p in static if p.name == "moe_gemm_kernels_bf16_bf16.cu"]
    light = [p for p in static if p not in heavy]
    srcs = (  # heaviest first: ninja starts edges roughly in manifest order
        [cb / "cutlass_fused_moe_instantiation_bf16.cu", *heavy]
        + [p for p in gen if "sm90" in p.name]
        + [cb / "flashinfer_cutlass_fused_moe_binding_bf16.cu"]
        + [p for p in gen if "sm80" in p.name]
        + light
    )
    for p in srcs:
        assert p.exists(), p
    cuda_flags = [f for f in full.extra_cuda_cflags if f and f != "-DENABLE_FP8_BLOCK_SCALE"]
    cflags, ldflags = list(full.extra_cflags or []), list(full.extra_ldflags or [])
    # The machine's CUDA may lack headers/libraries that torch's nvidia-* wheels carry.
    cuda_home = Path(get_cuda_path())
    nv = [Path(p) / "nvidia" / "cu13" for p in sys.path if (Path(p) / "nvidia" / "cu13").is_dir()]
    notes, extra_inc = [], set()
    for hdr in ["cublasLt.h", "curand_kernel.h", "nvrtc.h"]:
        if not (cuda_home / "include" / hdr).exists():
            found = [d for d in nv if (d / "include" / hdr).exists()]
            using = f"; using {found[0]}" if found else ""
            notes.append(f"{hdr} missing in {cuda_home}/include{using}")
            if found:
                extra_inc.add(f"-isystem {found[0] / 'include'}")
    cuda_flags += sorted(extra_inc)
    cflags += sorted(extra_inc)
    if not any((cuda_home / d / "libnvrtc.so").exists() for d in ["lib64", "lib"]):
        libs = [p for d in nv for p in sorted((d / "lib").glob("libnvrtc.so*"))]
        libs = [p for p in libs if "builtins" not in p.name and "alt" not in p.name]
        if libs:
            ldflags = [f for f in ldflags if f != "-lnvrtc"]
            ldflags += [str(libs[0]), f"-Wl,-rpath,{libs[0].parent}"]
            notes.append(f"libnvrtc.so missing in {cuda_home}; linking {libs[0]}")
    spec = dataclasses.replace(
        full,
        name=name,
        sources=srcs,
        extra_cuda_cflags=cuda_flags,
        extra_cflags=cflags,
        extra_ldflags=ldflags,
        extra_include_dirs=[*(full.extra_include_dirs or []), trimgen],
    )
    spec.write_ninja()
    return {
        "ninja": str(spec.ninja_path),
        "so": str(spec.jit_library_path),
        "aot_target": str(jit_env.FLASHINFER_AOT_DIR / "fused_moe_90" / "fused_moe_90.so"),
        "n_tu": len(srcs),
        "n_tu_full": len(full.sources),
        "notes": notes,
    }


if __name__ == "__main__":
    if sys.argv[1] == "sources":
        group = int(sys.argv[4]) if len(sys.argv) > 4 else 4
        for f in sources(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), group):
            print(f)
    elif sys.argv[1] == "ninja":
        print(json.dumps(ninja(Path(sys.argv[2]).resolve()), indent=1))
    else:
        sys.exit(__doc__)
