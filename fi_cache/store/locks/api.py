"""The contract every lock strategy keeps, and what they share: where a lock lives (`Site`: a
namespace's, or one file's) and who holds it (`Holder`).

A strategy takes a lock waiting (`acquire`), without waiting (`try_acquire`), or only looks
(`probe`); flock.py and lockfile.py are the two strategies.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fi_cache.errors import FiCacheError, Refused, read_regular, special_kind
from fi_cache.store.atomic import TMP_PREFIX
from fi_cache.store.locks import process

LOCK_NAME = ".fi-cache.lock"
HOLDER_NAME = ".fi-cache.lock.holder"
LOCK_SUFFIX = ".lock"  # a file's lock: `.NAME.lock` beside it
DEFAULT_LOCK_TIMEOUT = 60.0
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


@dataclass(frozen=True)
class Site:
    """Where one lock lives. A namespace's: `.fi-cache.lock` in its dir, flock's holder record
    beside it, serve's in-use mark honoured, and what no lock makes at its name cleared away. A
    file's: `.NAME.lock` beside the file, nothing else; it sits in a dir the user named (`merge
    -o`), so what is at its name and is no lock file (a symlink, a FIFO) is refused instead."""

    lock_file: Path
    guarded: Path  # the namespace dir or the file: what a message names
    namespace: bool

    @classmethod
    def of_namespace(cls, directory: Path) -> Site:
        return cls(directory / LOCK_NAME, directory, True)

    @classmethod
    def of_file(cls, path: Path) -> Site:
        return cls(path.with_name(f".{path.name}{LOCK_SUFFIX}"), path, False)

    @property
    def holder_file(self) -> Path | None:
        """Who holds a flock (its lock file stays empty); a file's lock names nobody there."""
        return self.lock_file.with_name(HOLDER_NAME) if self.namespace else None

    def clear(self) -> None:
        """Make way at the lock name: what no lock strategy makes there is cleared from a
        namespace (`clear_non_lock`), and refused beside a file."""
        if self.namespace:
            clear_non_lock(self.lock_file)
        elif (kind := non_lock_kind(self.lock_file)) is not None:
            what = "refusing to follow it" if kind == "a symlink" else "not a lock file"
            raise self.refused(f"its lock file {self.lock_file.name} is {kind}: {what}")

    def refused(self, why: str) -> Refused:
        if self.namespace:
            return Refused(f"cannot lock: {why}", self.lock_file)
        return Refused(f"cannot write here: {why}", self.guarded)

    def cannot_open(self, exc: OSError) -> Refused:
        """The lock file cannot be made or opened: one line (exit 2), never a wait."""
        if exc.errno == errno.ELOOP or os.path.islink(self.lock_file):  # planted after `clear`
            why = f"its lock file {self.lock_file.name} is a symlink: refusing to follow it"
            return self.refused(why)
        if self.namespace:
            return self.refused(str(exc.strerror))
        return self.refused(f"cannot create its lock file {self.lock_file.name} ({exc.strerror})")

    def vanished(self, exc: FileNotFoundError) -> Refused:
        """No lock file could be made in ten tries, each after the dir was made again."""
        if self.lock_file.parent.is_dir():  # the dir is there: nothing can be made in it (/proc)
            return self.cannot_open(exc)
        return self.refused("the directory keeps disappearing")

    def timed_out(self, holder: Holder | None, timeout: float) -> FiCacheError:
        who = holder.describe() if holder else "another process"
        if self.namespace:
            return FiCacheError(f"timed out after {timeout:.0f}s waiting for {who}", self.lock_file)
        return FiCacheError(
            f"timed out after {timeout:.0f}s waiting for {who} (lock file {self.lock_file})",
            self.guarded,
        )


class LockStrategy(ABC):
    """One way of taking a lock at a `Site`. `acquire` is called where the lock file's dir
    exists; `try_acquire` and `probe` on a namespace that may have been moved away just now
    (prune), and say so."""

    name: str

    @abstractmethod
    def acquire(
        self, site: Site, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> AbstractContextManager[None]:
        """Hold the lock, waiting up to `timeout` (on_wait(holder) once if someone has it);
        raises FiCacheError naming the holder when it passes."""

    @abstractmethod
    def try_acquire(self, site: Site, me: Holder) -> AbstractContextManager[None]:
        """Hold the lock without waiting, creating nothing but the lock itself; raises
        NamespaceBusy when it is held, Refused when it cannot be taken."""

    @abstractmethod
    def probe(self, site: Site) -> tuple[bool, Holder | None]:
        """(held, holder), creating and changing nothing."""


def this_holder(purpose: str) -> Holder:
    pid = os.getpid()
    # uname's nodename is what gethostname() answers, without loading socket on every command
    return Holder(
        pid,
        os.uname().nodename,
        time.time(),
        purpose,
        boot=process.boot_id(),
        start=process.start_ticks(pid),
    )


def with_guard(holder: Holder, guard: int) -> Holder:
    """`holder` naming `guard` too, and which process it is."""
    return replace(holder, guard=guard, guard_start=process.start_ticks(guard))


def read_holder(path: Path) -> Holder | None:
    try:  # a FIFO planted as the lock or holder file is refused at once, not waited on
        data = json.loads(read_regular(path, "lock holder record", _MAX_HOLDER_BYTES))
        guard, boot = data.get("guard"), data.get("boot")
        return Holder(
            int(data["pid"]),
            str(data["host"]),
            float(data["since"]),
            str(data["purpose"]),
            _int_or_none(guard),
            str(boot) if boot is not None else None,
            _int_or_none(data.get("start")),
            _int_or_none(data.get("guard_start")),
        )
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
