"""The union of v1 files from one environment: the pure core of `fi-cache merge`, of seeding
and of `fi-cache align` (data in, data out; maintenance/merge.py reads and writes the files).

Entries conflict when runner or tactic (value[:2]) differ; each conflict is reported with the
file that kept and the file that lost it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fi_cache.errors import CorruptCache, Refused
from fi_cache.model import v1
from fi_cache.model.moe import gemm_stage
from fi_cache.versions import RECORDS_KEY, flashinfer_writes_generation

Prefer = Literal["first", "last"]
PREFER_CHOICES: tuple[Prefer, ...] = ("first", "last")


@dataclass(frozen=True)
class Conflict:
    """One key with two different values: `kept` (by the policy) and `dropped`.
    `key` is the raw entry key, `_records.<namespace>` or an unknown top-level field name."""

    key: str
    kept: Any
    dropped: Any
    kept_from: str
    dropped_from: str


@dataclass(frozen=True)
class MergeResult:
    """The merged file, every conflict, and how many keys each source added first."""

    file: v1.CacheFile
    conflicts: list[Conflict]
    sources: int
    entries: int
    added: dict[str, int]


def merge(files: Sequence[tuple[str, v1.CacheFile]], prefer: Prefer = "first") -> MergeResult:
    """Union of `(name, file)` pairs with equal `_metadata`; raises Refused otherwise.

    Entries conflict when runner or tactic (value[:2]) differ. Values that agree on both but
    differ in extra elements (0.7.4 provenance, selection timings) are not conflicts: those
    are measurements that differ on every run, not a disagreement about which kernel to use;
    the preferred file's value is kept whole. `_records` (per namespace key) and unknown
    top-level fields are unioned with the same policy and their clashes reported too.
    """
    if not files:
        raise ValueError("merge needs at least one file")
    check_metadata(files)
    entries, conflicts, added = _union(
        [(name, cf.entries) for name, cf in files], prefer, _same_choice, str
    )
    records, record_conflicts, _ = _union(
        [(name, _records_of(name, cf)) for name, cf in files],
        prefer,
        operator.eq,
        lambda key: f"{RECORDS_KEY}.{key}",
    )
    unknown, unknown_conflicts, _ = _union(
        [(name, cf.unknown) for name, cf in files], prefer, operator.eq, str
    )
    metadata = files[0][1].metadata
    has_records = any(cf.records is not None for _, cf in files)
    merged = v1.CacheFile(
        None if metadata is None else dict(metadata),
        entries,
        records if has_records else None,
        None,
        unknown,
    )
    if wants_generation(files):
        merged = dataclasses.replace(merged, generation=v1.compute_generation(merged))
    return MergeResult(
        merged,
        [*conflicts, *record_conflicts, *unknown_conflicts],
        len(files),
        len(entries),
        added,
    )


@dataclass(frozen=True)
class FinalizeConflicts:
    """Conflicts on MoE keys that cannot say their finalize mode (FlashInfer <= 0.6.17): GEMM2
    ids differ between the modes, GEMM1 ids do not, so GEMM2-only conflicts mean the sources
    were tuned in different modes; merged, one mode replays the other's ids."""

    gemm2: int
    gemm1: int


def finalize_conflicts(conflicts: Sequence[Conflict]) -> FinalizeConflicts:
    counts = {1: 0, 2: 0}
    for c in conflicts:
        entry = v1.moe_entry(c.key)
        if entry is not None and entry[1] == "unknown" and (stage := gemm_stage(entry[0])):
            counts[stage] += 1
    return FinalizeConflicts(counts[2], counts[1])


# What verify calls corrupt: a value or key the loader crashes on, and `_records` that the
# FlashInfer <= 0.6.17 the file's _metadata names reads as an entry and crashes on.
_UNLOADABLE = frozenset({"corrupt-file", "records-unreadable"})


def unloadable(cf: v1.CacheFile) -> str | None:
    """The first defect `fi-cache verify` calls corrupt in `cf` (a value FlashInfer's loader
    crashes on, a key that does not parse, ...), or None. Every writer (merge, align, evict)
    refuses such a file: rewritten or joined, it would spread what the loader cannot read.
    A stale `_generation` is no defect here: the writers recompute it."""
    plain = dataclasses.replace(cf, generation=None)  # hashing is the costly part
    found = (d for d in v1.defects(plain, limit=1) if d.check in _UNLOADABLE)
    defect = next(found, None)
    return None if defect is None else defect.message


def check_metadata(files: Sequence[tuple[str, v1.CacheFile]]) -> None:
    """Raise Refused (exit 2: input refused, neither file is wrong) naming the first differing
    field when `_metadata` is not equal."""
    if not files:
        return
    base_name, base = files[0]
    for name, cf in files[1:]:
        if cf.metadata != base.metadata:
            why = _first_difference(base_name, base.metadata, name, cf.metadata)
            raise Refused(
                f"cannot merge {base_name} and {name}: {why} (merge only joins files "
                "from one environment; FlashInfer would skip one of them)"
            )


def _first_difference(
    a_name: str, a: dict[str, Any] | None, b_name: str, b: dict[str, Any] | None
) -> str:
    if a is None or b is None:
        return f"{b_name if b is None else a_name} has no _metadata"
    for field in [*a, *(k for k in b if k not in a)]:
        va, vb = a.get(field, _MISSING), b.get(field, _MISSING)
        if va != vb:
            return f"_metadata {field} is {_show(va)} vs {_show(vb)}"
    return "_metadata differs"  # unreachable for unequal dicts


_MISSING = object()


def _show(value: Any) -> str:
    return "missing" if value is _MISSING else repr(value)


def wants_generation(files: Sequence[tuple[str, v1.CacheFile]]) -> bool:
    """Does the merged file get a `_generation`? Decided by the format of the FlashInfer that
    wrote the files (>= 0.6.18rc2: a 0.6.17 reader would load it as a bogus entry); when
    `_metadata` cannot say (missing, "unknown", "*"), by whether any source has one."""
    metadata = files[0][1].metadata or {}
    version = metadata.get("flashinfer_version")
    writes = flashinfer_writes_generation(version if isinstance(version, str) else None)
    if writes is not None:
        return writes
    return any(cf.generation is not None for _, cf in files)


def _records_of(name: str, cf: v1.CacheFile) -> Mapping[str, Any]:
    if cf.records is None:
        return {}
    if not isinstance(cf.records, dict):
        raise CorruptCache(f"{RECORDS_KEY} is not a JSON object", name)
    return cf.records


def _choice(value: Any) -> Any:
    """What FlashInfer acts on: runner and tactic; later elements are measurement data."""
    return value[:2] if isinstance(value, list) else value


def _same_choice(a: Any, b: Any) -> bool:
    return bool(_choice(a) == _choice(b))


def _union(
    tables: Sequence[tuple[str, Mapping[str, Any]]],
    prefer: Prefer,
    same: Callable[[Any, Any], bool],
    label: Callable[[str], str],
) -> tuple[dict[str, Any], list[Conflict], dict[str, int]]:
    """Union of the tables in order; a key seen twice keeps the first or last holder's value.
    Only keys more than one table holds get per-key objects (their holders, looked up again)."""
    merged: dict[str, Any] = {}
    shared: dict[str, None] = {}  # keys seen again, in the order they were: conflicts' order
    added: dict[str, int] = {}
    for name, table in tables:
        before = len(merged)
        for key, value in table.items():
            if key in merged:
                shared[key] = None
            else:
                merged[key] = value
        added[name] = added.get(name, 0) + len(merged) - before
    conflicts: list[Conflict] = []
    for key in shared:
        candidates = [(name, table[key]) for name, table in tables if key in table]
        winner = candidates[0] if prefer == "first" else candidates[-1]
        merged[key] = winner[1]
        values = [value for _, value in candidates]
        if values.count(winner[1]) == len(values):
            continue  # every holder agrees (an aligned deployment's ranks): nothing to compare
        conflicts.extend(_disagreements(label(key), winner, candidates, same))
    return merged, conflicts, added


def _disagreements(
    key: str,
    winner: tuple[str, Any],
    candidates: list[tuple[str, Any]],
    same: Callable[[Any, Any], bool],
) -> Iterator[Conflict]:
    """One conflict per distinct losing value (16 ranks that agree on it are one line, not 16),
    named after the first file that had it."""
    reported: list[Any] = [winner[1]]
    for name, value in candidates:
        if any(same(value, seen) for seen in reported):
            continue
        reported.append(value)
        yield Conflict(key, winner[1], value, winner[0], name)
