"""The flock strategy: the kernel's lock, released when the holder dies (a SIGKILLed warm never
blocks the next one). Used where a probe shows that two open files exclude each other."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fi_cache.errors import Refused
from fi_cache.store.files import TMP_PREFIX, atomic_write
from fi_cache.store.locks.api import (
    HOLDER_NAME,
    LOCK_NAME,
    Holder,
    LockStrategy,
    NamespaceBusy,
    OnWait,
    clear_non_lock,
    holder_bytes,
    read_holder,
    timeout_error,
    unlink_if_same,
    with_guard,
)
from fi_cache.store.locks.in_use import PROBE_FLAGS, flock_refused, in_use

# Descriptors of the namespace locks this process holds, by dir: a guard process inherits them,
# so the lock stays held (one open file description) until the guard has stopped the engine.
HELD: dict[str, int] = {}


class Flock(LockStrategy):
    name = "flock"

    @contextlib.contextmanager
    def acquire(
        self, directory: Path, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> Iterator[None]:
        import fcntl  # POSIX only; the lockfile strategy is picked elsewhere

        lock_file, holder_file = directory / LOCK_NAME, directory / HOLDER_NAME
        clear_non_lock(lock_file)  # a link would lead the lock out of the namespace
        clear_non_lock(holder_file)
        fd = _acquired(lock_file, holder_file, time.monotonic() + timeout, timeout, on_wait)
        HELD[str(directory)] = fd
        try:
            mine: os.stat_result | None = None
            try:
                atomic_write(holder_file, holder_bytes(me), lock=False)
                mine = os.stat(holder_file)
                yield
            finally:
                if mine is not None:  # the dir may have been replaced: never remove another's
                    unlink_if_same(holder_file, mine)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            HELD.pop(str(directory), None)
            os.close(fd)  # the kernel drops the lock with the last descriptor, even on SIGKILL

    @contextlib.contextmanager
    def try_acquire(self, directory: Path, me: Holder) -> Iterator[None]:
        import fcntl

        lock_file = directory / LOCK_NAME
        clear_non_lock(lock_file)
        try:
            fd = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # moved away just now (an import or another prune): not ours
            raise NamespaceBusy(directory, None) from None
        except OSError as exc:
            raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise NamespaceBusy(directory, read_holder(directory / HOLDER_NAME)) from None
            try:
                if in_use(directory) or not _same_file(fd, lock_file):
                    # A server holds it, or an import replaced the dir since our open: what the
                    # caller judged is no longer there, so leave it for next time.
                    raise NamespaceBusy(directory, None)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def probe(self, directory: Path) -> tuple[bool, Holder | None]:
        """A lock file that cannot be opened counts as held: whoever cannot probe it cannot
        take it either."""
        import fcntl

        if in_use(directory):
            return True, None  # a running server (serve) holds it
        try:
            fd = os.open(directory / LOCK_NAME, PROBE_FLAGS)
        except FileNotFoundError:
            return False, None
        except OSError:
            return True, read_holder(directory / HOLDER_NAME)
        try:
            # Shared, so that two probes never see each other as holders.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, read_holder(directory / HOLDER_NAME)
        except OSError:
            return False, None  # flock unsupported here: nobody can hold it either
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False, None
        finally:
            os.close(fd)


def held(lock_file: Path) -> bool:
    """Does a live process hold `lock_file` by flock (a flock-strategy holder)? Creates nothing;
    False where flock is not available."""
    try:
        import fcntl
    except ImportError:
        return False
    return flock_refused(lock_file, fcntl.LOCK_SH)  # shared: two lookers never block each other


def _same_file(fd: int, path: Path) -> bool:
    """Is the locked descriptor still the file at `path`? (An import or prune may have moved
    the namespace, and its lock file with it, while we waited.)"""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _acquired(
    lock_file: Path,
    holder_file: Path,
    deadline: float,
    timeout: float,
    on_wait: OnWait | None,
) -> int:
    """A descriptor of `lock_file` holding LOCK_EX, reopened if the file was replaced meanwhile."""
    import fcntl

    waited = False
    vanished = 0
    while True:
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # the dir was moved between the mkdir and the open
            vanished += 1
            if vanished < 10:
                continue
            raise Refused("cannot lock: the directory keeps disappearing", lock_file) from None
        except OSError as exc:
            raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait:
                    on_wait(read_holder(holder_file))
                waited = True
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise timeout_error(read_holder(holder_file), timeout, lock_file) from None
                time.sleep(0.1)
        if _same_file(fd, lock_file):
            return fd
        os.close(fd)  # we locked a file that was moved away: lock the one there now


def honoured(directory: Path) -> bool:
    """Two open file descriptions must exclude each other; some network filesystems let both in."""
    where = directory
    for _ in range(5):
        try:
            # A name of its own: probes of one dir by two processes must not lock each other.
            a, probe = tempfile.mkstemp(dir=where, prefix=f"{TMP_PREFIX}flock-")
        except FileNotFoundError:  # an import or prune moved the dir away just now
            where = _existing_parent(where)  # the same filesystem answers as well
            continue
        except OSError:
            return False
        try:
            verdict = _excludes(a, probe)
        finally:
            os.close(a)
            with contextlib.suppress(OSError):
                os.unlink(probe)
        if verdict is not None:
            return verdict
        where = _existing_parent(where)
    return False


def _existing_parent(path: Path) -> Path:
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return parent


def _excludes(a: int, probe: str) -> bool | None:
    """Does a second open of `probe` fail to flock while `a` holds it? None: the dir was moved
    before the second open, so ask again."""
    import fcntl

    try:
        b = os.open(probe, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    except OSError:
        return False
    finally:
        os.close(b)


def add_guard(directory: Path, guard: int) -> None:
    """Name `guard` in the holder file (what a waiting warm prints); the lock itself passes to
    the guard with the descriptor in HELD."""
    holder_file = directory / HOLDER_NAME
    holder = read_holder(holder_file)
    if holder is not None and holder.pid == os.getpid():
        with contextlib.suppress(OSError):
            atomic_write(holder_file, holder_bytes(with_guard(holder, guard)), lock=False)
