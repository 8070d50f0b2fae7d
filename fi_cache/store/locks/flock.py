"""The flock strategy: the kernel's lock, released when the holder dies (a SIGKILLed warm never
blocks the next one). Used where a probe shows that two open files exclude each other."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fi_cache.store import atomic
from fi_cache.store.atomic import TMP_PREFIX
from fi_cache.store.in_use import PROBE_FLAGS, flock_refused, in_use
from fi_cache.store.locks.api import (
    HOLDER_NAME,
    Holder,
    LockStrategy,
    NamespaceBusy,
    OnWait,
    Site,
    clear_non_lock,
    holder_bytes,
    read_holder,
    unlink_if_same,
    with_guard,
)

# Descriptors of the locks this process holds, by lock file: a guard process inherits a
# namespace's, so it stays held (one open file description) until the guard has stopped the engine.
HELD: dict[str, int] = {}
# O_NOFOLLOW: a symlink planted at a lock name is never followed out of its dir (nothing is made
# at its target); O_NONBLOCK: a FIFO planted there never makes the open wait.
_OPEN_FLAGS = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


def _holder(site: Site) -> Holder | None:
    return read_holder(site.holder_file) if site.holder_file is not None else None


class Flock(LockStrategy):
    name = "flock"

    @contextlib.contextmanager
    def acquire(
        self, site: Site, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> Iterator[None]:
        import fcntl  # POSIX only; the lockfile strategy is picked elsewhere

        site.clear()  # a link would lead the lock out of its dir
        holder_file = site.holder_file
        if holder_file is not None:
            clear_non_lock(holder_file)
        fd = _acquired(site, time.monotonic() + timeout, timeout, on_wait)
        HELD[str(site.lock_file)] = fd
        try:
            mine: os.stat_result | None = None
            try:
                if holder_file is not None:
                    atomic.replace(holder_file, holder_bytes(me))
                    mine = os.stat(holder_file)
                yield
            finally:
                if holder_file is not None and mine is not None:  # never remove another's
                    unlink_if_same(holder_file, mine)  # (the dir may have been replaced)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            HELD.pop(str(site.lock_file), None)
            os.close(fd)  # the kernel drops the lock with the last descriptor, even on SIGKILL

    @contextlib.contextmanager
    def try_acquire(self, site: Site, me: Holder) -> Iterator[None]:
        import fcntl

        lock_file = site.lock_file
        site.clear()
        try:
            fd = os.open(lock_file, _OPEN_FLAGS, 0o644)
        except FileNotFoundError:  # moved away just now (an import or another prune): not ours
            raise NamespaceBusy(site.guarded, None) from None
        except OSError as exc:
            raise site.cannot_open(exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise NamespaceBusy(site.guarded, _holder(site)) from None
            try:
                if _served(site) or not _same_file(fd, lock_file):
                    # A server holds it, or an import replaced the dir since our open: what the
                    # caller judged is no longer there, so leave it for next time.
                    raise NamespaceBusy(site.guarded, None)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def probe(self, site: Site) -> tuple[bool, Holder | None]:
        """A lock file that cannot be opened counts as held: whoever cannot probe it cannot
        take it either."""
        import fcntl

        if _served(site):
            return True, None  # a running server (serve) holds it
        try:
            fd = os.open(site.lock_file, PROBE_FLAGS)
        except FileNotFoundError:
            return False, None
        except OSError:
            return True, _holder(site)
        try:
            # Shared, so that two probes never see each other as holders.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, _holder(site)
        except OSError:
            return False, None  # flock unsupported here: nobody can hold it either
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False, None
        finally:
            os.close(fd)


def _served(site: Site) -> bool:
    """A namespace a running server uses (its in-use mark) is held too."""
    return site.namespace and in_use(site.guarded)


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


def _acquired(site: Site, deadline: float, timeout: float, on_wait: OnWait | None) -> int:
    """A descriptor of the lock file holding LOCK_EX, reopened if it was replaced meanwhile."""
    import fcntl

    lock_file = site.lock_file
    waited = False
    vanished = 0
    while True:
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_file, _OPEN_FLAGS, 0o644)
        except FileNotFoundError as exc:  # the dir was moved between the mkdir and the open
            vanished += 1
            if vanished < 10:
                continue
            raise site.vanished(exc) from None
        except OSError as exc:
            raise site.cannot_open(exc) from None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait:
                    on_wait(_holder(site))
                waited = True
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise site.timed_out(_holder(site), timeout) from None
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
            atomic.replace(holder_file, holder_bytes(with_guard(holder, guard)))
