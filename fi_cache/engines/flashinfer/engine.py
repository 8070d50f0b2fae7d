"""FlashInfer's own autotuner as an engine: a tuning child (`python -m fi_cache.engines.flashinfer`)
runs a plan's ops under `flashinfer.autotune(True, cache=FILE)`, without vLLM or weights."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.engines.api import Engine
from fi_cache.engines.flashinfer.plan import Plan
from fi_cache.errors import Refused, read_regular

PYTHON_ENV = "FI_CACHE_PYTHON"


@dataclass(frozen=True)
class PlanArgs:
    """A tuning plan as read from its file (the text is the warm's identity)."""

    path: Path
    plan: Plan
    text: str


class FlashInfer(Engine[PlanArgs]):
    name = "flashinfer"
    cache_subdir = "flashinfer"  # inside a namespace: files FlashInfer wrote for `autotune(cache=)`

    def find_executable(self, explicit: str | None) -> str:
        """The Python with FlashInfer (a serving venv's python), else fi-cache's own."""
        return explicit or os.environ.get(PYTHON_ENV) or sys.executable

    def read_args(self, argv: Sequence[str]) -> PlanArgs:
        """argv = [PLAN]: the plan file. Refused (exit 2) for an unreadable or invalid plan."""
        from fi_cache.engines.flashinfer import plan as plans

        [name] = argv
        path = Path(name)
        try:  # a FIFO or /dev/zero named as the plan is refused, never waited on or read whole
            text = read_regular(path, "plan file", plans.MAX_PLAN_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise Refused("not a text file (a TOML plan is UTF-8 text)", path) from None
        return PlanArgs(path, plans.loads(text, str(path)), text)

    def warm_key(self, a: PlanArgs, finalize: str) -> str:
        return plan_key(a.text, finalize)


def plan_key(plan_text: str, mode: str) -> str:
    """What makes two flashinfer-engine warms "the same" (like vLLM's argv key)."""
    return "flashinfer:" + hashlib.sha256(f"{mode}\0{plan_text}".encode()).hexdigest()[:16]


ENGINE = FlashInfer()
