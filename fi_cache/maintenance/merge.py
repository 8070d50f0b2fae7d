"""`fi-cache merge`: the union of v1 files from one environment, written atomically under a lock.

Use case: vLLM 0.33 writes one file per rank, and FlashInfer advises one file per process;
merging them gives one cache a fresh start can load whole.

`merge` is pure (model/union.py); `merge_into` reads the files, holds OUT's lock across
the whole read-modify-write, and includes an existing OUT as the first source, so concurrent
merges into one OUT accumulate instead of overwriting each other. It refuses (nothing
written) what would make a cache worse than its sources: a source `fi-cache verify` rejects,
another environment, and files of FlashInfer <= 0.6.17 tuned in different MoE finalize modes
(unless allowed). `dry_run` computes the same report and writes nothing, no lock file either.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.caches import inventory
from fi_cache.caches.discover import classify_file, is_v2_env_dir
from fi_cache.errors import CorruptCache, FiCacheError, Refused
from fi_cache.model import v1, v2

# The pure core lives in model/union.py; these names are merge's API too.
from fi_cache.model.union import (
    PREFER_CHOICES,
    Conflict,
    FinalizeConflicts,
    MergeResult,
    Prefer,
    check_metadata,
    finalize_conflicts,
    merge,
    unloadable,
    wants_generation,
)
from fi_cache.store.files import DEFAULT_LOCK_TIMEOUT, atomic_write, locked, refuse_destination
from fi_cache.store.pin import refuse_if_pinned
from fi_cache.versions import FLASHINFER_FINALIZE_IN_KEY

__all__ = [
    "PREFER_CHOICES",
    "Conflict",
    "FinalizeConflicts",
    "MergeReport",
    "MergeResult",
    "Prefer",
    "check_metadata",
    "finalize_conflicts",
    "merge",
    "merge_into",
    "read_source",
    "refuse_mixed_finalize",
    "wants_generation",
]

# FlashInfer's own save mode is 0600; a merged file is usually shared between ranks or users.
DEFAULT_MODE = 0o644


# --- Files on disk ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeReport:
    """What `merge_into` did: the merged result and what it means for OUT."""

    output: Path
    result: MergeResult
    sources: int  # SRC files given (an existing OUT is merged too but not counted here)
    new: int  # entries OUT did not have before
    existed: bool  # OUT existed and was merged in as the first source
    dry_run: bool = False  # nothing was written: what a real merge would write

    @property
    def generation(self) -> bool:
        return self.result.file.generation is not None


def read_source(path: Path) -> v1.CacheFile:
    """A v1 file to merge. Refused (exit 2): missing, a directory, v2, not a cache at all;
    CorruptCache (exit 1): unreadable JSON, keys or values (merging would spread them)."""
    _refuse_non_v1(path)
    cf = inventory.read(classify_file(path)).file
    _check_usable(path, cf)
    return cf


def _refuse_non_v1(path: Path) -> None:
    if path.is_dir():
        v2_store = (
            is_v2_env_dir(path) or path.name == v2.SCHEMA_DIR or (path / v2.SCHEMA_DIR).is_dir()
        )
        why = "this is a FlashInfer v2 store" if v2_store else "this is a directory"
        raise Refused(f"merge takes v1 files; {why} (see `fi-cache ls` for the files in it)", path)
    in_v2 = (path.name == v2.MANIFEST and is_v2_env_dir(path.parent)) or (
        path.parent.name == v2.ENTRIES_DIR and is_v2_env_dir(path.parent.parent)
    )
    if in_v2:
        raise Refused("merge takes v1 files; this is part of a FlashInfer v2 store", path)


def _check_usable(path: Path, cf: v1.CacheFile) -> None:
    if cf.metadata is None and not cf.entries and cf.unknown:
        raise Refused("not a FlashInfer v1 cache file (no _metadata, no entries)", path)
    if (why := unloadable(cf)) is not None:
        raise CorruptCache(f"{why}; not merged (see `fi-cache verify`)", path)


def _read_existing(out: Path) -> tuple[v1.CacheFile, int] | None:
    """OUT's content and mode, or None when it does not exist. A corrupt OUT is refused
    (exit 1) and left untouched: overwriting it would lose whatever it still holds."""
    if not os.path.lexists(out):
        return None
    try:
        cf = read_source(out)
    except CorruptCache as exc:
        raise CorruptCache(
            f"{exc.message}; refusing to overwrite it (move it aside or pick another -o)", out
        ) from None
    return cf, stat.S_IMODE(out.stat().st_mode)


def refuse_mixed_finalize(result: MergeResult) -> None:
    """FiCacheError (exit 1) when MoE GEMM2 entries whose keys cannot say their finalize mode
    (FlashInfer <= 0.6.17) conflict: the sign of a fused and an unfused tune, whose union
    replays one mode's tactic ids in the other (doctor's stale-gemm2-profile)."""
    gemm2 = [c for c in result.conflicts if finalize_conflicts([c]).gemm2]
    if not gemm2:
        return
    first = gemm2[0]
    raise FiCacheError(
        f"cannot merge {first.kept_from} and {first.dropped_from}: {len(gemm2)} MoE GEMM2 "
        f"{'entry differs' if len(gemm2) == 1 else 'entries differ'} and their keys "
        f"(FlashInfer < {FLASHINFER_FINALIZE_IN_KEY}) cannot say their finalize mode: files "
        "tuned in different MoE finalize modes (fused and unfused), whose union crashes or runs "
        "other kernels (`Invalid gemm2 profile id`); nothing written: keep each mode in a cache "
        "of its own, or pass --allow-mixed-finalize if both were tuned in one mode"
    )


def merge_into(
    sources: Sequence[Path],
    out: Path,
    prefer: Prefer = "first",
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    store: Path | None = None,
    *,
    allow_mixed_finalize: bool = False,
    dry_run: bool = False,
) -> MergeReport:
    """Merge `sources` into `out` (created, or merged with what it holds). Nothing is written
    when anything is refused (OUT in a pinned namespace of `store` too, a directory that does
    not exist, finalize modes mixed unless allowed); readers of `out` see the old or the new
    file, never a mix. `dry_run`: the same report, nothing written, no lock taken."""
    files = [(str(p), read_source(p)) for p in sources]
    check_metadata(files)  # refuse before creating OUT's lock file
    # before its lock file is made: nothing written; a typo grows no directory tree (F14)
    refuse_destination(out, "cache file", parent_must_exist=True)
    if store is not None:  # a dry run too: it says what the real run would refuse
        refuse_if_pinned(out, store, "merge -o")
    with contextlib.nullcontext() if dry_run else locked(out, timeout):
        if store is not None and not dry_run:
            refuse_if_pinned(out, store, "merge -o")  # pinned while we waited for the lock
        existing = _read_existing(out)
        inputs = files if existing is None else [(str(out), existing[0]), *files]
        result = merge(inputs, prefer)
        if not allow_mixed_finalize:
            refuse_mixed_finalize(result)
        # A mode chosen for an existing OUT (FlashInfer's 0600, say) is the owner's to keep.
        mode = DEFAULT_MODE if existing is None else existing[1]
        if not dry_run:
            atomic_write(out, v1.dumps(result.file).encode(), mode=mode, lock=False)
    before = 0 if existing is None else len(existing[0].entries)
    return MergeReport(
        out, result, len(sources), result.entries - before, existing is not None, dry_run
    )
