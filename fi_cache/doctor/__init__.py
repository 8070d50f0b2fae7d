"""doctor: every check is a small pure function over `Inputs`, registered in CHECKS.

diagnose.py is the doctor as a library (`diagnose(Request) -> Diagnosis`): gather.py and
sources/ read the inputs (caches, logs, argv, environment), the checks judge them, and
check_ids.py declares every id a finding can carry. `fi-cache doctor` and serve's pre-flight
both ask diagnose; the checks never read files, and nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterable

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import CacheView, Check, Inputs, Target

__all__ = ["CacheView", "Check", "Inputs", "Target", "checks", "run", "run_checks"]


def _registry() -> tuple[Check, ...]:
    from fi_cache.doctor import (
        cache_checks,
        log_checks,
        rank_checks,
        replaced_checks,
        sglang_checks,
        sweep_checks,
        vllm_checks,
    )

    return (
        *cache_checks.CHECKS,
        *vllm_checks.CHECKS,
        *sglang_checks.CHECKS,
        *rank_checks.CHECKS,
        *log_checks.CHECKS,
        *sweep_checks.CHECKS,
        *replaced_checks.CHECKS,
    )


def _engine_checks() -> dict[str, set[str]]:
    """Check ids that only mean something for one engine."""
    from fi_cache.doctor import sglang_checks, sweep_checks, vllm_checks

    return {
        "vllm": {c.id for c in (*vllm_checks.CHECKS, *sweep_checks.CHECKS)},
        "sglang": {c.id for c in sglang_checks.CHECKS},
    }


def checks() -> tuple[Check, ...]:
    return _registry()


_ORDER = {"error": 0, "warning": 1, "info": 2}


def run(inputs: Inputs, only: Iterable[str] | None = None) -> list[Finding]:
    """Every finding of the selected ids (all by default), errors first: a check's id selects
    all that check finds, any other id (check_ids.py) the findings that carry it."""
    wanted = set(only) if only else None
    other = _engine_checks()["vllm" if inputs.target.sglang_version else "sglang"]
    # A vLLM check says nothing about an SGLang target, and back.
    selected = [c for c in checks() if c.id not in other]
    if wanted is None:
        return run_checks(inputs, selected)
    return _errors_first(
        f for c in selected for f in c.run(inputs) if c.id in wanted or f.check in wanted
    )


def run_checks(inputs: Inputs, selected: Iterable[Check]) -> list[Finding]:
    """The findings of these checks, errors first (serve's pre-flight names its few checks and
    imports only their modules)."""
    return _errors_first(f for check in selected for f in check.run(inputs))


def _errors_first(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (_ORDER[f.severity], f.check, f.path or ""))
