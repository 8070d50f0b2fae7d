"""The contract every engine keeps: a program fi-cache runs to fill a namespace with FlashInfer
autotune caches (vLLM's `vllm serve`, FlashInfer's own autotuner in a child process).

Each engine is a package with the same modules: `engine.py` (this contract), `launch.py`
(starting and stopping its process, as a group), `warm.py` (one warm: lock, run, record).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from fi_cache.caches.discover import is_v2_env_dir
from fi_cache.errors import FiCacheError
from fi_cache.store.manifest import Manifest


def _present(path: Path) -> bool:
    return path.is_file() or is_v2_env_dir(path)


class WarmFailed(FiCacheError):
    """The engine exited early, timed out, or wrote no cache; `lines` are its last log lines."""

    def __init__(self, message: str, lines: list[str], log: list[str] | None = None) -> None:
        super().__init__(message)
        self.lines = lines
        self.log = log if log is not None else lines  # all it printed (bounded), for a log file


class Engine(ABC):
    """What fi-cache needs to know about one engine."""

    name: ClassVar[str]  # `--engine NAME`, and the `engine` of its warm records
    cache_subdir: ClassVar[str]  # where its caches live inside a namespace

    def cache_dir(self, ns_dir: Path) -> Path:
        """Where this engine's caches land inside the namespace `ns_dir`."""
        return ns_dir / self.cache_subdir

    @abstractmethod
    def find_executable(self, explicit: str | None) -> str:
        """The program to run: `explicit` (a flag), else the engine's variable, else its
        default. Raises Refused when there is none."""

    @abstractmethod
    def read_args(self, argv: Sequence[str]) -> Any:
        """What fi-cache needs from the engine's arguments. Raises Refused where the engine
        itself would reject them."""

    @abstractmethod
    def warm_key(self, args: Any, finalize: str) -> str:
        """What makes two warms of one namespace "the same" (recorded as `argv_key`)."""

    def is_warm(self, ns_dir: Path, m: Manifest | None, args: Any, finalize: str) -> bool:
        """A successful warm of these arguments is recorded and its caches are still there: v1
        files, or FlashInfer v2 store dirs (vLLM 0.33 with one rank records its env dir)."""
        last = m.last_warm(self.warm_key(args, finalize)) if m else None
        return last is not None and all(_present(ns_dir / f.path) for f in last.files)
