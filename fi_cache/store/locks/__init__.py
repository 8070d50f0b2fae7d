"""Every lock fi-cache takes: one per namespace dir (warm, import, prune, pin, serve's
bookkeeping), and one per file it replaces (`file_lock`: merge -o, evict, align).

Two strategies behind one interface (api.py): flock where the filesystem honours it (flock.py),
else a lock file with dead-holder recovery (lockfile.py). `lock_strategy` picks one per
directory, for a namespace's lock and a file's alike (two hosts writing one file on NFS see each
other's lock file; neither sees the other's flock); the functions below are all the rest of
fi-cache uses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from fi_cache.errors import Refused
from fi_cache.store.atomic import check_writable, ensure_dir, unwritable_reason
from fi_cache.store.in_use import IN_USE_NAME, in_use, mark, note_served
from fi_cache.store.locks import flock, lockfile
from fi_cache.store.locks.api import (
    DEFAULT_LOCK_TIMEOUT,
    HOLDER_NAME,
    LOCK_NAME,
    LOCK_SUFFIX,
    Holder,
    LockStrategy,
    NamespaceBusy,
    OnWait,
    Site,
    this_holder,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "HOLDER_NAME",
    "IN_USE_NAME",
    "LOCK_NAME",
    "LOCK_SUFFIX",
    "Holder",
    "NamespaceBusy",
    "file_lock",
    "filesystem_type",
    "guard_fds",
    "hold_in_use",
    "in_use",
    "lock_strategy",
    "namespace_lock",
    "namespace_lock_if_any",
    "probe_namespace_lock",
    "share_with_guard",
    "try_namespace_lock",
]

LOCK_ENV = "FI_CACHE_LOCK"
_UNTRUSTED_FS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "fuse")
_STRATEGIES: dict[str, LockStrategy] = {s.name: s for s in (flock.Flock(), lockfile.LockFile())}


def _by_name(strategy: str) -> LockStrategy:
    """Lock files only when asked for, else flock."""
    return _STRATEGIES["lockfile" if strategy == "lockfile" else "flock"]


def filesystem_type(path: Path) -> str | None:
    """The mount type holding `path` (Linux /proc/mounts; None elsewhere)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, parts[2]
    return best_type


def lock_strategy(directory: Path) -> tuple[str, str]:
    """("flock" | "lockfile", why) for locks under `directory` (created if missing)."""
    fs = filesystem_type(directory) or "unknown"
    kind, why = _strategy(directory, fs)
    if os.path.isdir(directory) and (cannot := unwritable_reason(directory)):
        # Said whatever the strategy: nobody here can take a lock, warm, import or prune.
        why = f"{why}; {cannot}: nothing here can be locked or written"
    return kind, why


def _strategy(directory: Path, fs: str) -> tuple[str, str]:
    chosen = os.environ.get(LOCK_ENV, "").strip()
    if chosen in ("flock", "lockfile"):
        return chosen, f"set by {LOCK_ENV}"
    if chosen:
        raise Refused(
            f"{LOCK_ENV}={chosen!r}: give flock or lockfile, or unset it to let fi-cache pick"
        )
    if fs.startswith(_UNTRUSTED_FS):
        return "lockfile", f"{fs} filesystem: flock is not trusted there"
    if os.name != "posix":
        return "lockfile", "no flock on this platform"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "flock", f"{fs} filesystem (cannot be created, untested)"
    if unwritable_reason(directory):
        # No probe file can be made, so flock cannot be tested (lock_strategy says why); a probe
        # by flock still sees a holder that writes through another (writable) mount of the files.
        return "flock", f"{fs} filesystem"
    if flock.honoured(directory):
        return "flock", f"{fs} filesystem honours flock"
    return "lockfile", f"{fs} filesystem does not honour flock"


@contextlib.contextmanager
def namespace_lock(
    directory: Path,
    purpose: str,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait: OnWait | None = None,
    strategy: str | None = None,
) -> Iterator[Holder]:
    """Hold `directory`'s lock. Calls on_wait(holder) once if someone else has it first;
    raises FiCacheError naming the holder when `timeout` passes."""
    ensure_dir(directory)
    check_writable(directory)
    me = this_holder(purpose)
    kind = strategy or lock_strategy(directory)[0]
    with _by_name(kind).acquire(Site.of_namespace(directory), me, timeout, on_wait):
        yield me


@contextlib.contextmanager
def namespace_lock_if_any(
    directory: Path | None, purpose: str, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> Iterator[Holder | None]:
    """`directory`'s lock when it is a namespace that exists; nothing to hold for a file outside
    any namespace (None), or in one deleted since (a lock would make its dir again, empty)."""
    if directory is None or not directory.is_dir():
        yield None
        return
    with namespace_lock(directory, purpose, timeout) as me:
        yield me


@contextlib.contextmanager
def file_lock(path: Path, purpose: str, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[Holder]:
    """Hold the lock of the file `path` (`.NAME.lock` beside it, its dir made), by the strategy
    of its dir's filesystem. Refused (exit 2, nothing made) when a symlink, FIFO or dir is at the
    lock name or it cannot be created; FiCacheError naming the holder when `timeout` passes."""
    site = Site.of_file(path)
    ensure_dir(site.lock_file.parent)
    site.clear()  # before anything is made here
    me = this_holder(purpose)
    with _by_name(lock_strategy(site.lock_file.parent)[0]).acquire(site, me, timeout, None):
        yield me


@contextlib.contextmanager
def try_namespace_lock(directory: Path, purpose: str, strategy: str) -> Iterator[Holder]:
    """Take `directory`'s lock without waiting and without creating the directory or any file
    but the lock itself. Raises NamespaceBusy when it is held, Refused when it cannot be taken."""
    me = this_holder(purpose)
    with _by_name(strategy).try_acquire(Site.of_namespace(directory), me):
        yield me


def probe_namespace_lock(directory: Path, strategy: str) -> tuple[bool, Holder | None]:
    """(held, holder) of `directory`'s lock, creating and changing nothing."""
    return _by_name(strategy).probe(Site.of_namespace(directory))


def share_with_guard(directory: Path, guard: int) -> None:
    """The lock this process holds on `directory` stays held by `guard` too, when this process
    dies first: flock through the inherited descriptor (`guard_fds`), a lock file by naming the
    guard in it (its holder is not stale while the guard lives)."""
    if str(directory / LOCK_NAME) in flock.HELD:  # taken by the flock strategy
        flock.add_guard(directory, guard)
    else:
        lockfile.add_guard(directory, guard)


def guard_fds(directory: Path) -> list[int]:
    """Descriptors a guard of `directory`'s lock must inherit (flock; none for a lock file)."""
    fd = flock.HELD.get(str(directory / LOCK_NAME))
    return [fd] if fd is not None else []


def hold_in_use(directory: Path) -> tuple[bool, int | None]:
    """Note a serve of `directory` now, and mark it in use until this process (or what it execs)
    exits: (flock is trusted here, the mark's fd). No fd where flock is not available or not
    trusted (a lock-file store cannot mark shared use), or where the mark was refused just now."""
    if lock_strategy(directory)[0] != "flock":
        note_served(directory)
        return False, None
    return True, mark(directory)  # which notes the serve too
