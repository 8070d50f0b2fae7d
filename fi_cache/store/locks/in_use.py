"""Namespaces in use by a running server (serve).

`serve` execs vLLM holding a shared flock on this file (the descriptor survives the exec), so a
prune never deletes the namespace of a server that is still running. Warms do not look at it.
"""

from __future__ import annotations

import os
from pathlib import Path

IN_USE_NAME = ".fi-cache.inuse"
# Opening only to flock: O_NONBLOCK, so a FIFO planted at the path never makes the open wait.
PROBE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


def mark(directory: Path) -> int | None:
    """Hold a shared flock on `directory`'s in-use file until this process (or what it execs)
    exits; None where that cannot be done."""
    import fcntl

    try:
        fd = os.open(directory / IN_USE_NAME, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        return None  # a read-only store: nothing can prune it from here either
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    return fd


def in_use(directory: Path) -> bool:
    """Does a running server hold `directory`? Creates nothing."""
    import fcntl

    return flock_refused(directory / IN_USE_NAME, fcntl.LOCK_EX)  # servers hold it shared


def flock_refused(path: Path, mode: int) -> bool:
    """Would a flock of `path` in `mode` (fcntl.LOCK_EX or LOCK_SH) be refused now, i.e. does a
    live process hold it in a conflicting mode? False when `path` cannot be opened or flocked.
    Creates nothing, and holds nothing afterwards."""
    import fcntl

    try:
        fd = os.open(path, PROBE_FLAGS)
    except OSError:
        return False
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
