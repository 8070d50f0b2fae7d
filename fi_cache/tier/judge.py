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
    # the engine's unanimity gate over the ranks of one hash dir (0.32+): tables of one config
    # that disagree make every engine start re-tune all ranks, and the tier never hears of it
    "vllm-ranks-retune",
    "ranks-divergent-tactics",
)
NEVER_REPLACED = "vLLM never replaces it: first writer wins, and nothing in vLLM removes a key"


def _who(target: Target) -> str:
    gpu = target.fingerprint.gpu
    return f"every {gpu.removeprefix('NVIDIA ')}" if gpu else "every"


# What the fleet does with a table each check flags ("{who}": every daemon, of the GPU when
# known); a check not named here finds a table daemons adopt as it is.
_CONSEQUENCES = {
    "foreign-environment": "{who} daemon on a fresh node rejects it by `_metadata` and tunes from "
    "scratch (its own publish is a no-op: the tier never helps it); " + NEVER_REPLACED,
    "stale-gemm2-profile": "{who} daemon on a fresh node adopts it (its `_metadata` fits) and "
    "replays GEMM2 ids of the other finalize mode: `Invalid gemm2 profile id` crashes start-up "
    "fleet-wide; " + NEVER_REPLACED,
    "finalize-mode-miss": "{who} daemon on a fresh node adopts it, every rank hits, so vLLM 0.33+ "
    "skips the sweep and MoE runs FlashInfer's fallback tactic fleet-wide; " + NEVER_REPLACED,
    "vllm-ranks-retune": "a fresh node's daemons adopt these tables rank by rank, fail vLLM's "
    "gate and tune every rank again (their publish is a no-op: the tier keeps these); "
    + NEVER_REPLACED.replace("it:", "them:"),
    "records-unreadable": "{who} daemon on a fresh node adopts it (nothing checks `_records`) "
    "and FlashInfer crashes loading it; " + NEVER_REPLACED,
    "corrupt-file": "{who} daemon on a fresh node rejects it and tunes from scratch (the tier "
    "never helps it); " + NEVER_REPLACED,
}
_ADOPTED = "{who} daemon on a fresh node adopts it as it is; " + NEVER_REPLACED


def consequence(f: Finding, target: Target) -> str:
    """One line: what the fleet does with this table, for as long as the key holds it. A daemon
    adopts only where it has no local file (a fresh node, warmup_cache.py 0.34:147-169); a
    rejected table leaves it to tune itself, and its publish is then a no-op."""
    return _CONSEQUENCES.get(f.check, _ADOPTED).format(who=_who(target))


def remedy(key_url: str) -> str:
    if not key_url.endswith(".json"):  # a hash dir: every rank key of one config
        return (
            f"fi-cache evict {key_url}/ --dry-run, then without --dry-run (or push --replace "
            "an aligned namespace); the next deployment's daemons publish one set again"
        )
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
    # the file-side fixes (align, move aside) do not reach the tier: its own remedy does
    fix = remedy(path) if severity != "info" and path else f.fix
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


def bad_keys(findings: Iterable[Finding], inv: TierInventory) -> list[str]:
    """The keys doctor --fix removes: those with an error (a table the fleet cannot use); for a
    hash dir's finding, every key read under it."""
    read = [SCHEME + str(c.path) for c in inv.caches] + [SCHEME + str(p.path) for p in inv.problems]
    out: list[str] = []
    for f in findings:
        if f.severity != "error" or not f.path:
            continue
        keys = (
            [f.path]
            if f.path.endswith(".json")
            else [k for k in read if k.startswith(f.path + "/")]
        )
        out.extend(k for k in keys if k not in out)
    return out
