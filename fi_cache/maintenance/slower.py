"""Evict the entries `fi-cache bench` found slower than FlashInfer's default, so that FlashInfer
runs its default for them: each through evict's own plan/apply (the store's one writer), and only
where evict's selector takes that entry alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.maintenance import evict
from fi_cache.model import v1
from fi_cache.tuning.report import EntryResult


@dataclass(frozen=True)
class Eviction:
    result: EntryResult
    keys: tuple[str, ...]  # what evict takes for it (this entry; never another)
    why_not: str = ""  # set when it cannot be taken alone


def plan_evictions(cf: v1.CacheFile, results: Sequence[EntryResult]) -> list[Eviction]:
    """For each entry slower than the default, evict's selector for it, kept only when it takes
    that entry and nothing else (another key of the same op, bucket, runner and tactic)."""
    out = []
    for r in results:
        if r.kind != "slower":
            continue
        if not isinstance(r.tactic, int) or r.bucket is None:
            out.append(Eviction(r, (), "evict cannot name this entry alone (its tactic or bucket)"))
            continue
        taken = evict.select(cf, _selector(r))
        if taken != (r.key,):
            out.append(Eviction(r, taken, f"evict's selector would take {len(taken)} entries"))
        else:
            out.append(Eviction(r, taken))
    return out


def _selector(r: EntryResult) -> evict.Selector:
    assert isinstance(r.tactic, int)
    return evict.Selector(op=r.op, bucket=r.bucket, runner=r.runner, tactic=r.tactic)


def apply_evictions(
    cache_path: Path, planned: Sequence[Eviction], store: Path
) -> list[evict.FilePlan]:
    """Evict each planned entry through evict.apply (locks, atomic write, manifest record)."""
    done = []
    for e in planned:
        if e.keys and not e.why_not:
            done += evict.apply([cache_path], _selector(e.result), store)
    return done
