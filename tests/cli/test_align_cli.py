"""`fi-cache align` and doctor's rank checks as an operator meets them: a short rank, a cold
node's copy, the files vLLM's gate then accepts, what is refused, exit codes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from fi_cache.model import v1
from tests.conftest import GEMM_618, MOE_618_FUSED, no_hang

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
        "autotune_configs_dp0_rank0.json",
        "autotune_configs_dp1_rank1.json",
    }
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


def _bytes(hdir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(hdir.iterdir()) if p.suffix == ".json"}


# Issue 42 F9: a rank file align cannot read is that rank's only copy of its entries.
UNREADABLE = {
    "truncated": (lambda good: good[: len(good) // 2], "truncated"),
    "not UTF-8": (lambda good: good.replace(b"NVIDIA H200", b"NVIDIA H200\xff"), "UTF-8"),
}


def test_a_rank_file_it_cannot_read_is_named_and_nothing_is_written(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for how, (spoil, why) in UNREADABLE.items():
        hdir = _deployment(tmp_path / how.replace(" ", "-"), GEMM_618, {"dp1_rank1": 3})
        bad = hdir / "autotune_configs_dp0_rank0.json"  # align used to "create" it anew
        bad.write_bytes(spoil(bad.read_bytes()))
        before = _bytes(hdir)
        r = run("align", hdir)
        assert r.code == 1 and r.err.count("\n") == 1, (how, r.err)
        assert "not aligned" in r.err and str(bad) in r.err and why in r.err, (how, r.err)
        assert "Traceback" not in r.err and r.out == ""
        assert _bytes(hdir) == before, how  # dp0_rank0's own entries are still there
        dry = run("--format", "json", "align", hdir, "--dry-run")
        [group] = dry.json()["groups"]
        assert dry.code == 1 and not group["aligned"] and group["writes"] == [], how


# Issue 42 F3: never write what `fi-cache verify` rejects (merge already refuses it).
BAD_VALUES = {"one element": lambda v: v[:1], "an object": lambda v: {"x": 1}}


def test_a_rank_file_verify_rejects_is_refused_untouched(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for how, spoil in BAD_VALUES.items():
        hdir = _deployment(tmp_path / how.replace(" ", "-"), GEMM_618, {})
        rank0 = hdir / "autotune_configs_dp0_rank0.json"
        cf = v1.loads(rank0.read_bytes())
        key = next(iter(cf.entries))
        rank1 = v1.loads((hdir / "autotune_configs_dp1_rank1.json").read_bytes())
        rank1.entries[key] = [rank1.entries[key][0], 3]  # rank1 answers it differently, well
        (hdir / "autotune_configs_dp1_rank1.json").write_text(v1.dumps(rank1))
        cf.entries[key] = spoil(cf.entries[key])
        rank0.write_text(v1.dumps(cf))
        assert run("verify", rank0).code == 1
        before = _bytes(hdir)
        r = run("align", hdir)
        assert r.code == 1 and r.err.count("\n") == 1, (how, r.err)
        assert "not aligned" in r.err and str(rank0) in r.err and "fi-cache verify" in r.err
        assert "Traceback" not in r.err
        assert _bytes(hdir) == before, how  # rank1's good value was not overwritten


def test_a_deployment_whose_every_rank_file_is_unreadable_is_named(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hdir = _deployment(tmp_path, GEMM_618, {})
    (hdir / "autotune_configs_dp1_rank1.json").unlink()
    rank0 = hdir / "autotune_configs_dp0_rank0.json"
    rank0.write_bytes(rank0.read_bytes()[:100])
    r = run("align", hdir)
    assert r.code == 1 and f"{rank0}: truncated" in r.err and r.err.count("\n") == 1, r.err
    assert len(rank0.read_bytes()) == 100


def test_a_fifo_at_a_ranks_name_is_refused_at_once(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hdir = _deployment(tmp_path, GEMM_618, {"dp1_rank1": 3})
    fifo = hdir / "autotune_configs_dp0_rank0.json"
    fifo.unlink()
    os.mkfifo(fifo)  # rank0 is inferred missing; reading its name used to wait forever
    for dry in ([], ["--dry-run"]):
        with no_hang():
            r = run("align", hdir, *dry)
        assert r.code == 2 and f"{fifo}: is a FIFO" in r.err and r.err.count("\n") == 1, r.err
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_torn_sglang_run_copy_does_not_stop_align(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SGLang's runs/ copies are written, never read back: not rank files align would replace."""
    key = tmp_path / "flashinfer" / "autotune" / "0.6.18" / "sm90" / "0123456789abcdef"
    (key / "runs").mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    for rank, drop in (("tp0_pp0_dp0", 0), ("tp1_pp0_dp0", 3)):
        part = v1.CacheFile(cf.metadata, dict(list(cf.entries.items())[drop:]), None, "x")
        (key / f"rank_{rank}.json").write_text(v1.dumps(part))
    torn = key / "runs" / "rank_tp1_pp0_dp0.20261201_205527.json"
    torn.write_text(GEMM_618.read_text()[:300])
    r = run("align", key)
    assert r.code == 0 and "wrote 1 files (0 created)" in r.out, r.err
    assert len(torn.read_text()) == 300
