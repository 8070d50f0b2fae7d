"""Which caches a start used: the files under the engine's dir it wrote, changed or named in its
log (against a snapshot taken before it started), each parsed for the warm record."""

from __future__ import annotations

import contextlib
from pathlib import Path

from fi_cache.caches.inventory import scan
from fi_cache.engines.api import WarmFailed
from fi_cache.store.manifest import CacheFileRecord

Snapshot = dict[Path, tuple[int, int]]


def snapshot(root: Path) -> Snapshot:
    """(mtime_ns, size) of every file under `root`: what a start changed shows against it."""
    out: Snapshot = {}
    if root.is_dir():
        for p in root.rglob("*"):
            with contextlib.suppress(OSError):
                st = p.stat()
                if p.is_file():
                    out[p] = (st.st_mtime_ns, st.st_size)
    return out


def used_files(
    root: Path, ns_dir: Path, before: Snapshot, named: set[str], seeded: dict[str, int]
) -> set[Path]:
    """The files under `root` a start wrote or changed (against `before`), or named in its log,
    and those seeded for it (`seeded`: paths relative to the namespace `ns_dir`)."""
    after = snapshot(root)
    changed = {p for p, stamp in after.items() if before.get(p) != stamp}
    said = {Path(n) for n in named}
    return {p.resolve() for p in changed | said} | {(ns_dir / s).resolve() for s in seeded}


def collect_files(
    root: Path,
    ns_dir: Path,
    who: str,
    used: set[Path] | None = None,
    seeded: dict[str, int] | None = None,
) -> list[CacheFileRecord]:
    """The caches under `root` this start used (`used`: files it wrote, changed or named in its
    log; None: all of them), each parsed (a corrupt one raises WarmFailed, naming `who` wrote
    it). A v2 store counts as used when any file inside it is; SGLang's write-only runs/ copies
    never count (no start reads them)."""
    if not root.is_dir():
        return []
    inv = scan([root], explicit=False)
    if inv.problems:
        p = inv.problems[0]
        raise WarmFailed(f"{who} wrote a cache fi-cache cannot read: {p.path}: {p.message}", [])
    seeded = seeded or {}
    out = []
    for c in inv.caches:
        here = c.path.resolve()
        if c.found.run is not None:
            continue
        if used is not None and not any(u == here or here in u.parents for u in used):
            continue
        rel = str(c.path.relative_to(ns_dir))
        out.append(CacheFileRecord(rel, len(c.file.entries), c.size, seeded.get(rel, 0)))
    return out
