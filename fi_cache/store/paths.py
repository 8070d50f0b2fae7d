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
