"""`fi-cache align` and doctor's rank checks as an operator meets them: a short rank, a cold
node's copy, the files vLLM's gate then accepts, what is refused, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from fi_cache.model import v1
from tests.conftest import GEMM_618, MOE_618_FUSED

HASH = "c" * 64


def _deployment(root: Path, source: Path, drop: dict[str, int]) -> Path:
    """A vLLM 0.32+ hash dir of ranks dp0_rank0 and dp1_rank1 (MoE -dp 2), some entries lost."""
    hdir = root / "0.6.18" / "90a" / HASH
    hdir.mkdir(parents=True)
    cf = v1.loads(source.read_bytes())
    for rank in ("dp0_rank0", "dp1_rank1"):
        keys = list(cf.entries)[drop.get(rank, 0) :]
        part = v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys}, None, cf.generation)
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))
    return hdir


def _fingerprints(*dirs: Path) -> set[tuple[str, int]]:
    out = set()
    for d in dirs:
        for f in d.glob("autotune_configs_*.json"):
            data = json.loads(f.read_text())
            meta = data.pop("_metadata")
            out.add((json.dumps(meta, sort_keys=True), len(data)))
    return out


def test_a_short_rank_is_named_then_aligned_and_a_cold_copy_filled(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hdir = _deployment(tmp_path / "head", GEMM_618, {"dp1_rank1": 3})
    r = run("--format", "json", "doctor", hdir)
    [f] = [f for f in r.json()["findings"] if f["check"] == "vllm-ranks-retune"]
    assert "all 2 ranks tune again" in f["message"] and f"fi-cache align {hdir}" in f["fix"]
    cold = tmp_path / "node1" / HASH  # another node's copy, empty
    r = run("align", hdir, cold, "--dry-run")
    assert r.code == 0 and "would write 3 files (2 created)" in r.out
    assert not cold.exists() and len(_fingerprints(hdir)) == 2  # a dry run writes nothing
    r = run("--format", "json", "align", hdir, cold)
    assert r.code == 0, r.err
    [group] = r.json()["groups"]
    assert group["aligned"] and group["ranks"] == ["dp0_rank0", "dp1_rank1"]
    assert len(_fingerprints(hdir, cold)) == 1  # what vLLM's gate compares: one on every rank
    assert {p.name for p in cold.iterdir() if p.suffix == ".json"} == {
        "autotune_configs_dp0_rank0.json", "autotune_configs_dp1_rank1.json"
    }  # fmt: skip
    r = run("--format", "json", "doctor", hdir, cold)
    assert not [f for f in r.json()["findings"] if f["check"].startswith("vllm-ranks")]
    assert "already aligned" in run("align", hdir, cold).out


def test_a_rank_missing_its_own_moe_entries_is_refused_untouched(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hdir = _deployment(tmp_path, MOE_618_FUSED, {"dp1_rank1": 2})
    before = {p: p.read_bytes() for p in hdir.iterdir()}
    r = run("align", hdir)
    assert r.code == 1 and "not aligned" in r.err and "dp1_rank1 (2)" in r.err
    assert {p: p.read_bytes() for p in hdir.iterdir()} == before
    r = run("--format", "json", "doctor", hdir)
    [f] = [f for f in r.json()["findings"] if f["check"] == "vllm-ranks-retune"]
    assert "only that rank can tune them" in f["fix"]


def test_no_rank_files_is_a_refusal(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "autotune_configs.json").write_text(GEMM_618.read_text())
    r = run("align", tmp_path / "x")
    assert r.code == 2 and "no per-rank files here" in r.err
