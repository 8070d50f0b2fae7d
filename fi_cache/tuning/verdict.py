"""How fi-cache judges a tactic from repeated timings, and which tactic a repeated tune keeps.

A *sample* is one measurement by FlashInfer's own profiler (`AutoTuner._profile_single_kernel`:
warm-up, then the mean of its timed iterations, in ms). The child measures every candidate once
per round, rounds interleaved, so slow drift (clocks, temperature) hits all candidates alike.

The rules (docs/tuning.md, "Checking a cache"):
- interval: the range [min, max] of a candidate's samples (at least MIN_ROUNDS of them);
- two candidates differ only when their intervals do not overlap AND their medians differ by at
  least `noise` (default NOISE, 2 %): either alone is too easy to meet by chance;
- verdict of a cached tactic: "slower" / "faster" than the default (runner 0, tactic -1, what
  FlashInfer runs on a miss) when they differ, else "noise";
- robust winner of a repeated tune: the contenders are the candidates that do not differ from the
  fastest (by median); if the default is among them, the default; else the first contender in
  FlashInfer's own order (runner, then tactic as the runner lists them) that differs from the
  default; if none does, the default. Two tunes that see the same contenders keep the same tactic,
  whichever of them happened to be fastest in a given run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_ROUNDS = 3  # fewer samples give no interval worth the name
NOISE = 0.02  # a median difference below 2 % is noise even when the ranges do not overlap

DEFAULT_TACTIC = -1  # FlashInfer's fallback: runners[0] with tactic -1


@dataclass(frozen=True)
class Candidate:
    """One (runner, tactic) and its samples in ms. `order` is its place in FlashInfer's own
    listing (runner index, then the runner's valid tactics), the tie-break of the robust rule."""

    runner: str
    tactic: object
    samples: tuple[float, ...]
    order: int = 0
    default: bool = False

    @property
    def ok(self) -> bool:
        """Timed at least MIN_ROUNDS times, every time (a failed measurement is inf)."""
        return len(self.samples) >= MIN_ROUNDS and all(s < float("inf") for s in self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("inf")

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else float("inf")

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else float("inf")


def differs(a: Candidate, b: Candidate, noise: float = NOISE) -> bool:
    """Whether a and b are measurably different (either direction)."""
    if not (a.ok and b.ok):
        return False
    apart = a.high < b.low or b.high < a.low
    slow, fast = max(a.median, b.median), min(a.median, b.median)
    return apart and fast > 0 and slow / fast - 1 >= noise


def change(a: Candidate, b: Candidate) -> float:
    """How much slower a is than b, as a fraction of b's median (negative: faster)."""
    return a.median / b.median - 1 if b.median > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    kind: str  # "faster" | "noise" | "slower" | "untimed"
    change: float  # cached vs default, fraction of the default's median (0.12: 12 % slower)
    why: str = ""  # for "untimed": what failed


def judge(cached: Candidate, default: Candidate, noise: float = NOISE) -> Verdict:
    """The cached tactic against the default."""
    if not default.ok:
        return Verdict("untimed", 0.0, "the default tactic could not be timed")
    if not cached.ok:
        return Verdict("untimed", 0.0, "the cached tactic could not be timed")
    if cached.runner == default.runner and cached.tactic == default.tactic:
        return Verdict("noise", 0.0)  # the cache holds the default itself
    delta = change(cached, default)
    if not differs(cached, default, noise):
        return Verdict("noise", delta)
    return Verdict("slower" if delta > 0 else "faster", delta)


def best_alternative(
    cached: Candidate, others: Sequence[Candidate], noise: float = NOISE
) -> Candidate | None:
    """The fastest other candidate when it is measurably faster than the cached one."""
    timed = [c for c in others if c.ok]
    if not timed:
        return None
    best = min(timed, key=lambda c: (c.median, c.order))
    return best if best.median < cached.median and differs(best, cached, noise) else None


def robust_winner(candidates: Sequence[Candidate], noise: float = NOISE) -> Candidate:
    """The tactic a repeated tune keeps (module docstring). `candidates` must hold the default."""
    [default] = [c for c in candidates if c.default]
    timed = [c for c in candidates if c.ok]
    if not timed or not default.ok:
        return default
    fastest = min(timed, key=lambda c: (c.median, c.order))
    contenders = [c for c in timed if c is fastest or not differs(c, fastest, noise)]
    if default in contenders:
        return default
    for c in sorted(contenders, key=lambda c: c.order):
        if c.median < default.median and differs(c, default, noise):
            return c
    return default


@dataclass(frozen=True)
class Summary:
    entries: int
    counts: dict[str, int]  # verdict kind -> entries
    effect: float | None  # time of the served calls with the cache vs with the default (-0.05)
    weighted: bool  # effect weighted by how often each entry is served (a plan's calls)

    def share(self, kind: str) -> float:
        return self.counts.get(kind, 0) / self.entries if self.entries else 0.0


def summarize(
    judged: Sequence[tuple[Verdict, Candidate, Candidate, int]],
) -> Summary:
    """(verdict, cached, default, weight) per entry; weight: served calls (0 = not served, or
    every weight 0: each timed entry counts once). Effect: Σ w·cached / Σ w·default − 1 over
    timed entries, i.e. what serving with this cache costs against serving with no cache."""
    counts: dict[str, int] = {}
    for v, _c, _d, _w in judged:
        counts[v.kind] = counts.get(v.kind, 0) + 1
    timed = [(c, d, w) for v, c, d, w in judged if v.kind in ("faster", "noise", "slower")]
    weighted = any(w > 0 for _c, _d, w in timed)
    pairs = [(c, d, w if weighted else 1) for c, d, w in timed]
    den = sum(w * d.median for _c, d, w in pairs)
    effect = sum(w * c.median for c, _d, w in pairs) / den - 1 if den > 0 else None
    return Summary(len(judged), counts, effect, weighted)
