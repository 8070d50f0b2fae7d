"""Installing imported namespaces (import, pull).

A bundle is unpacked into `<store>/.import-*` first; each namespace then replaces its old self
under the namespace lock, so readers see the old or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tarfile
import tempfile
from pathlib import Path
from typing import IO

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import trash
from fi_cache.store.files import (
    DEFAULT_LOCK_TIMEOUT,
    ensure_dir,
    fsync_dir,
    write_failure,
)
from fi_cache.store.in_use import in_use
from fi_cache.store.locks import namespace_lock
from fi_cache.store.pin import pinned, refusal

STAGING_PREFIX = ".import-"
_INSTALL_ATTEMPTS = 20  # each retry waits for a newcomer's lock: only a storm of them exhausts it


def make_staging_dir(store: Path) -> Path:
    """A fresh `<store>/.import-*`. One a killed import leaves is a leftover: scans skip it, and
    prune and doctor --fix delete it once it has been untouched for 10 minutes."""
    ensure_dir(store)
    try:
        return Path(tempfile.mkdtemp(dir=store, prefix=STAGING_PREFIX))
    except OSError as exc:
        raise Refused(f"store is not writable: {exc.strerror}", store) from None


def discard_staging_dir(staging: Path) -> None:
    """Delete an import's own staging dir where it is: nobody else reads it, so it needs no
    trip through `.trash/` (and a refused import leaves no `.trash/` behind). What cannot be
    deleted now is a leftover prune removes later: never a reason to fail the import."""
    with contextlib.suppress(FiCacheError):
        trash.delete_tree(staging)


def write_member(path: Path, src: IO[bytes], size: int) -> str:
    """Copy exactly `size` bytes of `src` to a new file at `path`; returns their sha256."""
    ensure_dir(path.parent)
    digest = hashlib.sha256()
    left = size
    try:
        with open(path, "xb") as f:  # "x": never follow or overwrite anything already there
            while left > 0:
                block = _read_bundle(src, min(left, 1 << 20))
                if not block:
                    raise Refused("bundle member ends early (truncated)", path)
                digest.update(block)
                f.write(block)
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # ENOSPC, EDQUOT: the store's disk failed, not the bundle
        raise write_failure(exc, path) from None
    return digest.hexdigest()


def _read_bundle(src: IO[bytes], size: int) -> bytes:
    """A read of the bundle: its failures stay the bundle's (a TarError), not a failed write."""
    try:
        return src.read(size)
    except OSError as exc:
        raise tarfile.ReadError(str(exc)) from None


def install_dir(
    new: Path, target: Path, store: Path, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> None:
    """Replace `target` with the staged dir `new` (old one to the trash) under target's lock.

    Where the filesystem can exchange two paths in one step (Linux renameat2), `target` never
    stops existing: a process arriving mid-import finds the old namespace or the new one. Elsewhere
    (NFS) it is two renames, and a process that creates `target` in between is waited for."""
    if not new.is_dir():  # never move the old one aside without a replacement in hand
        raise Refused("staged namespace is missing", new)
    _touch(new)  # the staging dir is in use: prune judges its age by its newest entry
    ensure_dir(target.parent)
    trash.check_usable(store)  # before anything moves: the old dir must have a place
    with namespace_lock(target, "import", timeout):
        if in_use(target):  # its in-use mark would go with the old dir, and prune ignore it
            raise FiCacheError(
                "in use by a running `fi-cache serve`: import after it stops", target
            )
        if pinned(target) is not None:  # pinned while the bundle was checked
            raise refusal(target, "an import")
        swapped = _exchange(new, target)
        if swapped:
            fsync_dir(target.parent)
    if swapped:  # `new` now holds the old namespace: the import is done, whatever happens next
        with contextlib.suppress(OSError, FiCacheError):
            trash.delete_tree(trash.to_trash(new, store, target.name))
        return
    _install_in_two_renames(new, target, store, timeout)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE). False where this
    platform or filesystem cannot (not Linux, old libc, NFS, a seccomp filter): a failed
    renameat2 changes nothing, so the caller's fallback runs and reports any real problem."""
    try:
        import ctypes

        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def _install_in_two_renames(new: Path, target: Path, store: Path, timeout: float) -> None:
    """install_dir without an exchange: old aside, then new in place. A newcomer (a warm) that
    recreates `target` in between holds its lock: wait for it, then move its dir aside too."""
    trashed: list[Path] = []
    try:
        for _ in range(_INSTALL_ATTEMPTS):
            _touch(new)
            with namespace_lock(target, "import", timeout):
                aside = trash.to_trash(target, store, target.name)
                trashed.append(aside)
                if _put_in_place(new, target):
                    fsync_dir(target.parent)
                    break
        else:
            raise FiCacheError("kept being recreated by other processes; try again", target)
    except BaseException as exc:
        restored = False
        if trashed and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.replace(trashed[0], target)  # put the old one back: never lose it
                restored = True
        if not restored and trashed and isinstance(exc, Exception):
            raise FiCacheError(
                f"import did not finish ({exc}); the namespace as it was is in {trashed[0]} "
                f"(kept {trash.INSTALLING_KEEP_S / 3600:.0f} h from prune)",
                target,
            ) from None
        for other in trashed[1:] if restored else []:  # newcomers' dirs, replaced as planned
            with contextlib.suppress(FiCacheError):
                trash.delete_tree(other)
        raise
    for old in trashed:
        trash.delete_tree(old)


def _put_in_place(new: Path, target: Path) -> bool:
    """os.replace(new, target); False when a newcomer recreated `target` meanwhile."""
    for _ in range(3):
        try:
            os.replace(new, target)
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            if exc.errno != errno.ENOENT or not new.is_dir():
                raise
            ensure_dir(target.parent)  # a prune removed the emptied parents just now
    raise FiCacheError("its parent directory keeps disappearing", target)
