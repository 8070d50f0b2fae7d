"""Which process a pid is now: what tells a lock's holder from a newcomer that got its number.

A lock file outlives its holder across a reboot (the lock-file strategy, on filesystems that do
not honour flock) and pids are reused, so "a process with that pid is alive" is not "the holder
is alive": pid 1 is always alive after a reboot. Linux's /proc says when this boot began
(`boot_id`, `btime`) and when a process started (`starttime`, in clock ticks since boot), which
together name one process for the life of the machine. Elsewhere every answer is None and a
live pid counts as the holder, as before.
"""

from __future__ import annotations

import contextlib
import os

# btime is whole seconds and a holder writes `since` just after it starts: a record without a
# start time belongs to a process that started no later than this after `since`.
CLOCK_SLACK_S = 2.0


def boot_id() -> str | None:
    """This boot's random id, new at every boot."""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip() or None
    return None


def _stat_field(pid: int, index: int) -> int | None:
    """Field `index` of /proc/PID/stat counted after the name (0: the state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name in (...) may hold spaces
        return int(fields[index])
    except (OSError, IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (/proc/PID/stat field 22)."""
    return _stat_field(pid, 19)


def session(pid: int) -> int | None:
    """The session `pid` is in (/proc/PID/stat field 6)."""
    return _stat_field(pid, 3)


def boot_time() -> float | None:
    """When this boot began, in seconds since the epoch (/proc/stat btime)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return None


def started_at(pid: int) -> float | None:
    """When `pid` started, in seconds since the epoch."""
    ticks, booted = start_ticks(pid), boot_time()
    if ticks is None or booted is None:
        return None
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def before_this_boot(recorded_boot: str | None, since: float) -> bool:
    """Was a record (its boot id, when it has one; else its time) written before this boot?"""
    if recorded_boot is not None and (now := boot_id()) is not None:
        return recorded_boot != now
    booted = boot_time()
    return booted is not None and since < booted - CLOCK_SLACK_S


def is_process(pid: int, start: int | None, since: float | None = None) -> bool:
    """Is the live `pid` the process a record names: the one that started `start` ticks after
    boot or, in a record without it, one that started before the record's `since` (None: any)?"""
    if start is not None:
        now = start_ticks(pid)
        return now is None or now == start  # no /proc to ask: a live pid counts
    if since is None:
        return True
    began = started_at(pid)
    return began is None or began <= since + CLOCK_SLACK_S


def is_guard(pid: int, start: int | None) -> bool:
    """Is the live `pid` the guard a record names: the one that started `start` ticks after
    boot or, in a record without it (written before guards' starts were), a process leading a
    session of its own, as every guard does (`since` tells nothing: a guard starts after it)?"""
    if start is not None:
        return is_process(pid, start)
    return session(pid) in (None, pid)  # no /proc to ask: a live pid counts
