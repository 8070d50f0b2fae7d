"""The store's lowest floor: directories, temp files and fsynced renames, no locks.

Readers never see a half-written file: data goes to a temp file in the target's directory,
is fsynced, then renamed over the target (atomic on POSIX within one filesystem), and the
directory is fsynced so the rename survives a crash. Locks (locks/) sit on top of this, and
files.py on top of both: the rest of fi-cache writes through files.py.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused, special_kind

# Our temp files; doctor's tmp-leftover check knows this prefix.
TMP_PREFIX = ".fi-cache-"


def ensure_dir(directory: Path) -> None:
    """mkdir -p; a failure is one Refused line naming the directory."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot create directory: {exc.strerror}", directory) from None


def replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix; the
    caller holds the lock that keeps other writers out (or needs none). What is at `path` must
    be a regular file (or nothing): see `refuse_destination`."""
    refuse_destination(path, "file")
    tmp = temp_file(path, data, mode)
    with _cleaned_up(tmp, path):
        refuse_destination(path, "file")  # again: a node made while we waited or wrote
        os.replace(tmp, path)
    fsync_dir(path.parent)


def temp_file(path: Path, data: bytes, mode: int) -> str:
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
    """Refuse early, in one line, where no lock could be taken (a read-only store)."""
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
