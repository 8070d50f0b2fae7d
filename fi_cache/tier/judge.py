"""doctor over tier keys: fi-cache's own cache checks (doctor/cache_checks.py) on the tables as
read, then what each finding means in a tier vLLM never cleans (first writer wins, no key ever
removed, warmup_cache.py 0.34:147-214) and the remedy fi-cache carries out: `evict` of the key.

In the tier, a hard or soft `_metadata` mismatch alike makes every daemon reject the table
(validate_payload joins both), re-tune, and publish nothing (the key is taken): both are errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from fi_cache.doctor import Inputs, run_checks
from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import CacheView, Target
from fi_cache.tier.keys import SCHEME
from fi_cache.tier.read import TierInventory

# The cache checks that judge one table's bytes against a target (no file system, logs, argv).
TIER_CHECKS = (
    "corrupt-file",
    "generation-mismatch",
    "foreign-environment",
    "stale-gemm2-profile",
    "finalize-mode-miss",
    "records-unreadable",
)
NEVER_REPLACED = "vLLM never replaces it: first writer wins, and nothing in vLLM removes a key"


def _who(target: Target) -> str:
    gpu = target.fingerprint.gpu
    return f"every {gpu.removeprefix('NVIDIA ')}" if gpu else "every daemon of the target"


def consequence(f: Finding, target: Target) -> str:
    """One line: what the fleet does with this table, for as long as the key holds it."""
    who = _who(target)
    if f.check == "foreign-environment":
        return f"{who} rejects it by `_metadata` and re-tunes at every start; {NEVER_REPLACED}"
    if f.check == "stale-gemm2-profile":
        return (
            f"{who} adopts it (its `_metadata` fits) and replays GEMM2 ids of the other "
            "finalize mode: `Invalid gemm2 profile id` crashes start-up fleet-wide; "
            + NEVER_REPLACED
        )
    if f.check == "finalize-mode-miss":
        return (
            f"{who} adopts it, every rank hits, so vLLM 0.33+ skips the sweep and MoE runs "
            f"FlashInfer's fallback tactic fleet-wide; {NEVER_REPLACED}"
        )
    if f.check in ("corrupt-file", "records-unreadable"):
        return f"{who} fails to load it and re-tunes at every start; {NEVER_REPLACED}"
    return f"{who} adopts it as it is; {NEVER_REPLACED}"


def remedy(key_url: str) -> str:
    return (
        f"fi-cache evict {key_url} --dry-run, then without --dry-run; the next daemon that "
        "tunes publishes its own table under the key"
    )


def _tiered(f: Finding, target: Target) -> Finding:
    path = SCHEME + f.path if f.path else None
    severity = f.severity
    if f.check == "foreign-environment":
        severity = "error"  # the daemon rejects soft mismatches too, and nothing heals the key
    if f.check == "finalize-mode-miss":
        severity = "error"  # adopted by every rank: the sweep that would heal it never runs
    fix = remedy(path) if severity == "error" and path else f.fix
    return replace(
        f, severity=severity, path=path, message=f"{f.message}. {consequence(f, target)}", fix=fix
    )


def judge(inv: TierInventory, target: Target, only: Iterable[str] | None = None) -> list[Finding]:
    """Every finding for the tables read, errors first, paths as `mooncake://KEY`."""
    from fi_cache.doctor import checks

    views = tuple(CacheView(c, defects=c.defects(), named=True) for c in inv.caches)
    inputs = Inputs(target=target, caches=views, problems=tuple(inv.problems))
    wanted = set(only or TIER_CHECKS) & set(TIER_CHECKS)
    selected = [c for c in checks() if c.id in wanted]
    return [_tiered(f, target) for f in run_checks(inputs, selected)]


def bad_keys(findings: Iterable[Finding]) -> list[str]:
    """The keys doctor --fix removes: those with an error (a table the fleet cannot use)."""
    out: list[str] = []
    for f in findings:
        if f.severity == "error" and f.path and f.path not in out:
            out.append(f.path)
    return out
