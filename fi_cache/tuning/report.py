"""One result per cache entry from what the bench child reported (`timed`, `served`, `op_skipped`,
`call_failed` events; fi_cache/engines/flashinfer/bench.py): pure, so recorded events can be
judged again (tests/fixtures/timings/)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fi_cache.model.keys import KeyError_, parse_key, to_json
from fi_cache.tuning.verdict import (
    NOISE,
    Candidate,
    Summary,
    Verdict,
    best_alternative,
    judge,
    summarize,
)


@dataclass(frozen=True)
class EntryResult:
    key: str
    op: str
    bucket: int | None
    runner: str
    tactic: Any
    verdict: Verdict | None  # None: skipped (why says so)
    why: str = ""
    cached: Candidate | None = None
    default: Candidate | None = None
    better: Candidate | None = None  # another tactic measurably faster than the cached one
    served: int = 0  # calls of the plan that look this entry up

    @property
    def kind(self) -> str:
        return self.verdict.kind if self.verdict is not None else "skipped"


def _candidate(c: Mapping[str, Any], order: int) -> Candidate:
    samples = tuple(float(s) for s in c.get("samples", ()))  # "inf": a failed round
    return Candidate(str(c["runner"]), c["tactic"], samples, order, c.get("role") == "default")


def _describe(raw: str, value: Any) -> tuple[str, int | None, str, Any]:
    pair = isinstance(value, list) and len(value) > 1
    runner, tactic = (value[0], value[1]) if pair else ("", None)
    try:
        key = parse_key(raw)
    except KeyError_:
        return raw[:60], None, str(runner), tactic
    view = to_json(key.profile)  # the tuned token count: the first input's first dimension
    first: object = None
    if isinstance(view, list) and view and isinstance(view[0], list) and view[0]:
        first = view[0][0]
    return key.op, first if isinstance(first, int) else None, key.runner or str(runner), tactic


def assemble(
    entries: Mapping[str, Any],
    events: Iterable[Mapping[str, Any]],
    noise: float = NOISE,
    not_reached: str = "no call of the plan reaches it",
) -> list[EntryResult]:
    """Per entry (file order): its verdict, or why it was not timed."""
    timed: dict[str, Mapping[str, Any]] = {}
    served: dict[str, int] = {}
    for e in events:
        if e.get("event") == "timed":
            timed[str(e["key"])] = e
        elif e.get("event") == "served":
            served[str(e["key"])] = served.get(str(e["key"]), 0) + 1
    out = []
    for raw, value in entries.items():
        op, bucket, runner, tactic = _describe(raw, value)
        base = {
            "key": raw,
            "op": op,
            "bucket": bucket,
            "runner": runner,
            "tactic": tactic,
            "served": served.get(raw, 0),
        }
        event = timed.get(raw)
        if event is None:
            out.append(EntryResult(**base, verdict=None, why=not_reached))
            continue
        if "error" in event:
            why = f"its inputs could not be made: {event['error']}"
            out.append(EntryResult(**base, verdict=None, why=why))
            continue
        cands = [_candidate(c, i) for i, c in enumerate(event.get("candidates", ()))]
        roles = [c.get("role") for c in event.get("candidates", ())]
        cached = cands[roles.index("cached")]
        default = cands[roles.index("default")] if "default" in roles else cached
        others = [c for c, r in zip(cands, roles, strict=True) if r == "alternative"]
        verdict = judge(cached, default, noise)
        if verdict.kind == "untimed":
            failed = [c for c in event.get("candidates", ()) if c.get("error")]
            if failed:
                verdict = Verdict("untimed", 0.0, f"{verdict.why}: {failed[0]['error']}")
        better = best_alternative(cached, others, noise)
        out.append(
            EntryResult(**base, verdict=verdict, cached=cached, default=default, better=better)
        )
    return out


def summary(results: Sequence[EntryResult]) -> Summary:
    """Over every entry; the effect over timed ones, weighted by served calls when any is."""
    judged = []
    for r in results:
        if r.verdict is None:
            judged.append(
                (Verdict("skipped", 0.0), Candidate("", None, ()), Candidate("", None, ()), 0)
            )
        else:
            assert r.cached is not None and r.default is not None
            judged.append((r.verdict, r.cached, r.default, r.served))
    return summarize(judged)
