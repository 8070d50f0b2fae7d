"""Namespaces in use by a running server (serve), and when one was last served.

`serve` execs vLLM holding a shared flock on this file (the descriptor survives the exec), so a
prune never deletes the namespace of a server that is still running. Warms do not look at it.
Its mtime is the namespace's last serve (prune's "last used" with the manifest's): one utime, no
manifest rewrite, so a serve changes nothing its next pre-flight reads (lifecycle/serve_memo/).
Light on purpose: serve's memo path imports it before anything else.
"""

from __future__ import annotations

import contextlib
import os
import stat

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False

if TYPE_CHECKING:  # pathlib costs serve's memo path 3 ms: paths are joined as strings here
    from pathlib import Path

IN_USE_NAME = ".fi-cache.inuse"
# Opening only to flock: O_NONBLOCK, so a FIFO planted at the path never makes the open wait.
PROBE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


_OPEN_FLAGS = os.O_CREAT | os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)


def note_served(directory: Path | str) -> None:
    """Record a serve of `directory` now (the in-use file's mtime); a read-only store, or a
    file that is not ours to touch, skips it."""
    try:
        fd = os.open(os.path.join(directory, IN_USE_NAME), _OPEN_FLAGS, 0o644)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.utime(fd)
    finally:
        os.close(fd)


def served_at(directory: Path | str) -> float | None:
    """When `directory` was last served (note_served), or None."""
    try:
        st = os.lstat(os.path.join(directory, IN_USE_NAME))
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def mark(directory: Path | str) -> int | None:
    """Note a serve of `directory` now (as note_served, through the same open), and hold a
    shared flock on its in-use file until this process (or what it execs) exits; None where
    the flock cannot be held."""
    import fcntl

    try:  # O_NOFOLLOW: a link planted there is not followed out of the store
        fd = os.open(os.path.join(directory, IN_USE_NAME), _OPEN_FLAGS, 0o644)
    except OSError:
        return None  # a read-only store: nothing can prune it from here either
    with contextlib.suppress(OSError):  # a file that is not ours to touch: no note
        os.utime(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    return fd


def in_use(directory: Path | str) -> bool:
    """Does a running server hold `directory`? Creates nothing."""
    import fcntl

    # servers hold it shared
    return flock_refused(os.path.join(directory, IN_USE_NAME), fcntl.LOCK_EX)


def flock_refused(path: Path | str, mode: int) -> bool:
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
