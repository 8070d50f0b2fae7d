"""Every test module has a basename of its own: pytest imports them by basename (rootdir mode,
no package __init__), and two of one name stop the whole suite's collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_no_two_test_modules_share_a_basename() -> None:
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
