"""Where the fi-cache store lives (pure path logic; the store package does the writing)."""

from __future__ import annotations

import os
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
