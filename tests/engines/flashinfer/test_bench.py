"""Timing tactics in the tuning child (fi_cache/engines/flashinfer/bench.py, driver.py's bench stage
and `repeat`), with FlashInfer's own AutoTuner on CPU (cpu_tune_child.py says what stands in for
the GPU). The MoE's stand-in profiler gives every (GEMM, bucket, tactic, finalize mode) a fixed
time, so what the bench finds and what a repeated tune keeps can be checked exactly; the CPU GEMM
runner's times are real CPU times (noisy), so only its shape is checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.flashinfer.driver import Job
from fi_cache.model.keys import parse_key
from fi_cache.tuning.verdict import NOISE, Candidate, judge
from tests.conftest import FI_VERSIONS, FLASHINFER_INSTALLS, flashinfer_dir, run_parallel
from tests.engines.flashinfer.test_driver import PLAN, Run, _cpu_child

MODE = "fused"
MOE_OPS = ("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2")


def _standin_ms(op: str, bucket: int, tactic: Any) -> float:
    """cpu_tune_child._profile's MoE time: fixed per (GEMM, bucket, tactic, mode)."""
    gemm = 1 if op.endswith("gemm1") else 2
    mode = "any" if gemm == 1 else MODE
    h = hashlib.sha256(f"{gemm}|{bucket}|{tactic}|{mode}".encode()).digest()
    return 0.010 + int.from_bytes(h[:4], "big") / 2**32 * 0.010


def _entries(path: Path) -> dict[str, Any]:
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def _moe(entries: dict[str, Any]) -> dict[tuple[str, int], Any]:
    out = {}
    for raw, value in entries.items():
        key = parse_key(raw)
        if key is not None and key.op in MOE_OPS:
            out[key.op, key.profile[0][0]] = value[1]
    return out


def _tune_lines(cache: Path, repeat: int) -> list[str]:
    job = Job(MODE, PLAN.for_mode(MODE), repeat=repeat).to_json()
    return [json.dumps(job), json.dumps({"cache": str(cache)})]


POLICY = ["cuda_graph_profile_replays", None, "l2_cache_policy", "hot"]  # 0.7.2.post1's
FOREIGN = "('fi_cache_test::cpu_gemm', 'CpuMatmulRunner', ((4096, 64), (64, 64)), ())"


def _noisy_moe_tactics(entries: dict[str, Any]) -> dict[str, Any]:
    """A cache whose MoE entries hold, for buckets 1, 4 and 16, the slowest tactic (among 0-35,
    valid for both GEMMs) and for 2 and 8 the fastest: what a tune on a noisy or busy GPU can
    leave behind."""
    out = dict(entries)
    for raw, value in entries.items():
        key = parse_key(raw)
        if key is not None and key.op in MOE_OPS:
            bucket = key.profile[0][0]
            pick = max if bucket in (1, 4, 16) else min
            out[raw] = [value[0], pick(range(36), key=lambda t: _standin_ms(key.op, bucket, t))]
    return out


def _bench_lines(entries: dict[str, Any]) -> list[str]:
    settings = {"entries": entries, "rounds": 3, "budget_ms": 50.0, "alternatives": 2}
    job = Job(MODE, PLAN.for_mode(MODE), stage="bench", bench=settings).to_json()
    return [json.dumps(job), json.dumps({"bench": True})]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per installed version a plain tune, then a bench of what it wrote; on 0.6.18 two more
    fresh tunes with --repeat 3."""
    base = tmp_path_factory.mktemp("bench")
    flashinfer_dir("0.6.18")  # skips without it; fails under scripts/test.sh
    versions = [v for v in FI_VERSIONS if v in FLASHINFER_INSTALLS]
    jobs, names = [], []
    for v in versions:
        jobs.append(_cpu_child(v, _tune_lines(base / f"{v}-plain.json", 1), base))
        names.append(f"{v}-plain")
    for i in (1, 2):
        jobs.append(_cpu_child("0.6.18", _tune_lines(base / f"repeat-{i}.json", 3), base))
        names.append(f"repeat-{i}")
    out: dict[str, Any] = {n: Run.of(p) for n, p in zip(names, run_parallel(*jobs), strict=True)}
    out["base"] = base
    benches = []
    for v in versions:
        entries = {**_entries(base / f"{v}-plain.json"), FOREIGN: ["CpuMatmulRunner", 1]}
        if v == "0.6.18":
            entries = _noisy_moe_tactics(entries)
        else:  # values as FlashInfer 0.7.x writes them: the measurement policy third
            entries = {k: [*val, POLICY] for k, val in entries.items()}
        benches.append(_cpu_child(v, _bench_lines(entries), base))
    for v, p in zip(versions, run_parallel(*benches), strict=True):
        out[f"{v}-bench"] = Run.of(p)
    out["versions"] = versions
    return out


def _timed(run: Run) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in run.events if e["event"] == "timed"}


def _candidate(c: dict[str, Any]) -> Candidate:
    samples = tuple(float(s) for s in c["samples"])
    return Candidate(c["runner"], c["tactic"], samples, default=c["role"] == "default")


def test_every_entry_the_plan_reaches_is_timed_against_the_default(runs: dict[str, Any]) -> None:
    for v in runs["versions"]:
        run = runs[f"{v}-bench"]
        assert run.code == 0, run.stderr[-2000:]
        timed = _timed(run)
        entries = _entries(runs["base"] / f"{v}-plain.json")
        if v == "0.6.18":
            entries = _noisy_moe_tactics(entries)
        assert set(timed) == set(entries)  # FOREIGN (a bucket no call reaches) is not timed
        for key, e in timed.items():
            roles = [c["role"] for c in e["candidates"]]
            assert roles.count("cached") == 1 and e["tactic"] == entries[key][1]
            assert "default" in roles or e["tactic"] == -1
            assert all(len(c["samples"]) >= 3 for c in e["candidates"])


def test_the_bench_finds_exactly_the_moe_entries_slower_than_the_default(
    runs: dict[str, Any],
) -> None:
    run = runs["0.6.18-bench"]
    slower, expected = set(), set()
    for key, e in _timed(run).items():
        parsed = parse_key(key)
        if parsed is None or parsed.op not in MOE_OPS:
            continue
        by_role = {c["role"]: _candidate(c) for c in e["candidates"]}
        if judge(by_role["cached"], by_role["default"]).kind == "slower":
            slower.add(key)
        bucket = parsed.profile[0][0]
        cached_ms = _standin_ms(parsed.op, bucket, e["tactic"])
        if cached_ms / _standin_ms(parsed.op, bucket, -1) - 1 >= NOISE:
            expected.add(key)
    assert 3 <= len(expected) <= 6  # the buckets given their slowest tactic
    assert slower == expected


def test_the_calls_served_are_counted_per_entry(runs: dict[str, Any]) -> None:
    served = [e["key"] for e in runs["0.6.18-bench"].events if e["event"] == "served"]
    buckets = sorted({parse_key(k).profile[0][0] for k in served})  # type: ignore[union-attr]
    assert buckets == [1, 16]  # the plan calls each op at 1 and 16 tokens


def test_two_fresh_repeated_tunes_write_the_same_moe_table(runs: dict[str, Any]) -> None:
    for name in ("repeat-1", "repeat-2", "0.6.18-plain"):
        assert runs[name].code == 0, runs[name].stderr[-2000:]
    one = _moe(_entries(runs["base"] / "repeat-1.json"))
    two = _moe(_entries(runs["base"] / "repeat-2.json"))
    plain = _moe(_entries(runs["base"] / "0.6.18-plain.json"))
    assert one == two and len(one) == 10  # 5 buckets x gemm1, gemm2
    for (op, bucket), tactic in one.items():
        default_ms = _standin_ms(op, bucket, -1)
        # kept: the default, or a tactic measurably faster than it
        assert tactic == -1 or _standin_ms(op, bucket, tactic) < default_ms / (1 + NOISE)
    assert set(plain) == set(one)
    robust = [e for e in runs["repeat-1"].events if e["event"] == "robust"]
    assert len(robust) == 15 and all(e["rounds"] == 3 for e in robust)
