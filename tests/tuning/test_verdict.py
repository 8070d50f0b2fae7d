"""The rules that judge a cached tactic against FlashInfer's default and pick what a repeated tune
keeps (fi_cache/tuning/verdict.py), on recorded timing samples (tests/fixtures/timings/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fi_cache.tuning.verdict import (
    Candidate,
    best_alternative,
    judge,
    robust_winner,
    summarize,
)

SAMPLES: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "timings" / "samples.json").read_text()
)
RUNNER = "CublasltBf16GemmRunner"


def _ms(values: list[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)  # "inf": a round where the tactic failed


def _pair(case: str, tactic: int = 3) -> tuple[Candidate, Candidate]:
    data = SAMPLES[case]
    cached = Candidate(RUNNER, tactic, _ms(data["cached"]), order=tactic + 1)
    default = Candidate(RUNNER, -1, _ms(data["default"]), order=0, default=True)
    return cached, default


def _field(case: str) -> list[Candidate]:
    data = SAMPLES[case]
    out = [Candidate(RUNNER, -1, _ms(data["default"]), order=0, default=True)]
    for t, samples in data["tactics"].items():
        out.append(Candidate(RUNNER, int(t), _ms(samples), order=int(t) + 1))
    return out


@pytest.mark.parametrize(
    ("case", "kind"),
    [
        ("slower", "slower"),
        ("faster", "faster"),
        ("overlap", "noise"),  # the ranges overlap: no claim either way
        ("tiny_gap", "noise"),  # apart, but 1 %: below the noise floor
        ("failed", "untimed"),  # one round failed: no interval
        ("two_rounds", "untimed"),  # too few rounds for an interval
    ],
)
def test_a_cached_tactic_is_judged_against_the_default(case: str, kind: str) -> None:
    assert judge(*_pair(case)).kind == kind


def test_a_slower_tactic_says_by_how_much() -> None:
    v = judge(*_pair("slower"))
    assert v.kind == "slower"
    assert round(v.change, 3) == 0.245  # 0.0412 / 0.0331 - 1 on the medians


def test_a_cache_that_holds_the_default_itself_is_no_loss() -> None:
    _cached, default = _pair("slower")
    same = Candidate(RUNNER, -1, _ms(SAMPLES["slower"]["cached"]))
    assert judge(same, default).kind == "noise"


def test_a_faster_alternative_is_named_only_when_measurably_faster() -> None:
    cached, _default = _pair("slower")
    quicker = Candidate(RUNNER, 7, _ms(SAMPLES["faster"]["cached"]), order=8)
    close = Candidate(RUNNER, 8, _ms(SAMPLES["overlap"]["cached"]), order=9)
    assert best_alternative(cached, [close, quicker]) == quicker
    slower_alt = Candidate(RUNNER, 9, tuple(s * 1.5 for s in cached.samples), order=10)
    assert best_alternative(cached, [slower_alt]) is None


def test_tied_winners_give_the_same_pick_whichever_is_fastest_this_run() -> None:
    field = _field("tied_winners")
    first = robust_winner(field)
    # Swap the two tied tactics' samples: run 2 saw tactic 0 as the fastest, run 1 tactic 1.
    swapped = [
        Candidate(c.runner, c.tactic, field[3 - c.order].samples, c.order)
        if c.order in (1, 2)
        else c
        for c in field
    ]
    assert min(field[1:3], key=lambda c: c.median) != min(swapped[1:3], key=lambda c: c.median)
    assert first.tactic == robust_winner(swapped).tactic == 0  # FlashInfer's order breaks the tie


def test_the_default_is_kept_when_it_is_as_fast_as_the_best() -> None:
    assert robust_winner(_field("default_among_best")).default


def test_the_default_is_kept_when_nothing_could_be_timed_enough() -> None:
    field = [Candidate(RUNNER, -1, (0.05, 0.05), default=True), Candidate(RUNNER, 0, (0.01,) * 3)]
    assert robust_winner(field).default


def test_the_summary_weights_the_effect_by_served_calls() -> None:
    slow = _pair("slower")
    fast = _pair("faster")
    judged = [(judge(*slow), *slow, 0), (judge(*fast), *fast, 3)]
    s = summarize(judged)
    assert s.counts == {"slower": 1, "faster": 1}
    assert s.share("slower") == 0.5
    assert s.weighted and s.effect is not None
    # Only the served (fast) entry counts: 0.0201 / 0.0289 - 1
    assert round(s.effect, 3) == -0.304
    unweighted = summarize([(judge(*slow), *slow, 0), (judge(*fast), *fast, 0)])
    assert not unweighted.weighted
    # (0.0412 + 0.0201) / (0.0331 + 0.0289) - 1: the loss and the win nearly cancel
    assert unweighted.effect is not None and round(unweighted.effect, 3) == -0.011
