"""How the work of a call grows with its input, counted, not timed: the Python lines fi_cache
runs (sys.settrace) for an input of n and of 2n. Linear code runs about twice the lines;
a quadratic scan four times. Deterministic, so a test can assert on it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def lines_run(call: Callable[[], Any]) -> int:
    """Lines of fi_cache code `call()` executes (other packages' lines are not counted)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def scope(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_globals.get("__name__", "").startswith("fi_cache"):
            return local
        return None

    sys.settrace(scope)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def growth(make: Callable[[int], Callable[[], Any]], n: int) -> float:
    """lines_run at 2n over lines_run at n: ~2 for linear work, ~4 for quadratic."""
    return lines_run(make(2 * n)) / lines_run(make(n))
