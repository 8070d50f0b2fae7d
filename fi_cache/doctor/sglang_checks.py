"""Checks over an SGLang target (`doctor --sglang-version V [-- SGLANG_ARGS]`): docs/sglang.md."""

from __future__ import annotations

from collections.abc import Iterator

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, Inputs
from fi_cache.engines.sglang.args import env_bool
from fi_cache.engines.sglang.layout import effective, rank_layout
from fi_cache.engines.sglang.live import sharing
from fi_cache.model import v1
from fi_cache.versions import (
    CUTEDSL_KEY_HAS_FINALIZE,
    CUTEDSL_NVFP4_RUNNER,
    MOE_KEY_HAS_RANKS,
    SGLANG_AUTOTUNE_CACHE_ENV,
    SGLANG_DETERMINISTIC_SKIPS_TUNE,
    SGLANG_FINALIZE_ENV,
    SGLANG_FINALIZE_FROM,
    SGLANG_FLASHINFER_PIN,
    SGLANG_NEWEST_CHECKED,
    SGLANG_RANK_DIGEST,
    parse_version,
)


def _version(inp: Inputs) -> str:
    return f"SGLang {inp.target.sglang_version}"


def _flashinfer(inp: Inputs, v: str) -> str | None:
    """The FlashInfer the target runs: given or detected, else the one the release pins."""
    return inp.target.fingerprint.flashinfer_version or SGLANG_FLASHINFER_PIN.get(v)


def ep_cache_discarded(inp: Inputs) -> Iterator[Finding]:
    """0.5.19+: TP ranks whose files differ all delete them at start. With FlashInfer
    0.6.18rc2-0.7.1 the CUTLASS MoE keys carry tp_rank and ep_rank (SGLang passes both), so the
    files a TP group writes never agree: the cache is lost at every boot, EP or not (#40320)."""
    version, args = inp.target.sglang_version, inp.sglang
    v = parse_version(version)
    if version is None or v not in SGLANG_RANK_DIGEST or args is None or args.tp <= 1:
        return
    cache_off = env_bool(effective(inp.environ, SGLANG_AUTOTUNE_CACHE_ENV)) is False
    if cache_off or args.autotune_disabled:
        return  # no cache read, nothing compared
    fi = _flashinfer(inp, version)
    ranked = parse_version(fi) in MOE_KEY_HAS_RANKS
    cutlass = args.moe_backend == "flashinfer_cutlass"
    if not ranked or not (cutlass or args.ep > 1):
        return  # FlashInfer 0.7.2+ keys carry no rank, and 0.5.19+ tunes the group together
    why = "expert-parallel" if args.ep > 1 else "tensor-parallel"
    yield Finding(
        "sglang-ep-cache-discarded",
        "warning",
        None,
        f"{_version(inp)} with FlashInfer {fi}, --tp-size {args.tp}"
        + (f" and --ep-size {args.ep}" if args.ep > 1 else "")
        + f": FlashInfer puts each rank's tp_rank and ep_rank into its CUTLASS MoE keys "
        f"({MOE_KEY_HAS_RANKS.source}), so the {why} ranks' files never "
        "agree, and SGLang deletes every rank's file when they differ: upstream, the cache is "
        "discarded at every boot and autotune runs in full each time (sglang #40320, PR #40420 "
        "unreleased)",
        "warm through `fi-cache warm --engine sglang` (or run `fi-cache align KEY_DIR` after a "
        "start): every rank then holds the same file, each rank's keys in it, and SGLang keeps "
        "it; FlashInfer 0.7.2+ (SGLang 0.5.23's pin) keys carry no rank",
        {"flashinfer_version": fi, "tp": args.tp, "ep": args.ep},
    )


def rank_files(inp: Inputs) -> Iterator[Finding]:
    """Which rank files SGLang's schedulers on this node write for `-- ARGS` (info)."""
    if inp.sglang is None or not inp.sglang.argv:
        return
    layout = rank_layout(inp.sglang)
    node = [f"rank_{r}.json" for r in layout.node]
    shown = ", ".join(node[:8]) + (f" and {len(node) - 8} more" if len(node) > 8 else "")
    args = inp.sglang
    nodes = f" on node {args.node_rank} of {args.nnodes}" if args.nnodes > 1 else ""
    yield Finding(
        "sglang-rank-files",
        "info",
        None,
        f"{_version(inp)} with these arguments writes {len(layout.ranks)} rank files per "
        f"deployment, {len(node)}{nodes}: {shown}; known only on the GPU worker: "
        f"{'; '.join(layout.on_worker)}",
        "-",
        {"ranks": list(layout.ranks), "node": node, "on_worker": list(layout.on_worker)},
    )


def finalize_not_read(inp: Inputs) -> Iterator[Finding]:
    """The variable set for a release that does not read it (before 0.5.18)."""
    v = parse_version(inp.target.sglang_version)
    said = effective(inp.environ, SGLANG_FINALIZE_ENV)
    if v is None or v >= SGLANG_FINALIZE_FROM or said is None:
        return
    yield Finding(
        "sglang-finalize-unsupported",
        "warning",
        None,
        f"{_version(inp)} does not read {SGLANG_FINALIZE_ENV} (it appears in 0.5.18): "
        "MoE runs FlashInfer's default finalize whatever it says",
        "upgrade to SGLang 0.5.18+ to choose the finalize mode",
    )


def nothing_tuned(inp: Inputs) -> Iterator[Finding]:
    v, args = parse_version(inp.target.sglang_version), inp.sglang
    if v is not None and v > SGLANG_NEWEST_CHECKED:
        yield Finding(
            "sglang-nothing-tuned",
            "info",
            None,
            f"{_version(inp)} is newer than the newest release checked, {SGLANG_NEWEST_CHECKED}: "
            "these checks follow that release",
            "-",
        )
    if args is None or v is None:
        return
    if args.deterministic and v >= SGLANG_DETERMINISTIC_SKIPS_TUNE:
        yield Finding(
            "sglang-nothing-tuned",
            "info",
            None,
            f"{_version(inp)} with --enable-deterministic-inference skips FlashInfer autotuning "
            "(and runs unfused finalize): no cache is read or written",
            "-",
        )


_RELEASE_CHECKS = (
    Check(
        "sglang-ep-cache-discarded",
        "SGLang 0.5.19+ with TP > 1 and FlashInfer 0.6.18-0.7.1 (CUTLASS MoE, or expert "
        "parallel): rank-keyed files never agree, the cache is deleted every boot",
        ep_cache_discarded,
    ),
    Check(
        "sglang-finalize-unsupported",
        f"{SGLANG_FINALIZE_ENV} set for SGLang < 0.5.18, which ignores it",
        finalize_not_read,
    ),
    Check(
        "sglang-nothing-tuned",
        "SGLang 0.5.18+ deterministic inference tunes nothing (info)",
        nothing_tuned,
    ),
    Check(
        "sglang-rank-files",
        "the rank files SGLang writes for `-- ARGS`, per node (info)",
        rank_files,
    ),
)


def cutedsl_mode_blind(inp: Inputs) -> Iterator[Finding]:
    """CuTe-DSL NVFP4 entries of FlashInfer < 0.7.1, whose keys lack the finalize mode, where
    nothing says they were tuned in the mode the target runs."""
    for view in inp.caches:
        if not view.applies or view.cache.found.layout != "sglang":
            continue
        fi = view.cache.found.dir_version or (view.cache.file.metadata or {}).get(
            "flashinfer_version"
        )
        fv = parse_version(fi)
        if fv is None or fv >= CUTEDSL_KEY_HAS_FINALIZE:
            continue
        n = sum(
            k is not None and k.runner == CUTEDSL_NVFP4_RUNNER
            for _, k, _ in v1.iter_entries(view.cache.file)
        )
        if not n or view.namespace_finalize == inp.target.finalize:
            continue  # a fi-cache namespace of the target's mode tuned them in that mode
        tuned = (
            f"were tuned {view.namespace_finalize} (their namespace)"
            if view.namespace_finalize
            else "may have been tuned in either mode (SGLang 0.5.19-0.5.20 default to fused, "
            "0.5.21+ to unfused)"
        )
        yield Finding(
            "sglang-cutedsl-mode-blind",
            "warning",
            str(view.cache.path),
            f"{n} CuTe-DSL NVFP4 MoE entries ({CUTEDSL_NVFP4_RUNNER}): FlashInfer {fi}'s keys "
            "for them do not carry the finalize mode, nor does SGLang's path, so the target's "
            f"{inp.target.finalize} start replays them as they are; they {tuned}",
            "delete this rank file before starting in the other mode (or after upgrading "
            "0.5.20 -> 0.5.21), or start SGLang through `fi-cache serve --engine sglang`, which "
            "gives each mode a namespace of its own",
            {"entries": n, "flashinfer_version": fi},
        )


def shared_cache_dir(inp: Inputs) -> Iterator[Finding]:
    """Two SGLang servers, or a running one and a start from here, on one cache dir and GPUs
    that can overlap, one of them with MegaMoE (the backend whose files need one writer)."""
    live = list(inp.sglang_live)
    for i, a in enumerate(live):
        for b in sharing(live[i + 1 :], a.cache_dir, a.devices, a.backend):
            yield Finding(
                "sglang-shared-cache-dir",
                "warning",
                a.cache_dir,
                f"SGLang servers pid {a.pid} (GPUs {a.gpus}, {a.backend or 'auto'}) and pid "
                f"{b.pid} (GPUs {b.gpus}, {b.backend or 'auto'}) share this SGLANG_CACHE_DIR: "
                f"{_SHARED_WHY}",
                _SHARED_FIX,
                {"pids": [a.pid, b.pid]},
            )
    if inp.sglang_here is None:
        return
    cache_dir, gpus = inp.sglang_here
    mine = inp.sglang.moe_backend if inp.sglang else None
    for e in sharing(live, cache_dir, gpus, mine):
        shown = ",".join(sorted(gpus)) if gpus is not None else "all"
        yield Finding(
            "sglang-shared-cache-dir",
            "warning",
            e.cache_dir,
            f"SGLang pid {e.pid} runs on GPUs {e.gpus} ({e.backend or 'auto'}) with this "
            f"SGLANG_CACHE_DIR, and an SGLang started from here (GPUs {shown}, {mine or 'auto'}) "
            f"would use it too: {_SHARED_WHY}",
            _SHARED_FIX,
            {"pids": [e.pid]},
        )


_SHARED_WHY = (
    "with --moe-runner-backend flashinfer_megamoe SGLang names rank files by the physical GPU and "
    "their records need one writer per file, so engines sharing GPUs must use separate "
    "SGLANG_CACHE_DIRs (flashinfer_autotune.py 0.5.22:176-189; other tactics merge best-effort)"
)
_SHARED_FIX = (
    "give each server its own SGLANG_CACHE_DIR, or its own GPUs (CUDA_VISIBLE_DEVICES); "
    "`fi-cache serve --engine sglang` warns when it would start a second one"
)


CHECKS: tuple[Check, ...] = (
    *_RELEASE_CHECKS,
    Check(
        "sglang-cutedsl-mode-blind",
        "CuTe-DSL NVFP4 entries of FlashInfer < 0.7.1 replayed in either finalize mode",
        cutedsl_mode_blind,
    ),
    Check(
        "sglang-shared-cache-dir",
        "Two SGLang servers on one SGLANG_CACHE_DIR and the same GPUs, one with MegaMoE",
        shared_cache_dir,
    ),
)
