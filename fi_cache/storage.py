"""The one module that writes to disk: temp file + fsync + rename, under a lock.

Readers never see a half-written file: data goes to a temp file in the target's directory,
is fsynced, then renamed over the target (atomic on POSIX within one filesystem), and the
directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import filelock

from fi_cache.errors import FiCacheError, Refused

# Our temp files; doctor's tmp-leftover check knows this prefix.
TMP_PREFIX = ".fi-cache-"
LOCK_SUFFIX = ".lock"
DEFAULT_LOCK_TIMEOUT = 60.0


def lock_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def locked(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the lock that guards `path` (a sibling `.NAME.lock` file)."""
    lock_file = lock_path_for(path)
    _ensure_dir(lock_file.parent)
    lock = filelock.FileLock(str(lock_file), timeout=timeout)
    try:
        with lock:
            yield
    except filelock.Timeout:
        raise FiCacheError(
            f"timed out after {timeout:.0f}s waiting for the lock {lock_file}", path
        ) from None


def _ensure_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot create directory: {exc.strerror}", directory) from None


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    lock: bool = True,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix."""
    if lock:
        with locked(path, timeout):
            _replace(path, data, mode)
    else:
        _replace(path, data, mode)


def _replace(path: Path, data: bytes, mode: int) -> None:
    _ensure_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".tmp")
    except OSError as exc:
        raise Refused(f"cannot write here: {exc.strerror}", path.parent) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
