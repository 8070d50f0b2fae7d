"""`fi-cache evict PATH...`: drop chosen entries from v1 caches (a tactic that gives NaNs, a
bucket, an op) so the next start re-tunes only those, where today the cure is to delete the whole
file (sglang #34629). `plan` says what each file loses and writes nothing; `apply` locks each
file, plans again on what it reads under the lock, and writes it atomically with `_generation`
recomputed, so FlashInfer's own loader reads the result (tests/maintenance/test_evict.py runs
0.6.17, 0.6.18 and 0.7.2.post1's); namespaced `_records` (MegaMoE's) stay as they are. Give a
deployment's hash dir, not one rank's file: every rank
then loses the same entries and vLLM's gate (equal counts) still passes. A file inside a store
namespace is rewritten under the namespace's lock (a warm's engine writes there), and the
namespace's manifest records the evict: when, by which selector, which keys went from which file."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fi_cache.caches import inventory
from fi_cache.caches.discover import classify_file
from fi_cache.errors import CorruptCache, Refused
from fi_cache.model import keys as keymod
from fi_cache.model import v1
from fi_cache.model.union import unloadable
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store import pin as pins
from fi_cache.store.files import DEFAULT_LOCK_TIMEOUT, locked, replace_all
from fi_cache.store.manifest import EvictedFile, EvictRecord, Manifest
from fi_cache.store.namespace import namespace_parts


@dataclass(frozen=True)
class Selector:
    """Which entries go: all the given fields must match (at least one is given)."""

    op: str | None = None  # a part of the op's name ("gemm2", "fused_moe")
    bucket: int | None = None  # the tuned token count: the first input's first dimension
    runner: str | None = None
    tactic: int | None = None

    @property
    def empty(self) -> bool:
        return not self.given()

    def given(self) -> dict[str, str | int]:
        """The options given, by name (what a manifest records)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def matches(self, key: keymod.CacheKey | None, value: Any) -> bool:
        if key is None:
            return False  # a key that does not parse is verify's to report, not ours to drop
        if self.op is not None and self.op not in key.op:
            return False
        if self.runner is not None and self.runner != key.runner:
            return False
        if self.tactic is not None and not (
            isinstance(value, list) and len(value) > 1 and value[1] == self.tactic
        ):
            return False
        return self.bucket is None or _bucket(key) == self.bucket


def _bucket(key: keymod.CacheKey) -> int | None:
    view = keymod.to_json(key.profile)
    if isinstance(view, list) and view and isinstance(view[0], list) and view[0]:
        first = view[0][0]
        return first if isinstance(first, int) else None
    return None


@dataclass(frozen=True)
class FilePlan:
    path: Path
    evicted: tuple[str, ...]  # the raw keys that go
    kept: int
    namespace: Path | None = None  # the store namespace holding the file
    recorded: bool = False  # its manifest records the evict (apply, a namespace with a manifest)
    # (st_dev, st_ino) of the file's dir when planned: apply rewrites only in that dir
    dir_id: tuple[int, int] | None = None


def select(cf: v1.CacheFile, selector: Selector) -> tuple[str, ...]:
    """The raw keys of `cf` the selector picks, in file order."""
    return tuple(raw for raw, key, value in v1.iter_entries(cf) if selector.matches(key, value))


def _files(paths: Sequence[Path]) -> list[Path]:
    """Every v1 cache under `paths` (SGLang's write-only runs/ copies aside: never read back)."""
    inv = inventory.scan(paths)
    if inv.problems:
        raise inv.problems[0].error()
    files = sorted({c.path for c in inv.caches if c.found.format == "v1" and not c.found.run})
    if not files:
        raise Refused(
            "no v1 autotune cache here (evict rewrites v1 files; a v2 store is FlashInfer's)",
            paths[0] if len(paths) == 1 else None,
        )
    return files


def _read(path: Path) -> v1.CacheFile:
    cache = inventory.read(classify_file(path))
    if any(d.check == "corrupt-file" for d in cache.read_defects):
        raise CorruptCache("cannot be read whole: verify it first", path)
    if (why := unloadable(cache.file)) is not None:  # merge and align refuse it too
        raise CorruptCache(f"{why}; not evicted (see `fi-cache verify`)", path)
    return cache.file


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _refuse_moved(planned: FilePlan) -> None:
    """Refused when the file's dir is no longer the one planned on (moved away, or swapped for
    a link to another): the rewrite would read and replace a file nobody planned on."""
    if _identity(planned.path.parent) != planned.dir_id:
        raise Refused(
            "its directory was replaced since evict read it (moved, or swapped for a link); "
            "nothing written: run evict again",
            planned.path,
        )


def plan(paths: Sequence[Path], selector: Selector, store: Path | None = None) -> list[FilePlan]:
    """What evict would take from each file; nothing is written. A broken manifest of a
    namespace it would change is refused here, before anything is written."""
    if selector.empty:
        raise Refused("name what to evict: --op, --bucket, --runner and/or --tactic")
    out = []
    for path in _files(paths):
        cf = _read(path)
        gone = select(cf, selector)
        ns = _namespace(path, store)
        here = _identity(path.parent)
        out.append(FilePlan(path, gone, len(cf.entries) - len(gone), ns, dir_id=here))
    for ns in {p.namespace for p in out if p.namespace is not None and p.evicted}:
        _refuse_pinned(ns, manifests.load(ns))  # a broken manifest: CorruptCache naming it
    return out


def _refuse_pinned(ns: Path, m: Manifest | None) -> None:
    if m is not None and m.pin is not None:
        raise pins.refusal(ns, "evict")


def _namespace(path: Path, store: Path | None) -> Path | None:
    parts = namespace_parts(path, store) if store is not None else None
    return Path(parts["dir"]) if parts else None


def apply(
    paths: Sequence[Path],
    selector: Selector,
    store: Path | None = None,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> list[FilePlan]:
    """Evict for real: each file that loses entries is locked, read again and replaced; per
    store namespace, under its lock, with the evict added to its manifest."""
    first = plan(paths, selector, store)
    done: dict[Path, FilePlan] = {p.path: p for p in first if not p.evicted}
    groups: dict[Path | None, list[FilePlan]] = {}
    for p in first:
        if p.evicted:
            groups.setdefault(p.namespace, []).append(p)
    for ns, group in groups.items():
        with locks.namespace_lock_if_any(ns, "evict", timeout):  # a warm writes there under it
            m = manifests.load(ns) if ns is not None else None
            if ns is not None:
                _refuse_pinned(ns, m)  # pinned since the plan: nothing written
            results = [_rewrite(p, selector, timeout) for p in group]
            record = EvictRecord(
                time.time(),
                selector.given(),
                [
                    EvictedFile(_relative(r.path, ns), list(r.evicted), r.kept)
                    for r in results
                    if r.evicted and ns is not None
                ],
            )
            if ns is not None and m is not None and record.files:
                manifests.save(ns, m.with_eviction(record))
            for r in results:
                done[r.path] = _recorded(r, m)
    return [done[p.path] for p in first]


def _relative(path: Path, ns: Path) -> str:
    return str(path.resolve().relative_to(ns.resolve()))


def _recorded(p: FilePlan, m: Manifest | None) -> FilePlan:
    return FilePlan(p.path, p.evicted, p.kept, p.namespace, m is not None and bool(p.evicted))


def _rewrite(first: FilePlan, selector: Selector, timeout: float) -> FilePlan:
    _refuse_moved(first)  # before a lock file is made in another dir
    with locked(first.path, timeout):
        read = _identity(first.path)
        cf = _read(first.path)  # what another writer left is what we cut from
        gone = set(select(cf, selector))
        kept = {k: v for k, v in cf.entries.items() if k not in gone}
        out = v1.CacheFile(cf.metadata, kept, cf.records, cf.generation, cf.unknown, cf.reserved)

        def unchanged() -> None:  # the last moment before the rename: the file read, its dir
            _refuse_moved(first)
            if _identity(first.path) != read:
                raise Refused(
                    "changed while evict read it; nothing written: run evict again", first.path
                )

        if gone:
            mode = stat.S_IMODE(first.path.stat().st_mode)
            replace_all([(first.path, v1.dumps(out).encode(), mode)], before_rename=unchanged)
    evicted = tuple(k for k in cf.entries if k in gone)
    return FilePlan(first.path, evicted, len(kept), first.namespace)
