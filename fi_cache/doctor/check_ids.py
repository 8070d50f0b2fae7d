"""Every id a finding can carry, declared once, with the severities it comes in and one line
on what it means: `doctor --list-checks` lists them, `doctor --check ID` selects any of them,
and tests/doctor/test_check_ids.py holds every Finding in the package to them.

A check's own id takes its summary from the check (doctor/*_checks.py); the ids a check emits
beside its own are declared where it emits them (rank_checks.EMITS); a finding from outside the
checks (the `vllm preload` wrapper's, tier/preload.py) is declared here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fi_cache.doctor.inputs import Check, CheckId

if TYPE_CHECKING:
    from fi_cache.doctor.findings import Severity

_E: Severity = "error"
_W: Severity = "warning"
_I: Severity = "info"


# The severities each check's findings come in (a check's several modules share its id).
SEVERITIES: dict[str, tuple[Severity, ...]] = {
    "corrupt-file": (_E,),
    "generation-mismatch": (_W,),
    "foreign-environment": (_E, _W, _I),
    "stale-gemm2-profile": (_E, _W, _I),
    "finalize-mode-miss": (_W,),
    "records-unreadable": (_E, _W),
    "unreadable-permissions": (_E, _W),  # error: a file the scan could not read
    "not-loaded": (_I,),
    "tmp-leftover": (_W, _I),
    "no-target": (_I,),
    "finalize-unsupported": (_E, _W, _I),
    "double-reduce": (_E,),
    "warm-cache-hang": (_W,),
    "cache-unused": (_I,),
    "removed-env": (_W,),
    "cache-location": (_I,),
    "tuning-scope": (_W, _I),
    "flashinfer-pin": (_I,),
    "sglang-ep-cache-discarded": (_W,),
    "sglang-finalize-unsupported": (_W,),
    "sglang-nothing-tuned": (_I,),
    "sglang-rank-files": (_I,),
    "sglang-cutedsl-mode-blind": (_W,),
    "sglang-shared-cache-dir": (_W,),
    "vllm-ranks-retune": (_W, _I),  # info: a stray rank number's note
    "sglang-ranks-disagree": (_W, _I),
    "ranks-divergent-tactics": (_W,),
    "start-failed": (_E,),
    "log-summary": (_W, _I),
    "sweep-gap": (_W,),
    "replaced-after-warm": (_W,),
}

# Findings doctor adds from outside its checks.
WRAPPERS = (
    CheckId(
        "vllm-preload",
        (_I,),
        "`-- vllm preload ARGS`: what its daemons do to the engine's files, and where to look "
        "(info)",
    ),
)


def declared(checks: tuple[Check, ...]) -> tuple[CheckId, ...]:
    """Every id, in `--list-checks` order: the checks' (a shared id's summaries joined), the
    ids they emit beside their own, the wrappers'."""
    from fi_cache.doctor import rank_checks

    summaries: dict[str, list[str]] = {}
    for c in checks:
        summaries.setdefault(c.id, []).extend([c.summary] if c.summary else [])
    # A check not in SEVERITIES yet is listed with all three (the tests hold the table whole).
    ids = [CheckId(k, SEVERITIES.get(k, (_E, _W, _I)), "; ".join(v)) for k, v in summaries.items()]
    return (*ids, *rank_checks.EMITS, *WRAPPERS)


def unknown(only: tuple[str, ...], checks: tuple[Check, ...]) -> list[str]:
    if not only:
        return []
    known = {c.id for c in declared(checks)}
    return [i for i in only if i not in known]
