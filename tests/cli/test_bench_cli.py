"""`fi-cache bench CACHE` as a user runs it: `python -m fi_cache` in a real process, a fake
`nvidia-smi` reporting an H200, and the CPU stand-in tuning child (tests/engines/flashinfer/
cpu_tune_child.py: FlashInfer 0.6.18's real AutoTuner; its MoE profiler gives each tactic a fixed
time, so the verdicts on MoE entries are exact). The cache is one `warm --engine flashinfer` wrote,
with some MoE entries set to their bucket's slowest tactic: what a noisy tune can leave behind."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from typing import Any

import pytest

from fi_cache.model import v1
from fi_cache.model.keys import parse_key
from fi_cache.tuning.verdict import NOISE
from tests.cli.test_warm_flashinfer_cli import _tune_python
from tests.conftest import TuneRig, flashinfer_dir, one_line, run_parallel
from tests.engines.flashinfer.test_bench import MOE_OPS, _noisy_moe_tactics, _standin_ms


def _slower_keys(entries: dict[str, Any]) -> set[str]:
    """The MoE entries whose (stand-in) time is at least 2 % above the default's."""
    out = set()
    for raw, value in entries.items():
        key = parse_key(raw)
        if key.op in MOE_OPS:
            bucket = key.profile[0][0]  # type: ignore[index]
            if _standin_ms(key.op, bucket, value[1]) >= _standin_ms(key.op, bucket, -1) * (
                1 + NOISE
            ):
                out.add(raw)
    return out


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    flashinfer_dir("0.6.18")
    root = tmp_path_factory.mktemp("bench-cli")
    r = TuneRig.make(root, version="0.6.18", python=_tune_python(root))
    plan = r.plan()
    p = r.run("warm", "--engine", "flashinfer", "--plan", plan, "--finalize", "fused")
    assert p.returncode == 0, p.stderr
    [cache] = r.store.rglob("autotune_configs.json")
    cf = v1.loads(cache.read_text())
    doctored = replace(cf, entries=_noisy_moe_tactics(dict(cf.entries)))
    cache.write_text(v1.dumps(doctored))  # the test plays the noisy tune: not fi-cache's write
    foreign = root / "h100" / "autotune_configs.json"
    foreign.parent.mkdir()
    meta = {**(cf.metadata or {}), "gpu": "NVIDIA H100 80GB HBM3"}
    foreign.write_text(v1.dumps(replace(doctored, metadata=meta)))
    outside = root / "copy.json"
    shutil.copy(cache, outside)
    before = cache.read_bytes()
    checked, other, no_plan, as_json = run_parallel(
        r.job("bench", cache, "--op", "fused_moe", "--rounds", "3"),
        r.job("bench", foreign, "--plan", plan, "--rounds", "3"),
        r.job("bench", outside, "--rounds", "3"),
        r.job("--format", "json", "bench", cache, "--op", "gemm2", "--rounds", "3"),
    )
    untouched = cache.read_bytes() == before
    applied = r.run("bench", cache, "--op", "fused_moe", "--rounds", "3", "--apply")
    after = v1.loads(cache.read_text())
    again = r.run("bench", cache, "--op", "fused_moe", "--rounds", "3")
    return {
        "rig": r,
        "cache": cache,
        "doctored": dict(doctored.entries),
        "checked": checked,
        "other": other,
        "no_plan": no_plan,
        "json": as_json,
        "untouched": untouched,
        "applied": applied,
        "after": dict(after.entries),
        "again": again,
        "outside": outside,
    }


def test_entries_slower_than_the_default_are_named_and_nothing_is_written(
    rig: dict[str, Any],
) -> None:
    p = rig["checked"]
    assert p.returncode == 1, p.stderr  # a slower entry stays: a CI gate fails
    slower = _slower_keys(rig["doctored"])
    assert 3 <= len(slower) <= 6
    lines = [line for line in p.stdout.splitlines() if "SLOWER than default by" in line]
    assert len(lines) == len(slower)
    assert "10 entries: " in p.stdout and f"{len(slower)} slower" in p.stdout
    assert "add --apply" in p.stdout
    assert "[bench 4/4, op 2/2] cutlass_fused_moe" in p.stderr  # progress, as a warm shows it
    assert rig["untouched"]  # bench alone writes nothing


def test_apply_evicts_exactly_the_slower_entries_and_the_manifest_records_it(
    rig: dict[str, Any],
) -> None:
    p = rig["applied"]
    assert p.returncode == 0, p.stderr
    slower = _slower_keys(rig["doctored"])
    assert set(rig["doctored"]) - set(rig["after"]) == slower
    assert "fi-cache pin NAMESPACE" in p.stdout
    manifest = json.loads((rig["cache"].parents[1] / "manifest.json").read_text())
    evicted = {k for e in manifest["evictions"] for f in e["files"] for k in f["evicted"]}
    assert evicted == slower
    assert rig["again"].returncode == 0 and "SLOWER" not in rig["again"].stdout


def test_a_cache_for_another_gpu_is_one_skipped_line_per_entry(rig: dict[str, Any]) -> None:
    p = rig["other"]
    assert p.returncode == 2, p.stderr  # nothing could be timed here
    skipped = [line for line in p.stdout.splitlines() if "written for another environment" in line]
    assert len(skipped) == len(rig["doctored"]) and "'NVIDIA H100 80GB HBM3'" in skipped[0]
    assert "Traceback" not in p.stderr


def test_a_cache_with_no_recorded_plan_needs_one(rig: dict[str, Any]) -> None:
    p = rig["no_plan"]
    assert p.returncode == 2
    assert (
        one_line(p) == f"fi-cache: {rig['outside']}: give --plan PLAN: the shapes to call "
        "(no warm recorded one)"
    )


def test_json_gives_each_entry_its_samples_and_verdict(rig: dict[str, Any]) -> None:
    p = rig["json"]
    doc = json.loads(p.stdout)
    ops = {e["op"] for e in doc["entries"]}
    assert ops == {"trtllm::fused_moe::gemm2"}  # --op gemm2
    for e in doc["entries"]:
        assert e["verdict"] in ("faster", "noise", "slower")
        assert len(e["cached"]["samples_ms"]) == 3 and len(e["default"]["samples_ms"]) == 3
    served = sum(e["served"] for e in doc["entries"])
    assert served == 2  # the plan calls the MoE at 1 and 16 tokens
    assert doc["summary"]["weighted"] and doc["evict"]
