"""Checks over vLLM/FlashInfer logs: the gemm crash, ignored caches, what was loaded and saved."""

from __future__ import annotations

from collections.abc import Iterator

from fi_cache.doctor import Check, Inputs
from fi_cache.doctor.findings import Finding


def log_profile_id(inp: Inputs) -> Iterator[Finding]:
    for log in inp.logs:
        for e in log.errors:
            source = (
                f"after loading {e.last_loaded}"
                if e.last_loaded
                else "no `Loaded ... configs from` line names the cache"
            )
            why = (
                "the cache was tuned in the other MoE finalize mode"
                if e.gemm == 2
                else "the cache's GEMM1 ids do not fit this runner (finalize mode does not change "
                "GEMM1: another MoE configuration or FlashInfer build tuned it)"
            )
            yield Finding(
                "stale-gemm2-profile",
                "error",
                e.last_loaded or log.path,
                f"{log.path}:{e.line_no}: start-up died with `Invalid gemm{e.gemm} profile id: "
                f"{e.tactic_id}` {source}: {why}",
                "quarantine that cache (doctor --fix, or delete it) and give each finalize mode "
                "its own cache dir (fi-cache serve [--deterministic])",
            )


def log_ignored(inp: Inputs) -> Iterator[Finding]:
    for log in inp.logs:
        for e in log.events:
            if e.kind != "ignored":
                continue
            fields = ", ".join(f"{f}: saved {s!r} vs current {c!r}" for f, s, c in e.mismatches)
            if e.hard:
                yield Finding(
                    "foreign-environment",
                    "warning",
                    e.path,
                    f"{log.path}:{e.line_no}: FlashInfer ignored this cache ({fields}) and will "
                    "never overwrite it: that server re-tunes at every start",
                    "give each environment its own cache dir (fi-cache serve does)",
                )
            else:
                yield Finding(
                    "foreign-environment",
                    "info",
                    e.path,
                    f"{log.path}:{e.line_no}: FlashInfer ignored this cache (indeterminate "
                    f"environment: {fields}); the next save replaces it",
                    "nothing to do",
                )


def log_summary(inp: Inputs) -> Iterator[Finding]:
    for log in inp.logs:
        parts = []
        for kind in ("loaded", "saved"):
            files = sorted({e.path for e in log.events if e.kind == kind and e.path})
            if files:
                parts.append(f"{kind} {', '.join(files)}")
        if log.tuning_seconds:
            total = sum(log.tuning_seconds)
            parts.append(f"tuning took {total:.1f}s over {len(log.tuning_seconds)} run(s)")
        if parts:
            yield Finding("log-summary", "info", log.path, "; ".join(parts), "-")


CHECKS = (
    # Same ids as the cache checks: their summaries there mention the log half.
    Check("stale-gemm2-profile", "", log_profile_id),
    Check("foreign-environment", "", log_ignored),
    Check(
        "log-summary",
        "which caches a log loaded and saved, how long tuning took (info)",
        log_summary,
    ),
)
