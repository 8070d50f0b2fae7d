"""Checks over an SGLang target (`doctor --sglang-version V [-- SGLANG_ARGS]`): docs/sglang.md."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import CacheView, Check, Inputs
from fi_cache.engines.sglang.args import env_bool
from fi_cache.engines.sglang.layout import effective
from fi_cache.engines.sglang.live import sharing
from fi_cache.model import v1
from fi_cache.versions import (
    CUTEDSL_KEY_HAS_FINALIZE,
    CUTEDSL_NVFP4_RUNNER,
    SGLANG_AUTOTUNE_CACHE_ENV,
    SGLANG_DETERMINISTIC_SKIPS_TUNE,
    SGLANG_FINALIZE_ENV,
    SGLANG_FINALIZE_FROM,
    SGLANG_NEWEST_CHECKED,
    SGLANG_RANK_DIGEST,
    parse_version,
)


def _version(inp: Inputs) -> str:
    return f"SGLang {inp.target.sglang_version}"


def ep_cache_discarded(inp: Inputs) -> Iterator[Finding]:
    """0.5.19+: TP ranks that disagree all delete their file; EP ranks never agree (#40320)."""
    v, args = parse_version(inp.target.sglang_version), inp.sglang
    if v not in SGLANG_RANK_DIGEST or args is None or args.ep <= 1 or args.tp <= 1:
        return
    cache_off = env_bool(effective(inp.environ, SGLANG_AUTOTUNE_CACHE_ENV)) is False
    if cache_off or args.autotune_disabled:
        return  # no cache read, nothing compared
    yield Finding(
        "sglang-ep-cache-discarded",
        "warning",
        None,
        f"{_version(inp)} with --ep-size {args.ep} and --tp-size {args.tp}: every TP rank hashes "
        "its cache file and environment and, when they differ, all delete their file; expert-"
        "parallel ranks tune different shapes, so the cache is discarded on every boot and "
        "autotune runs in full each time (sglang issue #40320, fix in PR #40420 unreleased)",
        "expect full tuning time at every start; a warm cannot help until SGLang fixes this",
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
        "SGLang 0.5.19+, expert parallel with TP > 1: the cache is deleted every boot",
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
)


def _deployments(inp: Inputs) -> dict[tuple[str | None, str | None, str], list[CacheView]]:
    """SGLang rank files (not runs/ copies) by deployment: FlashInfer dir, arch dir, key hash.
    Copies of one deployment from several nodes (PATHs given) land in one group."""
    out: dict[tuple[str | None, str | None, str], list[CacheView]] = {}
    for view in inp.caches:
        f = view.cache.found
        if f.layout == "sglang" and f.key_dir is not None and f.run is None:
            out.setdefault((f.dir_version, f.arch, f.key_dir), []).append(view)
    return out


def _differing(metas: list[dict[str, Any]]) -> list[str]:
    fields = sorted({k for m in metas for k in m})
    return [k for k in fields if len({json.dumps(m.get(k), sort_keys=True) for m in metas}) > 1]


def _content(view: CacheView) -> str:
    f = view.cache.file
    return json.dumps([f.metadata, f.entries, f.reserved], sort_keys=True, default=str)


def ranks_disagree(inp: Inputs) -> Iterator[Finding]:
    """Rank files of one deployment written in different environments (any release), or, for
    0.5.19+, TP ranks whose files differ: SGLang deletes them all at start."""
    v = parse_version(inp.target.sglang_version)
    for (_, _, key), views in sorted(_deployments(inp).items(), key=lambda kv: kv[0][2]):
        if len(views) < 2:
            continue
        where = str(views[0].cache.path.parent)
        names = sorted({vw.cache.path.name for vw in views})
        differ = _differing([vw.cache.file.metadata or {} for vw in views])
        if differ:
            yield Finding(
                "sglang-ranks-disagree",
                "warning",
                where,
                f"the {len(views)} rank files of deployment {key} were written in different "
                f"environments ({', '.join(differ)} differ): FlashInfer skips a file whose "
                "`_metadata` does not match the start that reads it, so some ranks tune afresh",
                "tune every rank of a deployment on the same stack (CUDA, torch, FlashInfer, "
                "GPU), or delete the odd files",
                {"deployment": key, "files": names, "fields": differ},
            )
            continue
        if v not in SGLANG_RANK_DIGEST:
            continue
        # One TP group per (pp, dp), or per pp under --enable-dp-attention, where the TP group
        # spans the DP ranks (managers/data_parallel_controller.py 0.5.23:717-743).
        spans_dp = inp.sglang is not None and inp.sglang.dp_attention
        by_group: dict[tuple[int, ...], set[str]] = {}
        for vw in views:
            rank = vw.cache.found.rank or (0, 0, 0)
            by_group.setdefault(rank[1:2] if spans_dp else rank[1:], set()).add(_content(vw))
        split = [g for g, contents in by_group.items() if len(contents) > 1]
        if not split:
            continue
        yield Finding(
            "sglang-ranks-disagree",
            "warning",
            where,
            f"SGLang {inp.target.sglang_version} compares its TP ranks' files at every start "
            f"and deletes them all when they differ (flashinfer_autotune.py 0.5.19:209-246); "
            f"the TP ranks of deployment {key} hold different files, so the next start "
            "discards this cache and tunes from scratch (under expert parallelism they never "
            "agree: sglang issue #40320)",
            "expect full tuning at the next start; copy or warm all ranks together, and do not "
            "mix files from separate runs",
            {"deployment": key, "files": names},
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
        n = sum(k is not None and k.runner == CUTEDSL_NVFP4_RUNNER
                for _, k, _ in v1.iter_entries(view.cache.file))  # fmt: skip
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
        "sglang-ranks-disagree",
        "SGLang rank files of one deployment from different environments, or TP ranks that "
        "differ (0.5.19+ deletes them all at start)",
        ranks_disagree,
    ),
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
