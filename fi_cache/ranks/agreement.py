"""Will the engine keep and hit a deployment's rank files? Each engine's own rule, over data.

vLLM 0.32+ (`_all_ranks_have_matching_cache`, kernel_warmup.py 0.32:394-401, 0.33:398-406):
every rank of the tune group reads its own file, and the cache is loaded only when every rank
has one with the same fingerprint, `(json.dumps(_metadata, sort_keys=True), number of other
top-level fields)`; otherwise every rank of the group tunes again. SGLang's digest is in
sglang_digest below. Ranks that hold different tactics for one rank-free key run different
kernels in one collective: `divergent_tactics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fi_cache.model import v1
from fi_cache.ranks.keys import rank_free
from fi_cache.versions import GENERATION_KEY, RECORDS_KEY


@dataclass(frozen=True)
class RankFile:
    """One rank's file as the engine would find it: `file` None when it is missing or cannot be
    read as JSON (`problem` says which)."""

    rank: str  # the rank's name in the deployment, e.g. "dp1_rank2" or "tp0_pp0_dp0"
    path: str
    file: v1.CacheFile | None
    problem: str | None = None


Fingerprint = tuple[str, int]


def vllm_fingerprint(cf: v1.CacheFile | None) -> Fingerprint | None:
    """`_autotune_cache_fingerprint` over a parsed file: the metadata as vLLM dumps it and the
    count of every top-level field but `_metadata` (`_generation` and `_records` count too)."""
    if cf is None:
        return None
    extra = sum(1 for k in (RECORDS_KEY, GENERATION_KEY) if k in cf.reserved)
    return json.dumps(cf.metadata, sort_keys=True), len(cf.entries) + len(cf.unknown) + extra


@dataclass(frozen=True)
class Verdict:
    """One tune group's fate at the next start: `loads` True when every rank hits its file."""

    ranks: tuple[str, ...]
    loads: bool
    missing: tuple[str, ...] = ()
    # Ranks by what breaks agreement, each with the value it holds (metadata field or count).
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def reason(self) -> str:
        """One line: why the group re-tunes (empty when it loads)."""
        parts = []
        if self.missing:
            parts.append(f"no readable file for {_names(self.missing)}")
        if self.metadata:
            fields = sorted({f for diff in self.metadata.values() for f in diff})
            parts.append(f"_metadata differs ({', '.join(fields)}) on {_names(self.metadata)}")
        if self.counts:
            shown = ", ".join(f"{r}: {n}" for r, n in list(self.counts.items())[:6])
            parts.append(f"entry counts differ ({shown}{', …' if len(self.counts) > 6 else ''})")
        return "; ".join(parts)


def _names(ranks: Iterable[str]) -> str:
    listed = list(ranks)
    return ", ".join(listed[:6]) + (f" and {len(listed) - 6} more" if len(listed) > 6 else "")


def vllm_gate(group: Sequence[RankFile]) -> Verdict:
    """vLLM 0.32+'s decision for one tune group (the world group, or a stage's TP group)."""
    ranks = tuple(rf.rank for rf in group)
    prints = [vllm_fingerprint(rf.file) for rf in group]
    missing = tuple(rf.rank for rf, fp in zip(group, prints, strict=True) if fp is None)
    present = [(rf, fp) for rf, fp in zip(group, prints, strict=True) if fp is not None]
    if not present:
        return Verdict(ranks, False, missing)
    first_meta, first_count = present[0][1]
    reference = present[0][0].file
    base = (reference.metadata if reference else None) or {}
    metadata: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for rf, (meta, count) in present[1:]:
        if meta != first_meta and rf.file is not None:
            theirs = rf.file.metadata or {}
            metadata[rf.rank] = {
                k: theirs.get(k) for k in sorted(set(base) | set(theirs))
                if base.get(k) != theirs.get(k)
            }  # fmt: skip
        if count != first_count:
            counts[rf.rank] = count
    if counts:
        counts = {present[0][0].rank: first_count, **counts}
    loads = not missing and not metadata and not counts
    return Verdict(ranks, loads, missing, metadata, counts)


@dataclass(frozen=True)
class Divergence:
    """One rank-free key whose ranks hold different (runner, tactic) choices."""

    key: str  # the rank-free key
    op: str
    choices: dict[str, tuple[str, ...]]  # repr of [runner, tactic] -> ranks holding it


def divergent_tactics(group: Sequence[RankFile], limit: int | None = None) -> list[Divergence]:
    """Rank-free keys that two ranks answer differently (sglang #35343, vllm #54618): a
    collective whose ranks run different kernels can hang or diverge."""
    seen: dict[str, dict[str, list[str]]] = {}
    ops: dict[str, str] = {}
    for rf in group:
        if rf.file is None:
            continue
        for raw, value in rf.file.entries.items():
            free, _ = rank_free(raw)
            choice = json.dumps(value[:2] if isinstance(value, list) else value)
            seen.setdefault(free, {}).setdefault(choice, []).append(rf.rank)
            ops.setdefault(free, raw[2 : raw.find("'", 2)] if raw.startswith("('") else "?")
    out = [
        Divergence(key, ops[key], {c: tuple(r) for c, r in choices.items()})
        for key, choices in seen.items()
        if len(choices) > 1
    ]
    out.sort(key=lambda d: (d.op, d.key))
    return out if limit is None else out[:limit]


def partial_hits(group: Sequence[RankFile]) -> dict[str, int]:
    """Per rank, how many rank-free keys other ranks of the group hold and it does not. vLLM's
    gate counts entries, not keys: equal counts with other keys pass it, and then that rank
    misses where the others hit (0.32: it profiles alone inside the group's collectives)."""
    held: dict[str, set[str]] = {
        rf.rank: {rank_free(raw)[0] for raw in rf.file.entries}
        for rf in group
        if rf.file is not None
    }
    every = set().union(*held.values()) if held else set()
    return {rank: len(every - keys) for rank, keys in held.items() if every - keys}
