"""evict over a real H200 file (vLLM 0.26's fused tune, FlashInfer 0.6.17): what goes, what a
rewrite keeps, and that FlashInfer's own loader (0.6.17, 0.6.18, 0.7.2.post1) reads the result."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fi_cache.errors import Refused
from fi_cache.maintenance.evict import Selector, apply, plan
from fi_cache.model import v1
from tests.conftest import FIXTURES, fi_load_argv, fi_load_result, flashinfer_dir, run_parallel

FUSED = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "autotune_configs.json"
    shutil.copy(FUSED, path)
    return path


def test_a_tactic_of_one_op_goes_and_everything_else_stays_byte_for_byte(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    before = v1.loads(path.read_bytes())
    [dry] = plan([path], Selector(op="gemm2", tactic=104))
    assert len(dry.evicted) == 2 and path.read_bytes() == FUSED.read_bytes()  # nothing written
    [done] = apply([path], Selector(op="gemm2", tactic=104))
    after = v1.loads(path.read_bytes())
    assert done.evicted == dry.evicted and len(after.entries) == 40
    assert all(before.entries[k] == v for k, v in after.entries.items())
    assert after.metadata == before.metadata
    assert list(v1.defects(after)) == []  # `_generation`, when there is one, matches again


def test_bucket_and_runner_select_and_nothing_given_is_refused(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    [p] = plan([path], Selector(bucket=1))
    assert len(p.evicted) == 2  # gemm1 and gemm2 of the 1-token bucket
    [none] = plan([path], Selector(runner="NoSuchRunner"))
    assert none.evicted == ()
    with pytest.raises(Refused, match="name what to evict"):
        plan([path], Selector())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Refused, match="no v1 autotune cache"):
        plan([empty], Selector(bucket=1))


def test_flashinfers_own_loaders_read_the_rewritten_file(tmp_path: Path) -> None:
    """Each FlashInfer loads only files stamped with its own version: the same tune, stamped
    so, evicted, then loaded by 0.6.17's, 0.6.18's and 0.7.2.post1's load_configs."""
    versions = ("0.6.17", "0.6.18", "0.7.2.post1")
    jobs, gone = [], []
    for version in versions:
        raw = json.loads(FUSED.read_text())
        raw["_metadata"]["flashinfer_version"] = version
        if version.startswith("0.7"):  # 0.7 records one more field: "*" matches any
            raw["_metadata"]["cutlass_dsl_version"] = "*"
        path = tmp_path / version / "autotune_configs.json"
        path.parent.mkdir()
        path.write_text(json.dumps(raw))
        [done] = apply([path], Selector(op="gemm2", tactic=104))
        gone.append(set(done.evicted))
        env = {**os.environ, "PYTHONPATH": str(flashinfer_dir(version))}
        jobs.append({"args": fi_load_argv(path), "env": env})
    for version, evicted, p in zip(versions, gone, run_parallel(*jobs), strict=True):
        result = fi_load_result(p)
        assert result["returned"] is True and result["loaded"] == 40, (version, result["log"])
        assert len(evicted) == 2 and not evicted & set(result["keys"]), version


def test_the_cli_says_what_went_and_json_lists_it(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _copy(tmp_path)
    r = run("evict", path, "--op", "gemm2", "--tactic", "104", "--dry-run")
    assert r.code == 0 and "would evict 2, kept 40" in r.out
    j = run("--format", "json", "evict", path, "--bucket", "1")
    doc = j.json()
    assert j.code == 0 and doc["dry_run"] is False and doc["files"][0]["kept"] == 40
    assert len(json.loads(path.read_text())) == 40 + 1  # the entries and `_metadata`
    bad = run("evict", path)
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1


def test_a_file_verify_rejects_is_refused_untouched(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 42 F12: evict rewrote such a file and said "evicted"; merge and align refuse it."""
    path = _copy(tmp_path)
    raw = json.loads(path.read_text())
    key = next(k for k in raw if "gemm1" in k)
    raw[key] = raw[key][:1]  # FlashInfer's loader crashes on it (IndexError)
    path.write_text(json.dumps(raw, indent=2))
    before = path.read_bytes()
    assert run("verify", path).code == 1
    for dry in ([], ["--dry-run"]):
        r = run("evict", path, "--op", "gemm2", "--tactic", "104", *dry)
        assert r.code == 1 and r.err.count("\n") == 1, r.err
        assert str(path) in r.err and "fi-cache verify" in r.err and "Traceback" not in r.err
    assert path.read_bytes() == before


def test_a_dir_swapped_after_the_plan_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 F16: the dir planned on is replaced by a link to another before the rewrite."""
    from fi_cache.maintenance import evict

    here, outside = tmp_path / "D", tmp_path / "outside" / "D"
    here.mkdir()
    outside.mkdir(parents=True)
    shutil.copy(FUSED, here / "autotune_configs.json")
    shutil.copy(FUSED, outside / "autotune_configs.json")
    real_plan = evict.plan

    def plan_then_swap(*args, **kwargs):  # type: ignore[no-untyped-def]
        planned = real_plan(*args, **kwargs)
        here.rename(tmp_path / "D.old")
        here.symlink_to(outside, target_is_directory=True)
        return planned

    monkeypatch.setattr(evict, "plan", plan_then_swap)
    with pytest.raises(Refused, match="directory was replaced since evict read it"):
        apply([here / "autotune_configs.json"], Selector(op="gemm2", tactic=104))
    assert (outside / "autotune_configs.json").read_bytes() == FUSED.read_bytes()
    assert (tmp_path / "D.old" / "autotune_configs.json").read_bytes() == FUSED.read_bytes()
    assert sorted(p.name for p in outside.iterdir()) == ["autotune_configs.json"]  # no lock
