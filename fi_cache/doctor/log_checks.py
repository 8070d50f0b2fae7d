"""Checks over vLLM/FlashInfer logs: the gemm crash, ignored caches, what was loaded and saved."""

from __future__ import annotations

from collections.abc import Iterator

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.fix import quarantine_text
from fi_cache.doctor.inputs import Check, Inputs
from fi_cache.doctor.logs import ProfileIdError
from fi_cache.model.moe import is_moe


def log_profile_id(inp: Inputs) -> Iterator[Finding]:
    """One finding per process that hit the error: a server's start-up dies at the first; a
    process that caught it and went on (a sweep, a test) is one finding, not one per call."""
    serve = "fi-cache serve --engine sglang" if inp.target.sglang_version else "fi-cache serve"
    for log in inp.logs:
        by_process: dict[str, list[ProfileIdError]] = {}
        for e in log.errors:
            by_process.setdefault(e.process, []).append(e)
        for errors in by_process.values():
            e = errors[0]
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
            if len(errors) == 1:
                what = f"start-up died with `Invalid gemm{e.gemm} profile id: {e.tactic_id}`"
            else:
                ids = sorted({x.tactic_id for x in errors})
                what = (
                    f"{len(errors)} calls failed with `Invalid gemm{e.gemm} profile id` (ids "
                    f"{', '.join(map(str, ids))}, last at line {errors[-1].line_no}); this "
                    "process caught them and went on, a server's start-up dies at the first"
                )
            cache = e.last_loaded
            if cache is None:
                move = "find the cache that start loaded and move it aside"
            else:
                move = quarantine_text(
                    inp,
                    cache,
                    "move that cache aside (doctor --fix moves only caches it read: name it as a "
                    f"PATH too, `fi-cache doctor --log {log.path} {cache} --fix`)",
                )
            yield Finding(
                "stale-gemm2-profile",
                "error",
                cache or log.path,
                f"{log.path}:{e.line_no}: {what} {source}: {why}",
                f"{move}; give each finalize mode its own cache dir ({serve}, and "
                f"{serve} --deterministic for unfused)",
            )


def log_fallbacks(inp: Inputs) -> Iterator[Finding]:
    """FlashInfer ran its fallback tactic for MoE calls it found no entry for. Its message
    blames the bucket range; on 0.6.18+ a cache tuned only in the other finalize mode misses
    the same way (an H200 run: 0 of 12 buckets hit, both GEMMs, tactic -1 everywhere)."""
    for log in inp.logs:
        moe = [f for f in log.fallbacks if is_moe(f.op)]
        if not moe:
            continue
        yield Finding(
            "finalize-mode-miss",
            "warning",
            log.path,
            f"{log.path}:{moe[0].line_no}: {len(moe)} MoE calls found no tuned entry and ran "
            f"FlashInfer's fallback tactic {moe[0].tactic} (untuned kernels). FlashInfer's message "
            "blames the bucket range; a cache tuned only in the other MoE finalize mode (keys "
            "carry the mode from FlashInfer 0.6.18) misses the same way",
            "check the cache the log loaded: `fi-cache doctor CACHE --finalize MODE`; warm this "
            "mode into its own namespace (fi-cache warm --finalize MODE)",
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


def log_start_failed(inp: Inputs) -> Iterator[Finding]:
    """vLLM's last line says "See root cause above": name that cause (the first exception in
    the log, often 100+ lines up in a worker's output). A gemm crash is its own finding."""
    for log in inp.logs:
        cause = log.root_cause
        if cause is None or log.errors:
            continue
        who = f" (pid {cause.process})" if cause.process else ""
        yield Finding(
            "start-failed",
            "error",
            log.path,
            f"the start failed; root cause at line {cause.line_no}{who}: {cause.text}",
            "fix what the root cause names (not an autotune cache problem), then start again",
            {"line": cause.line_no, "root_cause": cause.text},
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
        elif not log.from_tools:
            what = (
                "it is empty"
                if log.lines == 0
                else f"{log.lines} lines, none from vLLM or FlashInfer"
            )
            yield Finding(
                "log-summary",
                "warning",
                log.path,
                f"no vLLM, SGLang or FlashInfer output in {log.path} ({what}): nothing here to "
                "explain (the wrong file, or a log cut before vLLM started?)",
                "pass the output of the vLLM start that failed, e.g. `kubectl logs POD > "
                "vllm.log` or `vllm serve ... 2>&1 | tee vllm.log`",
            )
        elif not (log.events or log.errors or log.fallbacks):
            yield Finding(
                "log-summary",
                "info",
                log.path,
                f"vLLM/FlashInfer output ({log.lines} lines), but no autotune cache was loaded or "
                "saved and no tuning ran (autotune off, a vLLM that keeps no cache, or the log "
                "ends before warm-up)",
                "-",
            )


CHECKS = (
    # Same ids as the cache checks: their summaries there mention the log half.
    Check("stale-gemm2-profile", "", log_profile_id),
    Check("foreign-environment", "", log_ignored),
    Check("finalize-mode-miss", "", log_fallbacks),
    Check(
        "start-failed",
        "a log whose start failed (vLLM: `See root cause above`): the root cause, found (error)",
        log_start_failed,
    ),
    Check(
        "log-summary",
        "which caches a log loaded and saved, how long tuning took (info)",
        log_summary,
    ),
)
