"""Writing the store's files: one file under its lock (`atomic_write`, `locked`), a set of files
at once (`replace_all`), a new file only where none is (`create_new`), links, and cleanup.

Every write is a temp file + fsync + rename (atomic.py); a file's lock is a sibling `.NAME.lock`
taken by the store's lock strategy for its filesystem (locks/: flock, or a lock file where flock
is not trusted), the same strategy as namespace locks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import locks
from fi_cache.store.atomic import TMP_PREFIX as TMP_PREFIX
from fi_cache.store.atomic import check_writable as check_writable
from fi_cache.store.atomic import ensure_dir as ensure_dir
from fi_cache.store.atomic import fsync_dir as fsync_dir
from fi_cache.store.atomic import refuse_destination as refuse_destination
from fi_cache.store.atomic import replace, temp_file
from fi_cache.store.atomic import unwritable_reason as unwritable_reason
from fi_cache.store.atomic import write_failure as write_failure
from fi_cache.store.locks import DEFAULT_LOCK_TIMEOUT as DEFAULT_LOCK_TIMEOUT
from fi_cache.store.locks import LOCK_SUFFIX as LOCK_SUFFIX


@contextlib.contextmanager
def locked(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the lock that guards `path` (a sibling `.NAME.lock` file): see locks.file_lock."""
    with locks.file_lock(path, f"writing {path.name}", timeout):
        yield


def ensure_link(link: Path, target: Path) -> bool:
    """`link` -> `target` (a dir, made if missing), unless a real dir or file is at `link`. A
    link to elsewhere (the user's dir moved, another user's start made it) is pointed at
    `target` again; a link to a `target` the user removed gets it back, as the engine's own
    makedirs(exist_ok=True) raises on a dangling link. False when it cannot be made: the
    engine then writes at `link` itself, which is harmless."""
    if os.path.lexists(link):
        if not link.is_symlink():
            return True
        with contextlib.suppress(OSError):
            if os.readlink(link) == str(target):
                target.mkdir(parents=True, exist_ok=True)
                return True
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    try:
        target.mkdir(parents=True, exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)  # two starts racing: one link wins, both are the same
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return os.path.lexists(link)
    return True


def ensure_file_link(link: Path, target: Path, replace_real: bool = False) -> bool:
    """`link` -> `target` (a file, which need not exist); a link to elsewhere is pointed at
    `target` again, a real file at `link` is kept unless `replace_real`. False when it cannot
    be made."""
    if os.path.lexists(link):
        if link.is_symlink():
            with contextlib.suppress(OSError):
                if os.readlink(link) == str(target):
                    return True
        elif not replace_real:
            return True
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)  # two starts racing: one link wins, both are the same
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def prune_empty(root: Path) -> None:
    """Remove `root` if it holds only links and empty dirs (what a failed first start leaves);
    anything with a file in it stays, whole. Links are removed, never followed."""
    if not root.is_dir() or root.is_symlink():
        return
    walked = list(os.walk(root, topdown=False, followlinks=False))
    for here, _, names in walked:  # links to dirs are listed as dirs, and not walked into
        for name in names:
            if not os.path.islink(os.path.join(here, name)):
                return  # a file somewhere: keep everything
    with contextlib.suppress(OSError):
        for here, dirs, names in walked:
            for name in [*names, *dirs]:
                path = os.path.join(here, name)
                if os.path.islink(path):
                    os.unlink(path)
            os.rmdir(here)


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    lock: bool = True,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix.
    What is at `path` must be a regular file (or nothing): see `refuse_destination`."""
    refuse_destination(path, "file")  # before the lock file is made: nothing written
    with locked(path, timeout) if lock else contextlib.nullcontext():
        replace(path, data, mode)


# (inode, mtime_ns, size): what `create_new` placed; a later write by anyone changes it.
Stamp = tuple[int, int, int]


def create_new(path: Path, data: bytes, *, mode: int = 0o644) -> Stamp | None:
    """Write `path` only if nothing is there yet, atomically (temp file, fsync, hard link: a
    running engine about to save the same file wins, and never reads half of ours). Returns
    the placed file's stamp, None when something was there first."""
    refuse_destination(path, "file")
    tmp = temp_file(path, data, mode)
    try:
        st = os.stat(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(path):  # no hard links here: the next best, a check then rename
                return None
            os.replace(tmp, path)
        fsync_dir(path.parent)
        return st.st_ino, st.st_mtime_ns, st.st_size
    except OSError as exc:
        raise write_failure(exc, path) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def stamp_of(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def through_links(path: Path) -> Path:
    """The file an output option (`-o OUT`) names: through a symlink, its target (the link
    stays, as `cp` and a shell redirection write through it; a dangling link's target is made);
    `path` itself otherwise. The store's own files are never written through links."""
    if not os.path.islink(path):
        return path
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"cannot write through it: {exc.strerror}", path) from None
        return Path(os.path.realpath(path))


def replace_all(
    writes: Sequence[tuple[Path, bytes, int]], before_rename: Callable[[], None] | None = None
) -> None:
    """Replace several files as one set, (path, data, mode) each, under the caller's locks:
    every temp file is written and fsynced first, then all are renamed. A failure while
    staging (a full disk) or a refusal from `before_rename` (a last check) removes the temps
    and replaces nothing; a rename that fails after others (rare: each temp sits beside its
    target) says which were replaced."""
    for path, _, _ in writes:
        refuse_destination(path, "file")
    staged: list[tuple[str, Path]] = []
    done: list[Path] = []
    try:
        for path, data, mode in writes:
            staged.append((temp_file(path, data, mode), path))
        if before_rename is not None:
            before_rename()
        for tmp, path in staged:
            try:
                refuse_destination(path, "file")  # again: a node made while we wrote
                os.replace(tmp, path)
            except (OSError, FiCacheError) as exc:
                if not done:
                    raise write_failure(exc, path) if isinstance(exc, OSError) else exc from None
                why = exc.strerror if isinstance(exc, OSError) else exc.message
                names = ", ".join(p.name for p in done)
                raise FiCacheError(
                    f"cannot replace: {why}; {len(done)} of {len(writes)} files were replaced "
                    f"already ({names}), the rest not",
                    path,
                ) from None
            done.append(path)
    finally:
        for tmp, _ in staged:  # a renamed one is gone already
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for directory in sorted({p.parent for p in done}):
            fsync_dir(directory)


def remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise Refused(f"cannot remove: {exc.strerror}", path) from None


def share_like_store(paths: list[Path], store: Path) -> None:
    """Give files vLLM/FlashInfer wrote (0600) the read access the store dir itself grants, so
    a shared store is readable by every server that shares it and a private one stays private."""
    try:
        grant = store.stat().st_mode & 0o044
    except OSError:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            os.chmod(path, (path.stat().st_mode & 0o777) | grant)


def write_private(directory: Path, name: str, data: bytes) -> None:
    """`directory/name` = `data`, readable and writable by this user alone: `directory` made
    0700, refused (Refused) when it is a link or another user's. For what names a command to run
    (serve's memo)."""
    shared = directory.parent  # one dir per user below it, as in /tmp: sticky, open to all
    if not shared.is_dir():
        ensure_dir(shared)
        with contextlib.suppress(OSError):
            os.chmod(shared, 0o1777)
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        raise Refused(f"cannot create directory: {exc.strerror}", directory) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Refused("not a directory of this user's own", directory)
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    atomic_write(directory / name, data, mode=0o600, lock=False)


def keep_newest(directory: Path, keep: int, suffix: str) -> None:
    """Remove all but the `keep` newest `*suffix` files of `directory` (serve's memos: one per
    command line and environment, which a pod's name changes at every start)."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.endswith(suffix) and e.is_file()]
        entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for e in entries[keep:]:
        with contextlib.suppress(Refused):
            remove_file(Path(e.path))
