"""Writing one file: temp file + fsync + rename (+ dir fsync), optionally under a sibling lock.

Readers never see a half-written file: data goes to a temp file in the target's directory,
is fsynced, then renamed over the target (atomic on POSIX within one filesystem), and the
directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused, special_kind

# Our temp files; doctor's tmp-leftover check knows this prefix.
TMP_PREFIX = ".fi-cache-"
LOCK_SUFFIX = ".lock"
DEFAULT_LOCK_TIMEOUT = 60.0


def lock_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def locked(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the lock that guards `path` (a sibling `.NAME.lock` file)."""
    import filelock  # deferred: 40 ms of imports that read-only commands and serve never need

    lock_file = lock_path_for(path)
    ensure_dir(lock_file.parent)
    _make_lock_file(lock_file, path)
    lock = filelock.FileLock(str(lock_file), timeout=timeout)
    try:
        with lock:
            yield
    except filelock.Timeout:
        raise FiCacheError(
            f"timed out after {timeout:.0f}s waiting for the lock {lock_file}", path
        ) from None


def _make_lock_file(lock_file: Path, path: Path) -> None:
    """Refused (exit 2) when the lock file cannot be made (/proc/self/, a read-only dir):
    filelock would retry that until its timeout. O_NONBLOCK: a FIFO planted there never waits.
    O_NOFOLLOW: a symlink planted at the lock name is refused, nothing made at its target."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_NOCTTY", 0)
    for attempt in range(3):
        try:
            os.close(os.open(lock_file, flags, 0o644))
            return
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and attempt < 2 and not lock_file.parent.is_dir():
                ensure_dir(lock_file.parent)  # moved away by a concurrent import or prune
                continue
            if exc.errno == errno.ELOOP or os.path.islink(lock_file):
                why = f"its lock file {lock_file.name} is a symlink: refusing to follow it"
                raise Refused(f"cannot write here: {why}", path) from None
            why = f"cannot create its lock file {lock_file.name} ({exc.strerror})"
            raise Refused(f"cannot write here: {why}", path) from None


def ensure_dir(directory: Path) -> None:
    """mkdir -p; a failure is one Refused line naming the directory."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot create directory: {exc.strerror}", directory) from None


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
    if lock:
        with locked(path, timeout):
            _replace(path, data, mode)
    else:
        _replace(path, data, mode)


# (inode, mtime_ns, size): what `create_new` placed; a later write by anyone changes it.
Stamp = tuple[int, int, int]


def create_new(path: Path, data: bytes, *, mode: int = 0o644) -> Stamp | None:
    """Write `path` only if nothing is there yet, atomically (temp file, fsync, hard link: a
    running engine about to save the same file wins, and never reads half of ours). Returns
    the placed file's stamp, None when something was there first."""
    refuse_destination(path, "file")
    tmp = _temp_file(path, data, mode)
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


def refuse_destination(path: Path, what: str, *, parent_must_exist: bool = False) -> None:
    """Refused (exit 2) when `path` (through links) is a directory, FIFO, device, socket or any
    other non-regular file: a writer replaces only files, never the /dev/null or pipe a user
    named by mistake. `parent_must_exist`: a typo should not grow a directory tree either."""
    try:
        mode: int | None = os.stat(path).st_mode
    except OSError:  # missing, a dangling link, a loop: the write creates or replaces the name
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else special_kind(mode) or "no regular file"
        raise Refused(f"is {kind}, not a {what}: refusing to replace it", path)
    if parent_must_exist and not path.parent.is_dir():
        raise Refused("no such directory", path.parent)


def unwritable_reason(directory: Path) -> str | None:
    """Why nothing can be written in the existing `directory` (a read-only mount, no
    permission), or None when it can (or when it does not exist: creating it will say)."""
    if not os.path.isdir(directory):
        return None
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except (OSError, AttributeError):  # no statvfs on this platform: access() still answers
        pass
    if not os.access(directory, os.W_OK | os.X_OK):
        return "not writable by this user"
    return None


def check_writable(directory: Path) -> None:
    """Refuse early (filelock would retry a read-only lock file until its timeout)."""
    for attempt in range(3):
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=TMP_PREFIX, suffix=".tmp")
        except FileNotFoundError:
            if attempt == 2:
                raise Refused("store dir keeps disappearing", directory) from None
            ensure_dir(directory)  # an import or prune moved the namespace away just now
            continue
        except OSError as exc:
            raise Refused(f"store is not writable: {exc.strerror}", directory) from None
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # moved away with the namespace by a concurrent import: fine
        return


def _temp_file(path: Path, data: bytes, mode: int) -> str:
    """`data` in a fsynced temp file beside `path` (its dir made), ready to be renamed or linked."""
    ensure_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".tmp")
    except OSError as exc:
        raise Refused(f"cannot write here: {exc.strerror}", path.parent) from None
    with _cleaned_up(tmp, path):
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    return tmp


@contextlib.contextmanager
def _cleaned_up(tmp: str, path: Path) -> Iterator[None]:
    """On any failure the temp file goes, and an OSError is one line naming `path`."""
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise write_failure(exc, path) from None
        raise


def _replace(path: Path, data: bytes, mode: int) -> None:
    tmp = _temp_file(path, data, mode)
    with _cleaned_up(tmp, path):
        refuse_destination(path, "file")  # again: a node made while we waited or wrote
        os.replace(tmp, path)
    fsync_dir(path.parent)


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
            staged.append((_temp_file(path, data, mode), path))
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


def write_failure(exc: OSError, path: Path) -> FiCacheError:
    """A write that failed half-way (ENOSPC, EDQUOT, EIO) as one line naming the file: a
    storage failure (exit 1). The OSError alone names no file: write(2) has no path."""
    return FiCacheError(f"cannot write: {exc.strerror or exc} (nothing was replaced)", path)


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
