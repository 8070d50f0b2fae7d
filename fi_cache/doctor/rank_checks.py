"""Checks over a deployment's rank files, modelled on each engine's own rule (ranks/agreement.py):
vLLM 0.32+'s unanimity gate, and ranks that answer one rank-free key with different tactics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, Inputs
from fi_cache.ranks.agreement import RankFile, divergent_tactics, partial_hits, vllm_gate
from fi_cache.ranks.align import CannotAlign, align
from fi_cache.ranks.deployment import Deployment, gather
from fi_cache.versions import VLLM_RANK_GATE, parse_version


def _deployments(inp: Inputs) -> list[Deployment]:
    """With `-- ARGS`, vLLM's own answer names every rank of the deployment."""
    where = inp.location
    expected = None
    if where is not None and where.dir and where.store == "v1" and where.all_files:
        ranks = [Path(f).stem.removeprefix("autotune_configs_") for f in where.all_files]
        expected = {Path(where.dir).name: [r for r in ranks if r.startswith("dp")]}
    return gather([v.cache for v in inp.caches if v.applies], expected=expected)


def _where(dep: Deployment) -> str:
    more = len(dep.copies) - 1
    return str(dep.copies[0]) + (f" (+{more} copies)" if more else "")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _align_hint(dep: Deployment) -> str:
    return "fi-cache align " + " ".join(str(c) for c in dep.copies)


def _cure(dep: Deployment, group: list[RankFile]) -> str:
    """align's answer for this group: the command, or why it cannot help."""
    try:
        align(group)
    except CannotAlign as exc:
        return exc.message[0].upper() + exc.message[1:]
    return (
        f"`{_align_hint(dep)}` gives every rank the union of their entries (a cold node's "
        "empty hash dir given as a PATH too is filled)"
    )


def _partial(dep: Deployment, group: list[RankFile]) -> Iterator[Finding]:
    short = partial_hits(group)
    if not short:
        return
    shown = ", ".join(f"{r} ({n})" for r, n in list(short.items())[:6])
    yield Finding(
        "vllm-ranks-partial-hit",
        "warning",
        _where(dep),
        f"the rank files pass vLLM's gate (equal _metadata and entry counts) but hold "
        f"different keys: {shown} lack keys other ranks have, so those ranks miss where the "
        "others hit (vLLM 0.32 then profiles them alone inside the tune group's collectives: "
        "the hang of vllm #57423; 0.33 runs FlashInfer's fallback tactic)",
        _cure(dep, group),
        {"deployment": dep.key, "short": short},
    )


def vllm_ranks_retune(inp: Inputs) -> Iterator[Finding]:
    """A vLLM 0.32+ tune group whose files fail the gate: every rank of it tunes again."""
    if inp.target.sglang_version:
        return
    version = parse_version(inp.target.vllm_version)
    if version is not None and version not in VLLM_RANK_GATE:
        return
    for dep in _deployments(inp):
        if dep.engine != "vllm":
            continue
        for group in dep.groups():
            verdict = vllm_gate(group)
            if verdict.loads:
                yield from _partial(dep, group)
                continue
            if len(group) < 2 and not verdict.missing:
                continue
            inferred = [r for r in verdict.missing if r in dep.inferred]
            yield Finding(
                "vllm-ranks-retune",
                "warning",
                _where(dep),
                f"vLLM loads these rank files only when every rank of the tune group has one "
                f"with equal _metadata and entry count ({VLLM_RANK_GATE.source}); "
                f"{verdict.reason()}, so at the next start all {len(group)} ranks tune again"
                + (f" (missing inferred from the other ranks' names: {', '.join(inferred)})"
                   if inferred else ""),
                _cure(dep, group),
                {"deployment": dep.key, "ranks": list(verdict.ranks),
                 "missing": list(verdict.missing), "metadata": verdict.metadata,
                 "counts": verdict.counts},
            )  # fmt: skip


def ranks_divergent_tactics(inp: Inputs) -> Iterator[Finding]:
    """Ranks of one deployment that hold different tactics for one rank-free key."""
    for dep in _deployments(inp):
        for group in dep.groups():
            found = divergent_tactics(group)
            if not found:
                continue
            ops = sorted({d.op for d in found})
            yield Finding(
                "ranks-divergent-tactics",
                "warning",
                _where(dep),
                f"{_count(len(found), 'shape is', 'shapes are')} answered with different kernels "
                "on different ranks "
                f"({', '.join(ops[:4])}{', …' if len(ops) > 4 else ''}): ranks that run one "
                "collective with different tactics can diverge or hang (sglang #35343, vllm "
                "#54618)",
                f"`{_align_hint(dep)}` keeps the lowest rank's tactic on every rank and says "
                "which it chose",
                {"deployment": dep.key, "keys": [d.key for d in found[:20]], "count": len(found)},
            )


CHECKS: tuple[Check, ...] = (
    Check(
        "vllm-ranks-retune",
        "vLLM 0.32+ rank files that fail its unanimity gate (every rank tunes again), or pass "
        "it with different keys (vllm-ranks-partial-hit)",
        vllm_ranks_retune,
    ),
    Check(
        "ranks-divergent-tactics",
        "Ranks of one deployment with different tactics for one rank-free key",
        ranks_divergent_tactics,
    ),
)
