"""Release versions and ranges of them: the types every version fact is written in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

# Saved values that are no version (FlashInfer's "could not detect", a wildcard): parse to None.
_NOT_A_VERSION = frozenset({"unknown", "None", "*"})

_VERSION = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+[a-z0-9.]+)?\s*$",
    re.IGNORECASE,
)
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}


@total_ordering
@dataclass(frozen=True)
class Version:
    """A PEP 440 version, enough of it to order FlashInfer and vLLM releases."""

    text: str
    release: tuple[int, ...]
    rank: tuple[int, int, int, int]  # (dev-or-pre-or-final, pre number, post, dev)

    @classmethod
    def parse(cls, text: str) -> Version:
        m = _VERSION.match(text)
        if m is None:
            raise ValueError(f"not a version: {text!r}")
        release = tuple(int(p) for p in m["release"].split("."))
        while len(release) > 1 and release[-1] == 0:
            release = release[:-1]
        post = int(m["post"] or 0) + (1 if m["post"] is not None else 0)
        if m["pre"]:
            stage, pre_n = _PRE_ORDER[m["pre"].lower()], int(m["pre_n"] or 0)
        elif m["dev"] is not None and m["post"] is None:
            stage, pre_n = -1, 0  # 1.0.dev1 sorts before 1.0a1
        else:
            stage, pre_n = 3, 0
        dev = int(m["dev"]) if m["dev"] else (0 if m["dev"] is not None else 1 << 30)
        return cls(text.strip(), release, (stage, pre_n, post, dev))

    def _cmp_key(self) -> tuple[tuple[int, ...], tuple[int, int, int, int]]:
        return (self.release, self.rank)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._cmp_key() < other._cmp_key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._cmp_key() == other._cmp_key()

    def __hash__(self) -> int:
        return hash(self._cmp_key())

    def __str__(self) -> str:
        return self.text


def parse_version(text: object) -> Version | None:
    """A Version, or None for a missing or indeterminate value ("unknown", "None"), and for a
    value that is no string at all (a hand-edited `_metadata` may hold a list or an object)."""
    if not isinstance(text, str) or text in _NOT_A_VERSION:
        return None
    try:
        return Version.parse(text)
    except ValueError:
        return None


V = Version.parse


@dataclass(frozen=True)
class VersionRange:
    """[first, end) of releases a fact holds for; `end` None = still true in the newest release."""

    first: Version
    end: Version | None
    source: str

    def __contains__(self, version: object) -> bool:
        if not isinstance(version, Version):
            return False
        return self.first <= version and (self.end is None or version < self.end)

    def describe(self) -> str:
        return f"{self.first}–{self.end} (exclusive)" if self.end else f"{self.first}+"
