"""Will the engine keep and hit a deployment's rank files? Each engine's own rule, over data.

vLLM 0.32+ (`_all_ranks_have_matching_cache`, kernel_warmup.py 0.32:394-401, 0.33:398-406):
every rank of the tune group reads its own file, and the cache is loaded only when every rank
has one with the same fingerprint, `(json.dumps(_metadata, sort_keys=True), number of other
top-level fields)`; otherwise every rank of the group tunes again.

SGLang 0.5.19+ (`_drop_diverged_autotune_cache`, flashinfer_autotune.py 0.5.19:228-246,
0.5.23:268-286): every rank of the TP group hashes its parsed file, re-dumped with sorted keys,
together with the environment it reads with (`_collect_metadata()`), all-gathers the digests
over the group's gloo group, and when any two differ every rank deletes its own file and the
group tunes from scratch: `sglang_digest`. The reading rank's environment is known only on its
GPU worker; fi-cache takes the ranks of one deployment to read with one stack.

Ranks that hold different tactics for one rank-free key run different kernels in one
collective: `divergent_tactics`.
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
    # SGLang: ranks whose content differs from the first rank's (metadata aside).
    differs: tuple[str, ...] = ()
    first: str | None = None  # the rank the others are compared with

    @property
    def reason_besides_missing(self) -> bool:
        """Whether the files present disagree too (not only some are missing)."""
        return bool(self.metadata or self.counts or self.differs)

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
        if self.differs:
            parts.append(f"the entries of {_names(self.differs)} differ from {self.first}'s")
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
    metadata: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for rf, (meta, count) in present[1:]:
        if meta != first_meta and rf.file is not None:
            metadata[rf.rank] = _metadata_diff(reference, rf.file)
        if count != first_count:
            counts[rf.rank] = count
    if counts:
        counts = {present[0][0].rank: first_count, **counts}
    loads = not missing and not metadata and not counts
    return Verdict(ranks, loads, missing, metadata, counts, first=present[0][0].rank)


def _metadata_diff(base: v1.CacheFile | None, other: v1.CacheFile) -> dict[str, Any]:
    """The `_metadata` fields where `other` differs from `base`, with `other`'s values."""
    mine, theirs = (base.metadata if base else None) or {}, other.metadata or {}
    keys = sorted(set(mine) | set(theirs))
    return {k: theirs.get(k) for k in keys if mine.get(k) != theirs.get(k)}


def sglang_content(cf: v1.CacheFile | None) -> str | None:
    """What SGLang's digest hashes of a rank's file, less the reader's environment: the parsed
    JSON object re-dumped with sorted keys (so layout and key order do not matter; `_metadata`,
    `_records`, `_generation` and every entry do). None for a missing or unreadable file,
    SGLang's "" digest."""
    if cf is None:
        return None
    return json.dumps(v1.as_json(cf), sort_keys=True)


def sglang_digest(group: Sequence[RankFile]) -> Verdict:
    """SGLang 0.5.19+'s decision for one TP group: `loads` when every rank holds the same
    content; else, unless every rank has none, every rank deletes its file (`missing` and
    `differs` say why). A group of one rank compares nothing (no sync group)."""
    ranks = tuple(rf.rank for rf in group)
    contents = [sglang_content(rf.file) for rf in group]
    if len(set(contents)) == 1:
        return Verdict(ranks, contents[0] is not None, ranks if contents[0] is None else ())
    missing = tuple(rf.rank for rf, c in zip(group, contents, strict=True) if c is None)
    present = [(rf, c) for rf, c in zip(group, contents, strict=True) if c is not None]
    first, first_content = present[0]
    metadata: dict[str, dict[str, Any]] = {}
    differs = []
    for rf, content in present[1:]:
        if content == first_content or rf.file is None:
            continue
        if rf.file.metadata != (first.file.metadata if first.file else None):
            metadata[rf.rank] = _metadata_diff(first.file, rf.file)
        else:
            differs.append(rf.rank)
    return Verdict(ranks, False, missing, metadata, {}, tuple(differs), first.rank)


def sglang_deletes(verdict: Verdict) -> bool:
    """Whether SGLang unlinks the group's files at the next start (some rank has one)."""
    return not verdict.loads and len(verdict.missing) < len(verdict.ranks)


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
