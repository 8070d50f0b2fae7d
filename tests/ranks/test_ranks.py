"""The rank rules over real files: FlashInfer 0.6.18's own MoE file (rank-keyed keys, written by
its tuner: tests/fixtures/flashinfer) and a real H200 GEMM file (rank-free keys)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.caches import inventory
from fi_cache.model import v1
from fi_cache.ranks.agreement import (
    RankFile,
    divergent_tactics,
    partial_hits,
    sglang_deletes,
    sglang_digest,
    vllm_gate,
)
from fi_cache.ranks.align import CannotAlign, align
from fi_cache.ranks.deployment import gather
from fi_cache.ranks.keys import rank_free
from tests.conftest import FIXTURES, H200, MOE_618_FUSED, flashinfer_dir

GEMM = H200 / "flashinfer-0.6.18-gemm.json"


def _cf(path: Path) -> v1.CacheFile:
    return v1.loads(path.read_bytes())


def _as_rank(cf: v1.CacheFile, tp_rank: int) -> v1.CacheFile:
    """The same tuning as rank `tp_rank` of tp 2 would key it (tp_size 2, tp_rank r)."""
    entries = {
        k.replace(", 8, 1, 0, 1, 0, 1, 0,", f", 8, 2, {tp_rank}, 1, 0, 1, 0,"): v
        for k, v in cf.entries.items()
    }
    return v1.CacheFile(cf.metadata, entries, cf.records, cf.generation, cf.unknown, cf.reserved)


def _pair(a: v1.CacheFile, b: v1.CacheFile | None) -> list[RankFile]:
    return [RankFile("dp0_rank0", "a", a), RankFile("dp0_rank1", "b", b)]


def _drop(cf: v1.CacheFile, n: int) -> v1.CacheFile:
    keys = list(cf.entries)[n:]
    return v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys}, None, None)


def test_rank_fields_are_masked_only_in_moe_keys() -> None:
    moe = _cf(MOE_618_FUSED)
    r0, r1 = (next(iter(_as_rank(moe, r).entries)) for r in (0, 1))
    assert r0 != r1 and rank_free(r0)[1] and rank_free(r0)[0] == rank_free(r1)[0]
    gemm = next(iter(_cf(GEMM).entries))
    assert rank_free(gemm) == (gemm, False)


def test_vllms_gate_counts_every_top_level_field_and_compares_metadata() -> None:
    cf = _cf(GEMM)
    same = [RankFile("dp0_rank0", "a", cf), RankFile("dp0_rank1", "b", cf)]
    assert vllm_gate(same).loads
    short = vllm_gate([RankFile("dp0_rank0", "a", cf), RankFile("dp0_rank1", "b", _drop(cf, 1))])
    assert not short.loads and short.counts == {
        "dp0_rank0": len(cf.entries) + 1,
        "dp0_rank1": len(cf.entries) - 1,
    }
    other = v1.CacheFile({**(cf.metadata or {}), "cudnn_version": "1"}, cf.entries)
    verdict = vllm_gate([RankFile("dp0_rank0", "a", cf), RankFile("dp1_rank1", "b", other)])
    assert not verdict.loads and "cudnn_version" in verdict.reason()
    missing = vllm_gate([RankFile("dp0_rank0", "a", cf), RankFile("dp0_rank1", "b", None)])
    assert missing.missing == ("dp0_rank1",) and "no readable file" in missing.reason()


def test_equal_counts_with_other_keys_pass_the_gate_and_are_named() -> None:
    cf = _cf(GEMM)
    a = _drop(cf, 1)
    b = v1.CacheFile(cf.metadata, {k: v for i, (k, v) in enumerate(cf.entries.items()) if i != 1})
    group = [RankFile("dp0_rank0", "a", a), RankFile("dp0_rank1", "b", b)]
    assert vllm_gate(group).loads
    assert partial_hits(group) == {"dp0_rank0": 1, "dp0_rank1": 1}


def test_divergent_tactics_and_align_keeps_the_lowest_ranks() -> None:
    cf = _cf(GEMM)
    key = next(iter(cf.entries))
    other = dict(cf.entries)
    other[key] = [other[key][0], 99]
    group = _pair(cf, v1.CacheFile(cf.metadata, other))
    [d] = divergent_tactics(group)
    assert d.key == key and len(d.choices) == 2
    out = align(group)
    assert out.file.entries[key] == cf.entries[key] and [c.key for c in out.chosen] == [key]


def test_align_refuses_a_rank_without_its_own_moe_entries() -> None:
    moe = _cf(MOE_618_FUSED)
    group = _pair(_as_rank(moe, 0), _drop(_as_rank(moe, 1), 2))
    with pytest.raises(CannotAlign, match=r"dp0_rank1 \(2\)"):
        align(group)
    cold = [RankFile("dp0_rank0", "a", _as_rank(moe, 0)), RankFile("dp0_rank1", "b", None)]
    with pytest.raises(CannotAlign, match="only that rank can tune them"):
        align(cold)


def test_align_refuses_ranks_of_another_environment() -> None:
    cf = _cf(GEMM)
    other = v1.CacheFile({**(cf.metadata or {}), "gpu": "NVIDIA H100"}, cf.entries)
    with pytest.raises(CannotAlign, match="different environments"):
        align([RankFile("dp0_rank0", "a", cf), RankFile("dp0_rank1", "b", other)])


def _write(path: Path, cf: v1.CacheFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(v1.dumps(cf))


def test_gather_infers_the_missing_world_rank_of_a_folded_deployment(tmp_path: Path) -> None:
    cf = _cf(GEMM)
    hdir = tmp_path / "0.6.18" / "90a" / ("a" * 64)
    for name in ("dp0_rank0", "dp0_rank1", "dp1_rank3"):  # MoE -dp 2 -tp 2: dp1_rank2 lost
        _write(hdir / f"autotune_configs_{name}.json", cf)
    [dep] = gather(inventory.scan([tmp_path]).caches)
    assert dep.inferred == ("dp1_rank2",)
    [group] = dep.groups()
    assert vllm_gate(group).missing == ("dp1_rank2",)


STRAY = "rank 2000000 is beyond any real world (max 4096): not inferring missing ranks"


@pytest.mark.parametrize(
    ("where", "names"),
    [
        (
            "0.6.18/90a/" + "a" * 64,
            ["autotune_configs_dp0_rank0", "autotune_configs_dp0_rank2000000"],
        ),
        (
            "flashinfer/autotune/0.6.18/sm90/0123456789abcdef",
            ["rank_tp0_pp0_dp0", "rank_tp2000000_pp0_dp0"],
        ),
    ],
)
def test_a_stray_rank_number_infers_nothing_and_says_so(
    run,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    where: str,
    names: list[str],
) -> None:
    # One copied file named rank 2000000 made align plan 2,000,001 files and doctor check them
    # (> 20 s, 0.6-0.9 GB; issue 42 F1).
    from fi_cache.maintenance.align import plan

    hdir = tmp_path / where
    for name in names:
        _write(hdir / f"{name}.json", _cf(GEMM))
    [dep] = gather(inventory.scan([hdir]).caches)
    assert dep.note == STRAY and dep.inferred == () and len(dep.ranks) == 2
    [group] = plan([hdir])
    assert len(group.ranks) == 2 and all(not created for _, created in group.writes)
    dry = run("align", hdir, "--dry-run")
    assert dry.code == 0 and STRAY in dry.err and "(2 ranks, " in dry.out, dry.out
    assert run("--format", "json", "align", hdir, "--dry-run").json()["groups"][0]["note"] == STRAY
    doctor = run("doctor", hdir)
    assert STRAY in doctor.out, doctor.out


def test_the_aligned_moe_files_load_whole_in_real_flashinfer(tmp_path: Path) -> None:
    moe = _cf(MOE_618_FUSED)
    out = align(_pair(_as_rank(moe, 0), _as_rank(moe, 1)))
    path = tmp_path / "aligned.json"
    path.write_text(v1.dumps(out.file))
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir("0.6.18"))}
    p = subprocess.run(
        [sys.executable, str(FIXTURES / "fi_load.py"), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = json.loads(p.stdout.strip().splitlines()[-1])
    # Both ranks' keys are in the one file every rank gets: each rank finds its own.
    assert result["returned"] is True and result["loaded"] == 2 * len(moe.entries)
    assert set(out.file.entries) <= set(result["keys"])


def _sglang_dir(root: Path, ranks: list[str], cf: v1.CacheFile) -> Path:
    hdir = root / "flashinfer" / "autotune" / "0.6.18" / "sm90" / ("d" * 16)
    hdir.mkdir(parents=True)
    for rank in ranks:
        _write(hdir / f"rank_{rank}.json", cf)
    return hdir


def test_sglang_groups_span_attention_dp_ranks_and_split_replicas(tmp_path: Path) -> None:
    cf = _cf(GEMM)
    # --tp-size 4 --dp-size 2 --enable-dp-attention: one TP group; dp = tp // 2.
    attn = _sglang_dir(tmp_path / "a", ["tp0_pp0_dp0", "tp1_pp0_dp0", "tp3_pp0_dp1"], cf)
    [dep] = gather(inventory.scan([attn]).caches)
    assert dep.inferred == ("tp2_pp0_dp1",)  # not tp0_pp0_dp1: TP ranks count across DP ranks
    assert [len(g) for g in dep.groups()] == [4]
    # --tp-size 2 --dp-size 2: two replicas, each its own TP group numbered from 0.
    plain = _sglang_dir(tmp_path / "b", ["tp0_pp0_dp0", "tp1_pp0_dp0", "tp0_pp0_dp1"], cf)
    [dep] = gather(inventory.scan([plain]).caches)
    assert dep.inferred == ("tp1_pp0_dp1",)
    assert [[rf.rank for rf in g] for g in dep.groups()] == [
        ["tp0_pp0_dp0", "tp1_pp0_dp0"],
        ["tp0_pp0_dp1", "tp1_pp0_dp1"],
    ]


def test_sglangs_digest_keeps_equal_content_whatever_its_layout() -> None:
    cf = _cf(GEMM)
    same = v1.loads(json.dumps(dict(reversed(list(json.loads(v1.dumps(cf)).items())))))
    group = [RankFile("tp0_pp0_dp0", "a", cf), RankFile("tp1_pp0_dp0", "b", same)]
    assert sglang_digest(group).loads  # SGLang re-dumps the parsed JSON with sorted keys
    cold = [RankFile(r, r, None, "missing") for r in ("tp0_pp0_dp0", "tp1_pp0_dp0")]
    assert not sglang_digest(cold).loads and not sglang_deletes(sglang_digest(cold))
    one_cold = [group[0], cold[1]]
    verdict = sglang_digest(one_cold)
    assert sglang_deletes(verdict) and verdict.missing == ("tp1_pp0_dp0",)
    other = v1.CacheFile({**(cf.metadata or {}), "cuda_version": "12.9"}, cf.entries)
    verdict = sglang_digest([group[0], RankFile("tp1_pp0_dp0", "b", other)])
    assert verdict.metadata == {"tp1_pp0_dp0": {"cuda_version": "12.9"}}
    verdict = sglang_digest([group[0], RankFile("tp1_pp0_dp0", "b", _drop(cf, 1))])
    assert verdict.differs == ("tp1_pp0_dp0",) and "differ from tp0_pp0_dp0's" in verdict.reason()
