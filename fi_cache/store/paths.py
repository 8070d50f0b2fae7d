"""Where the fi-cache store lives (pure path logic; the store package does the writing)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

STORE_ENV = "FI_CACHE_DIR"


def default_store() -> Path:
    """`$FI_CACHE_DIR`, else the platform's user cache dir for fi-cache."""
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs  # deferred: only needed when no store is given

    return Path(platformdirs.user_cache_dir("fi-cache", appauthor=False))


def state_dir(store: Path) -> Path:
    """fi-cache's own bookkeeping (probe results), kept apart from the caches."""
    return store / ".fi-cache"


def checked_store(path: Path) -> Path:
    """`path` (from --store or $FI_CACHE_DIR) absolute and symlink-free, so paths inside the
    store compare equal however they were spelled; Refused (exit 2) when it cannot be a store:
    a symlink loop on the way, or something other than a directory there (a file, a FIFO)."""
    from fi_cache.errors import Refused, special_kind

    path = path.expanduser()
    try:
        resolved = path.resolve()
        mode: int | None = os.stat(resolved).st_mode
    except RuntimeError:  # Python < 3.13 reports a loop this way
        raise Refused("symlink loop: cannot be the store", path) from None
    except FileNotFoundError:
        mode = None  # made on the first write
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("symlink loop: cannot be the store", path) from None
        if exc.errno == errno.ENOTDIR:
            raise Refused("a parent is no directory: cannot be the store", path) from None
        mode = None  # unreadable: the command that reads it says so
    if mode is not None and not stat.S_ISDIR(mode):
        kind = special_kind(mode) or "a file"
        raise Refused(f"is {kind}, not a directory: cannot be the store", path)
    return resolved


# --- paths read from store state or a bundle ---------------------------------------------------


class Unconfined(ValueError):
    """A path from store state (a manifest, a saved prediction) or a bundle that may not be used:
    its message says why, in words that follow the path."""


def relative_problem(rel: str) -> str | None:
    """Why `rel` is no plain relative path below a dir (pure): absolute, a `..`, `.` or empty
    part, a backslash or a control character; None when it is one. Every writer of store state
    records paths as `a/b/c`, so anything else was written by hand or by an attacker."""
    if not rel:
        return "is empty"
    if rel.startswith("/"):
        return "is absolute"
    if "\\" in rel or any(ord(c) < 32 or c == "\x7f" for c in rel):
        return "holds a backslash or a control character"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "is not normalised (a '..', '.' or empty part)"
    return None


def confined(root: Path, rel: str) -> Path:
    """`root / rel`, when `rel` is a plain relative path (relative_problem) and nothing on the
    way below `root` that exists is a symlink (a link could lead anywhere). Raises Unconfined."""
    if (why := relative_problem(rel)) is not None:
        raise Unconfined(f"{rel!r} {why}")
    path = root
    for part in rel.split("/"):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except OSError:  # missing (or not a dir above): nothing further to follow
            break
        if stat.S_ISLNK(mode):
            raise Unconfined(f"{rel!r} passes through the symlink {path}")
    return root / rel


def within(root: Path, path: Path) -> str:
    """`path` (absolute, from store state) relative to `root`, when it lies inside it as
    `confined` says. Raises Unconfined."""
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        raise Unconfined(f"{str(path)!r} is outside {root}") from None
    confined(root, rel)
    return rel
