"""The contract every namespace-lock strategy keeps, and what they share: who holds a lock.

A strategy takes a namespace's lock waiting (`acquire`), without waiting (`try_acquire`), or
only looks (`probe`); flock.py and lockfile.py are the two strategies.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from fi_cache.errors import FiCacheError, read_regular

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

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.purpose} by pid {self.pid} on host {self.host} since {when}"

    def live(self) -> bool:
        """Is the holder (or its guard, still stopping what the holder started) alive? Only
        meaningful on the holder's host."""
        return alive(self.pid) or (self.guard is not None and alive(self.guard))


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
    return Holder(os.getpid(), socket.gethostname(), time.time(), purpose)


def read_holder(path: Path) -> Holder | None:
    try:  # a FIFO planted as the lock or holder file is refused at once, not waited on
        data = json.loads(read_regular(path, "lock holder record", _MAX_HOLDER_BYTES))
        guard = data.get("guard")
        return Holder(
            int(data["pid"]), str(data["host"]), float(data["since"]), str(data["purpose"]),
            int(guard) if guard is not None else None,
        )  # fmt: skip
    except (FiCacheError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


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


def unlink_if_same(path: Path, mine: os.stat_result) -> None:
    """Remove our lock file, never one another process made where ours was."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            path.unlink()
