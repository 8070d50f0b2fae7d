"""The contract every namespace-lock strategy keeps, and what they share: who holds a lock.

A strategy takes a namespace's lock waiting (`acquire`), without waiting (`try_acquire`), or
only looks (`probe`); flock.py and lockfile.py are the two strategies.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fi_cache.errors import FiCacheError, Refused, read_regular, special_kind
from fi_cache.store.files import TMP_PREFIX
from fi_cache.store.locks import process

LOCK_NAME = ".fi-cache.lock"
HOLDER_NAME = ".fi-cache.lock.holder"
_MAX_HOLDER_BYTES = 64 << 10  # a holder record is ~100 bytes of JSON


@dataclass(frozen=True)
class Holder:
    """Who holds a namespace lock, for the waiting message."""

    pid: int
    host: str
    since: float
    purpose: str
    guard: int | None = None  # a process that keeps holding it while the holder's child lives
    # Which processes these pids were (process.py): a pid alive now may be another one's.
    boot: str | None = None
    start: int | None = None
    guard_start: int | None = None

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.purpose} by pid {self.pid} on host {self.host} since {when}"

    def live(self) -> bool:
        """Is the holder (or its guard, still stopping what the holder started) alive? Only
        meaningful on the holder's host. After a reboot, or once a pid is reused, the process
        alive under that number is not the one recorded: pid 1 after a reboot, say."""
        if process.before_this_boot(self.boot, self.since):
            return False
        if alive(self.pid) and process.is_process(self.pid, self.start, self.since):
            return True
        guard = self.guard
        return guard is not None and alive(guard) and process.is_guard(guard, self.guard_start)


OnWait = Callable[[Holder | None], None]


class NamespaceBusy(FiCacheError):
    """Someone else holds the namespace's lock (`holder`, when known)."""

    def __init__(self, directory: Path, holder: Holder | None) -> None:
        who = holder.describe() if holder else "another process"
        super().__init__(f"in use: locked for {who}", directory)
        self.holder = holder


class LockStrategy(ABC):
    """One way of locking a namespace dir. `acquire` is called on an existing dir; `try_acquire`
    and `probe` on one that may have been moved away just now (prune), and say so."""

    name: str

    @abstractmethod
    def acquire(
        self, directory: Path, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> AbstractContextManager[None]:
        """Hold the lock, waiting up to `timeout` (on_wait(holder) once if someone has it);
        raises FiCacheError naming the holder when it passes."""

    @abstractmethod
    def try_acquire(self, directory: Path, me: Holder) -> AbstractContextManager[None]:
        """Hold the lock without waiting, creating nothing but the lock itself; raises
        NamespaceBusy when it is held, Refused when it cannot be taken."""

    @abstractmethod
    def probe(self, directory: Path) -> tuple[bool, Holder | None]:
        """(held, holder), creating and changing nothing."""


def this_holder(purpose: str) -> Holder:
    pid = os.getpid()
    return Holder(
        pid, socket.gethostname(), time.time(), purpose,
        boot=process.boot_id(), start=process.start_ticks(pid),
    )  # fmt: skip


def with_guard(holder: Holder, guard: int) -> Holder:
    """`holder` naming `guard` too, and which process it is."""
    return replace(holder, guard=guard, guard_start=process.start_ticks(guard))


def read_holder(path: Path) -> Holder | None:
    try:  # a FIFO planted as the lock or holder file is refused at once, not waited on
        data = json.loads(read_regular(path, "lock holder record", _MAX_HOLDER_BYTES))
        guard, boot = data.get("guard"), data.get("boot")
        return Holder(
            int(data["pid"]), str(data["host"]), float(data["since"]), str(data["purpose"]),
            _int_or_none(guard), str(boot) if boot is not None else None,
            _int_or_none(data.get("start")), _int_or_none(data.get("guard_start")),
        )  # fmt: skip
    except (FiCacheError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def holder_bytes(holder: Holder) -> bytes:
    return json.dumps(holder.__dict__).encode()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def timeout_error(holder: Holder | None, timeout: float, lock_file: Path) -> FiCacheError:
    who = holder.describe() if holder else "another process"
    return FiCacheError(f"timed out after {timeout:.0f}s waiting for {who}", lock_file)


def non_lock_kind(path: Path) -> str | None:
    """What is at lock path `path` when it is something no lock strategy makes there ("a
    directory", "a symlink", "a FIFO"...); None for a regular file or nothing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a symlink" if stat.S_ISLNK(mode) else special_kind(mode) or "no regular file"


def clear_non_lock(path: Path) -> None:
    """Clear what `non_lock_kind` finds at lock path `path`, which would block every lock (or,
    a symlink, lead the lock's file out of the namespace): an empty directory is removed, a link,
    FIFO, socket or device moved aside and deleted. A directory holding something is Refused,
    saying what to do: it is not fi-cache's to delete."""
    if (kind := non_lock_kind(path)) is None:
        return
    if kind == "a directory":
        try:
            os.rmdir(path)  # only when empty: never a lock file someone made meanwhile
        except FileNotFoundError:
            pass
        except OSError:
            raise Refused(
                f"{path.name} is a directory, not a lock file: move it out of the namespace, "
                "then run again",
                path,
            ) from None
        return
    aside = path.with_name(f"{TMP_PREFIX}non-lock-{os.getpid()}-{time.time_ns()}.tmp")
    try:
        os.rename(path, aside)  # the name, never what a link points to
    except FileNotFoundError:
        return  # cleared by another process just now
    except OSError as exc:
        raise Refused(
            f"{path.name} is {kind}, not a lock file, and cannot be moved: {exc.strerror}", path
        ) from None
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(aside).st_mode):  # a lock file made since we looked: put back
            os.link(aside, path, follow_symlinks=False)
        os.unlink(aside)


def unlink_if_same(path: Path, mine: os.stat_result) -> None:
    """Remove our lock file, never one another process made where ours was."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            path.unlink()
