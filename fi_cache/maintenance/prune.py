"""prune: which namespaces to delete (a plan, shown first), then deleting them (apply).

`plan` is pure: it reasons over `NamespaceInfo` records that `scan_store` reads from disk.
`apply` deletes through fi_cache.store, each namespace under its own lock taken without waiting and
in one atomic rename, so a prune killed at any moment leaves every namespace whole or gone.
A namespace whose lock is held is never planned nor touched.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.caches.discover import (
    STAGING_PREFIX,
    TMP_MAX_AGE_S,
    leftover_mtime,
    tmp_leftovers,
)
from fi_cache.errors import CorruptCache, FiCacheError, Refused
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import files, in_use, locks
from fi_cache.store import manifest as manifests
from fi_cache.store import trash as store_trash
from fi_cache.store.namespace import NAMESPACES_DIR, slug
from fi_cache.store.paths import state_dir

if TYPE_CHECKING:
    from fi_cache.environment import Environment

# Younger temp files may belong to a writer that is still running (doctor --fix waits as long).

# --- parsing the selectors ------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{p: 1000**i for i, p in enumerate("kmgtp", 1)},
    **{f"{p}b": 1000**i for i, p in enumerate("kmgtp", 1)},
    **{f"{p}i": 1024**i for i, p in enumerate("kmgtp", 1)},
    **{f"{p}ib": 1024**i for i, p in enumerate("kmgtp", 1)},
}


def parse_duration(text: str) -> float:
    """Seconds in `30d`, `12h`, `90m`, `3600s`, `2w` (or a bare `0`). Raises Refused."""
    m = _DURATION.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit not in _DURATION_UNITS and not (unit == "" and float(m.group(1)) == 0)):
        raise Refused(f"--older-than {text!r}: give a number and a unit s, m, h, d or w (e.g. 30d)")
    return float(m.group(1)) * _DURATION_UNITS.get(unit, 1)


def parse_size(text: str) -> int:
    """Bytes in `20GB`, `500MB`, `1.5GiB`, `0` (decimal or binary units, any case).
    Raises Refused."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise Refused(
            f"--max-size {text!r}: give a number and a unit like 500MB, 20GB or 1.5GiB (or 0)"
        )
    size = float(m.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(size):
        raise Refused(f"--max-size {text!r} is too large")
    return int(size)


# --- what is on disk ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceInfo:
    """One namespace dir of the store, as prune sees it."""

    dir: Path
    flashinfer_version: str  # the path's slugs (manifest values are in `fingerprint`)
    arch: str
    gpu: str
    finalize: str
    size: int  # bytes, the sum of its files' sizes
    last_used: float  # the manifest's last_used, else the newest mtime under the dir
    last_used_from: str  # "manifest" | "mtime"
    locked: bool = False
    holder: locks.Holder | None = None
    fingerprint: Fingerprint | None = None  # from the manifest, when there is one
    problem: str | None = None  # e.g. an unreadable manifest (the namespace still counts)
    ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the dir as scanned
    pinned: bool = False  # `fi-cache pin`: never pruned

    def relpath(self, store: Path) -> str:
        try:
            return str(self.dir.relative_to(store))
        except ValueError:
            return str(self.dir)


@dataclass(frozen=True)
class Leftover:
    """A temp file of a killed writer, or what a killed prune left in the trash."""

    path: Path
    size: int
    mtime: float

    @property
    def staging(self) -> bool:
        """A killed import's `<store>/.import-*` (a dir), not a temp file."""
        return self.path.name.startswith(STAGING_PREFIX)

    @property
    def what(self) -> str:
        return "staging dir of a killed import" if self.staging else "temp file"


@dataclass(frozen=True)
class Here:
    """What --foreign compares against: this machine's FlashInfer version and GPU names."""

    flashinfer_version: str | None
    gpus: tuple[str, ...]

    @classmethod
    def of(cls, env: Environment) -> Here:
        return cls(env.fingerprint.flashinfer_version, tuple(g.name for g in env.gpus))

    @property
    def knows_anything(self) -> bool:
        return self.flashinfer_version is not None or bool(self.gpus)


def _walk_size(directory: Path) -> tuple[int, float]:
    """(sum of file sizes, newest mtime) under `directory`; symlinks are not followed."""
    total, newest = 0, 0.0
    stack = [str(directory)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    newest = max(newest, st.st_mtime)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        total += st.st_size
        except OSError:
            continue
    if newest == 0.0:
        with contextlib.suppress(OSError):
            newest = directory.stat().st_mtime
    return total, newest


def _subdirs(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(
                (e for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)),
                key=lambda e: e.name,
            )
    except OSError:
        return []


def namespace_dirs(store: Path) -> list[Path]:
    """`<store>/namespaces/<fi>/<arch>/<gpu>/<finalize>-<hash>/`, never following symlinks."""
    out: list[Path] = []
    for fi in _subdirs(str(store / NAMESPACES_DIR)):
        for arch in _subdirs(fi.path):
            for gpu in _subdirs(arch.path):
                out.extend(Path(ns.path) for ns in _subdirs(gpu.path) if "-" in ns.name)
    return out


def read_namespace(directory: Path, strategy: str) -> NamespaceInfo:
    """One namespace's facts; a missing or unreadable manifest falls back to file times."""
    size, newest = _walk_size(directory)
    finalize = directory.name.partition("-")[0]
    gpu, arch, fi = directory.parent.name, directory.parent.parent.name, directory.parents[2].name
    problem = None
    try:
        m = manifests.load(directory)
    except CorruptCache as exc:
        m, problem = None, exc.message
    locked, holder = locks.probe_namespace_lock(directory, strategy)
    try:
        st = directory.stat()
        ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except OSError:
        ident = None
    return NamespaceInfo(
        dir=directory,
        flashinfer_version=fi,
        arch=arch,
        gpu=gpu,
        finalize=finalize,
        size=size,
        last_used=_last_used(directory, m.last_used) if m else newest,
        last_used_from="manifest" if m else "mtime",
        locked=locked,
        holder=holder if locked else None,
        fingerprint=m.fingerprint if m else None,
        problem=problem,
        ident=ident,
        pinned=m is not None and m.pin is not None,
    )


def cannot_delete(store: Path) -> str | None:
    """Why nothing in `store` can be deleted (a read-only mount, no permission), or None."""
    return files.unwritable_reason(store)


def lock_strategy(store: Path) -> str:
    return locks.lock_strategy(store)[0] if store.is_dir() else "flock"


def scan_store(store: Path, strategy: str | None = None) -> list[NamespaceInfo]:
    """Every namespace of the store, with its size, last use and whether its lock is held.
    Reads only: lock probes take nothing and create nothing."""
    dirs = namespace_dirs(store)
    if not dirs:
        return []
    kind = strategy or lock_strategy(store)
    return [read_namespace(d, kind) for d in dirs]


def _is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def scan_leftovers(store: Path) -> tuple[list[Leftover], list[Leftover]]:
    """(temp files of killed writers, entries of `<store>/.trash/`) of any age."""
    if not store.is_dir():
        return [], []
    tmp = []
    for path in tmp_leftovers(store):
        top = path.relative_to(store).parts[0]
        if top.startswith(".") and top not in (path.name, state_dir(store).name):
            continue  # in a hidden dir that is not ours (a filer's .snapshot, say)
        with contextlib.suppress(OSError):
            # A killed import's staging dir is one leftover, as old as its newest entry.
            size = _walk_size(path)[0] if _is_dir(path) else path.lstat().st_size
            tmp.append(Leftover(path, size, leftover_mtime(path)))
    junk = []
    for path in store_trash.trash_leftovers(store):
        with contextlib.suppress(OSError):
            st = path.lstat()
            size = _walk_size(path)[0] if _is_dir(path) else st.st_size
            junk.append(Leftover(path, size, st.st_mtime))
    return tmp, junk


# --- the plan (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The selectors of one prune; none given means temp leftovers only."""

    older_than: float | None = None  # seconds since last use
    max_size: int | None = None  # bytes the namespaces may keep
    foreign: bool = False

    @property
    def any(self) -> bool:
        return self.older_than is not None or self.max_size is not None or self.foreign


@dataclass(frozen=True)
class Plan:
    """What apply would delete, least recently used first, and what it leaves alone."""

    namespaces: list[tuple[NamespaceInfo, list[str]]]
    tmp: list[Leftover]
    trash: list[Leftover]
    skipped_locked: list[tuple[NamespaceInfo, list[str]]] = field(default_factory=list)
    skipped_pinned: list[tuple[NamespaceInfo, list[str]]] = field(default_factory=list)
    kept_bytes: int = 0  # what the namespaces left in the store take
    selection: Selection = field(default_factory=Selection)

    @property
    def bytes(self) -> int:
        """Everything apply would free."""
        leftovers = sum(t.size for t in self.tmp) + sum(t.size for t in self.trash)
        return sum(ns.size for ns, _ in self.namespaces) + leftovers

    @property
    def empty(self) -> bool:
        return not (self.namespaces or self.tmp or self.trash)


def describe_age(seconds: float) -> str:
    """`45d`, `3h`, `12m`, `30s`."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def foreign_reasons(ns: NamespaceInfo, here: Here) -> list[str]:
    """Why `ns` cannot be used here; a field this machine does not know is not compared."""
    reasons = []
    theirs = ns.fingerprint.flashinfer_version if ns.fingerprint else None
    mine = here.flashinfer_version
    if mine is not None and ns.flashinfer_version != "unknown":
        differs = theirs != mine if theirs is not None else ns.flashinfer_version != slug(mine)
        if differs:
            reasons.append(f"foreign: FlashInfer {theirs or ns.flashinfer_version} (here: {mine})")
    if here.gpus and ns.gpu != "unknown" and ns.gpu not in {slug(g) for g in here.gpus}:
        name = ns.fingerprint.gpu if ns.fingerprint and ns.fingerprint.gpu else ns.gpu
        reasons.append(f"foreign: no {name} here")
    return reasons


def plan(
    namespaces: Sequence[NamespaceInfo],
    criteria: Selection,
    now: float,
    here: Here | None = None,
    tmp: Sequence[Leftover] = (),
    trash: Sequence[Leftover] = (),
) -> Plan:
    """Which namespaces go and why. `here` is needed for `criteria.foreign`.

    --max-size keeps the most recently used namespaces whose sizes fit the budget (locked and
    pinned ones stay whatever happens, so they count first; those chosen by other selectors
    count as freed) and evicts the rest, least recently used first.
    """
    if criteria.foreign and (here is None or not here.knows_anything):
        raise Refused("cannot tell what is foreign on a machine without FlashInfer or a GPU")
    reasons: dict[Path, list[str]] = {}
    for ns in namespaces:
        why = []
        age = now - ns.last_used
        if criteria.older_than is not None and age >= criteria.older_than:
            why.append(f"unused for {describe_age(age)}")
        if criteria.foreign and here is not None:
            why.extend(foreign_reasons(ns, here))
        if why:
            reasons[ns.dir] = why
    if criteria.max_size is not None:
        kept = sum(ns.size for ns in namespaces if _stays(ns))  # whatever happens
        evicting = False
        rest = [ns for ns in namespaces if ns.dir not in reasons]
        for ns in sorted(rest, key=lambda n: (-n.last_used, str(n.dir))):
            if _stays(ns):
                if evicting:
                    reasons[ns.dir] = ["over --max-size (least recently used)"]
                continue
            if not evicting and kept + ns.size <= criteria.max_size:
                kept += ns.size
                continue
            evicting = True
            reasons[ns.dir] = ["over --max-size (least recently used)"]
    chosen = sorted(
        (ns for ns in namespaces if ns.dir in reasons), key=lambda n: (n.last_used, str(n.dir))
    )
    planned = [(ns, reasons[ns.dir]) for ns in chosen if not _stays(ns)]
    skipped = [(ns, reasons[ns.dir]) for ns in chosen if ns.locked and not ns.pinned]
    pinned = [(ns, reasons[ns.dir]) for ns in chosen if ns.pinned]
    # Temp files go with their namespace when it goes; a locked or pinned one is never touched.
    gone = {ns.dir for ns, _ in planned}
    hands_off = gone | {ns.dir for ns in namespaces if _stays(ns)}
    old_tmp = [
        t for t in tmp if now - t.mtime >= TMP_MAX_AGE_S and hands_off.isdisjoint(t.path.parents)
    ]
    return Plan(
        namespaces=planned,
        tmp=old_tmp,
        # An install's old dir stays a while: the install puts it back if it fails.
        trash=[t for t in trash if not store_trash.trash_entry_in_use(t.path, now)],
        skipped_locked=skipped,
        skipped_pinned=pinned,
        kept_bytes=sum(ns.size for ns in namespaces if ns.dir not in gone),
        selection=criteria,
    )


def _stays(ns: NamespaceInfo) -> bool:
    """Locked (in use) or pinned: no selector takes it."""
    return ns.locked or ns.pinned


# --- applying it ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Skip:
    """A planned namespace that apply left alone, and why."""

    ns: NamespaceInfo
    why: str
    locked: bool = False  # its lock was taken by then
    holder: locks.Holder | None = None


@dataclass
class Outcome:
    """What apply did: each planned thing ends removed, skipped (with why) or failed."""

    removed: list[NamespaceInfo] = field(default_factory=list)
    removed_tmp: list[Leftover] = field(default_factory=list)
    emptied_trash: list[Leftover] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    failed: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return (
            sum(ns.size for ns in self.removed)
            + sum(t.size for t in self.removed_tmp)
            + sum(t.size for t in self.emptied_trash)
        )


def _replaced(ns: NamespaceInfo) -> bool:
    """Is the dir at ns.dir another one than the plan judged? (An import swaps in a new dir,
    whose lock a prune can take at once.) Checked under the lock."""
    try:
        st = ns.dir.stat()
    except OSError:
        return True
    return ns.ident is not None and (st.st_dev, st.st_ino) != ns.ident


def _since_plan(ns: NamespaceInfo) -> str | None:
    """Why `ns` stays after all: a use recorded, or a pin made, after it was planned.
    (Checked under its lock.)"""
    try:
        m = manifests.load(ns.dir)
    except CorruptCache:
        return None
    if m is None:
        return None
    if m.pin is not None:
        return "pinned since the plan was made"
    if ns.last_used_from == "mtime" or _last_used(ns.dir, m.last_used) > ns.last_used:
        return "used since the plan was made"
    return None


def _last_used(directory: Path, recorded: float) -> float:
    """The manifest's last use (a warm) or the namespace's last serve, whichever is later."""
    return max(recorded, in_use.served_at(directory) or 0.0)


def apply(p: Plan, store: Path, strategy: str | None = None) -> Outcome:
    """Carry out the plan: the trash of killed prunes first, then each namespace (least
    recently used first) under its lock, then old temp files."""
    out = Outcome()
    for junk in p.trash:
        try:
            store_trash.empty_trash_entry(junk.path)
            out.emptied_trash.append(junk)
        except FiCacheError as exc:
            out.failed.append((junk.path, exc.message))
    kind = strategy or lock_strategy(store)
    namespaces_root = store / NAMESPACES_DIR
    for ns, _ in p.namespaces:
        if not ns.dir.is_dir():
            out.skipped.append(Skip(ns, "gone already"))
            continue
        try:
            with locks.try_namespace_lock(ns.dir, "prune", kind):
                if _replaced(ns):
                    out.skipped.append(Skip(ns, "replaced since the plan was made (an import)"))
                    continue
                if why := _since_plan(ns):
                    out.skipped.append(Skip(ns, why))
                    continue
                store_trash.remove_tree(ns.dir, store)
            out.removed.append(ns)
        except locks.NamespaceBusy as exc:
            out.skipped.append(Skip(ns, exc.message, True, exc.holder))
            continue
        except FiCacheError as exc:
            out.failed.append((ns.dir, exc.message))
            if os.path.lexists(ns.dir):
                continue
            out.removed.append(ns)  # moved out of the store; only the trash is left to empty
        store_trash.remove_empty_parents(ns.dir, namespaces_root)
    for t in p.tmp:
        try:
            if _is_dir(t.path):  # a killed import's staging dir
                store_trash.remove_tree(t.path, store)
            else:
                files.remove_file(t.path)
            out.removed_tmp.append(t)
        except FiCacheError as exc:
            out.failed.append((t.path, exc.message))
    return out


def plan_store(
    store: Path,
    criteria: Selection,
    here: Here | None = None,
    now: float | None = None,
) -> Plan:
    """The plan for `store` right now (reads only)."""
    tmp, trash = scan_leftovers(store)
    t = time.time() if now is None else now
    return plan(scan_store(store), criteria, t, here, tmp, trash)
