"""Logs fi-cache keeps for the user: a failed warm's whole vLLM output, where `doctor --log` can
read it. The newest few are kept; older ones go when a new one is written."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from fi_cache.store.files import atomic_write
from fi_cache.store.paths import state_dir

KEEP = 20  # failed warms' logs kept per store


def save_failed_warm(store: Path, lines: Sequence[str]) -> Path:
    """`<store>/.fi-cache/logs/warm-failed-<time>.log`; raises FiCacheError/OSError."""
    logs = state_dir(store) / "logs"
    path = logs / f"warm-failed-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}.log"
    atomic_write(path, ("\n".join(lines) + "\n").encode(), lock=False)
    for old in sorted(logs.glob("warm-failed-*.log"))[:-KEEP]:
        with contextlib.suppress(OSError):
            old.unlink()
    return path
