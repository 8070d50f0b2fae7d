"""The lock-file strategy, for filesystems where flock is not honoured (NFS without lockd,
Lustre, GPFS, FUSE object stores): an O_EXCL lock file holds pid/host/since, and a dead
holder on this host is recovered."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from fi_cache.errors import Refused
from fi_cache.store.files import ensure_dir
from fi_cache.store.locks.api import (
    LOCK_NAME,
    Holder,
    LockStrategy,
    NamespaceBusy,
    OnWait,
    holder_bytes,
    read_holder,
    timeout_error,
    unlink_if_same,
)


class LockFile(LockStrategy):
    name = "lockfile"

    @contextlib.contextmanager
    def acquire(
        self, directory: Path, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> Iterator[None]:
        lock_file = directory / LOCK_NAME
        deadline = time.monotonic() + timeout
        waited = False
        vanished = 0
        while True:
            try:
                fd = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(lock_file)
                if _break_stale(lock_file, holder, me):
                    continue
                if not waited and on_wait:
                    on_wait(holder)
                waited = True
                if time.monotonic() >= deadline:
                    raise timeout_error(holder, timeout, lock_file) from None
                time.sleep(0.1)
                continue
            except FileNotFoundError:  # an import or prune moved the dir away just now
                vanished += 1
                if vanished >= 10:
                    raise Refused(
                        "cannot lock: the directory keeps disappearing", lock_file
                    ) from None
                ensure_dir(lock_file.parent)
                continue
            except OSError as exc:
                raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
            break
        with _holding(fd, lock_file, me):
            yield

    @contextlib.contextmanager
    def try_acquire(self, directory: Path, me: Holder) -> Iterator[None]:
        lock_file = directory / LOCK_NAME
        for _ in range(2):  # the second try follows the recovery of a dead holder's lock
            try:
                fd = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                holder = read_holder(lock_file)
                if _break_stale(lock_file, holder, me):
                    continue
                raise NamespaceBusy(directory, holder) from None
            except FileNotFoundError:  # moved away just now (an import or another prune)
                raise NamespaceBusy(directory, None) from None
            except OSError as exc:
                raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
        else:
            raise NamespaceBusy(directory, read_holder(lock_file))
        with _holding(fd, lock_file, me):
            yield

    def probe(self, directory: Path) -> tuple[bool, Holder | None]:
        lock_file = directory / LOCK_NAME
        if not os.path.lexists(lock_file):
            return False, None
        holder = read_holder(lock_file)
        if holder and holder.host == socket.gethostname() and not holder.live():
            return False, holder  # a dead holder on this host: the next taker recovers it
        return True, holder


@contextlib.contextmanager
def _holding(fd: int, lock_file: Path, me: Holder) -> Iterator[None]:
    """Write who we are into the lock file we created, and remove it (only it) at the end:
    the directory may have been moved meanwhile and a new lock file made where ours was."""
    mine = os.fstat(fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(holder_bytes(me))
            f.flush()
            os.fsync(f.fileno())
        yield
    finally:
        unlink_if_same(lock_file, mine)


def _break_stale(lock_file: Path, holder: Holder | None, me: Holder) -> bool:
    """Remove the lock of a dead holder on this host, so that of several waiters exactly one
    takes it over: the lock is renamed away (atomic; one rename wins) and checked afterwards."""
    if not holder or holder.host != me.host or holder.live():
        return False
    aside = lock_file.with_name(f"{lock_file.name}.stale-{me.pid}-{time.time_ns()}")
    try:
        os.rename(lock_file, aside)
    except FileNotFoundError:
        return True  # someone else moved it first: try to create ours again
    except OSError:
        return False  # we may not move it (another user's, in a sticky dir): wait, with timeout
    if read_holder(aside) == holder:
        with contextlib.suppress(OSError):
            aside.unlink()
    else:  # we moved a fresh lock someone took meanwhile: put it back unless replaced
        with contextlib.suppress(OSError):
            os.link(aside, lock_file)
        with contextlib.suppress(OSError):
            aside.unlink()
    return True


def add_guard(directory: Path, guard: int) -> None:
    """Name `guard` in the lock file this process holds (same file, rewritten in place): the
    lock is not stale while the guard lives, even after this process died."""
    lock_file = directory / LOCK_NAME
    holder = read_holder(lock_file)
    if holder is None or holder.pid != os.getpid():
        return
    with open(lock_file, "r+b") as f:
        f.write(holder_bytes(replace(holder, guard=guard)))
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
