"""doctor/coverage.py over caches FlashInfer's real autotuner wrote on an H200 (tests/fixtures/
h200-tuned: `warm --engine flashinfer` of examples/plans/h200-gemm.toml, 0.6.17 and 0.6.18;
h200-moe-run: Qwen3-30B-A3B's MoE tuned fused, unfused and both), and the bucket rule checked
against FlashInfer 0.6.17's, 0.6.18's and 0.7.2.post1's own functions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fi_cache.doctor import coverage as cov
from fi_cache.doctor.logs import read_log
from fi_cache.engines.flashinfer import plan as plans
from fi_cache.model import v1
from fi_cache.model.buckets import bucket_of, tuned_buckets
from tests.conftest import FIXTURES, ROOT, flashinfer_dir, run_parallel

TUNED = FIXTURES / "h200-tuned"
MOE = FIXTURES / "h200-moe-run"
GEMM_PLAN = (ROOT / "examples" / "plans" / "h200-gemm.toml").read_text()
MOE_PLAN = (ROOT / "examples" / "plans" / "qwen3-30b-a3b-moe.toml").read_text()


def _cache(path: Path) -> v1.CacheFile:
    return v1.loads(path.read_bytes())


def _judge(cache: Path, plan_text: str, modes: tuple[str, ...] = ("fused",)) -> cov.Coverage:
    return cov.judge(_cache(cache), cov.from_plan(plans.loads(plan_text), modes))


def _reasons(c: cov.Coverage) -> dict[int, str | None]:
    return {p.want.bucket: p.reason for p in c.pairs if not p.tuned}


_CHECK = """
import json, sys
from flashinfer.fused_moe.utils import get_hybrid_num_tokens_buckets, map_to_hybrid_bucket_uncapped
n = range(1, 20000, 7)
print(json.dumps([[list(get_hybrid_num_tokens_buckets(x)) for x in n],
                  [map_to_hybrid_bucket_uncapped(x) for x in range(1, 20000)]]))
"""


def test_the_bucket_rule_is_flashinfers_own() -> None:
    versions = ("0.6.17", "0.6.18", "0.7.2.post1")
    jobs = [
        {
            "args": [sys.executable, "-c", _CHECK],
            "env": {**os.environ, "PYTHONPATH": str(flashinfer_dir(v))},
        }
        for v in versions
    ]
    ours = [
        [list(tuned_buckets(x)) for x in range(1, 20000, 7)],
        [bucket_of(x) for x in range(1, 20000)],
    ]
    for version, p in zip(versions, run_parallel(*jobs), strict=True):
        assert p.returncode == 0, p.stderr[-2000:]
        assert json.loads(p.stdout.strip().splitlines()[-1]) == ours, version


@pytest.mark.parametrize("version", ["0.6.17", "0.6.18"])
def test_a_warm_of_a_plan_covers_that_plan_whole(version: str) -> None:
    c = _judge(TUNED / f"fi-{version}" / "flashinfer" / "autotune_configs.json", GEMM_PLAN)
    assert (c.tuned, len(c.pairs), c.ratio) == (24, 24, 1.0)  # 12 buckets x mm_bf16, bmm_fp8
    bf16_at_1 = next(p for p in c.pairs if p.want.op == "bf16_gemm" and p.want.bucket == 1)
    assert len(bf16_at_1.found) == 4  # two runners, each keyed twice (workspace size) at 1


def test_each_missing_pair_says_why() -> None:
    cache = TUNED / "fi-0.6.18" / "flashinfer" / "autotune_configs.json"
    longer = GEMM_PLAN.replace("tokens = [1, 16, 128, 1024]", "tokens = [1, 16, 128, 2048]")
    c = _judge(cache, longer)
    assert c.tuned == 24 and len(c.pairs) == 32  # 1280, 1536, 1792, 2048 of both ops
    assert set(_reasons(c)) == {1280, 1536, 1792, 2048}
    assert all(
        r and r.startswith("bucket never warmed") and "above the largest" in r
        for r in _reasons(c).values()
    )
    wider = GEMM_PLAN.replace(
        'n = 2048\nk = 4096\nbackends = ["cublas"]', 'n = 4096\nk = 4096\nbackends = ["cublas"]'
    )
    c = _judge(cache, wider)
    assert c.tuned == 12 and all(
        p.reason and p.reason.startswith("shape never warmed: fp8_gemm")
        for p in c.pairs
        if not p.tuned
    )
    other = '[[ops]]\nop = "mm_fp8"\nn = 2048\nk = 4096\ntokens = [16]\n'
    c = _judge(cache, other)
    assert c.tuned == 0 and set(_reasons(c).values()) == {
        "op never tuned: no trtllm_low_latency_gemm entry in the cache"
    }


def test_a_moe_cache_covers_only_its_own_finalize_mode_and_dtype() -> None:
    fused = MOE / "0.6.18" / "fused-namespace.json"
    assert _judge(fused, MOE_PLAN, ("fused",)).ratio == 1.0  # gemm1, gemm2 x 12 buckets
    miss = _judge(fused, MOE_PLAN, ("unfused",))
    assert miss.tuned == 0 and len(miss.pairs) == 24
    assert set(_reasons(miss).values()) == {"finalize-mode miss: tuned fused only"}
    both = _judge(MOE / "0.6.18" / "both-modes.json", MOE_PLAN, ("fused", "unfused"))
    assert (both.tuned, len(both.pairs)) == (48, 48)
    fp16 = _judge(fused, MOE_PLAN.replace('dtype = "bf16"', 'dtype = "fp16"'), ("fused",))
    assert set(_reasons(fp16).values()) == {"dtype: tuned for torch.bfloat16 only"}


def test_keys_that_cannot_say_the_mode_count_for_either_with_a_note() -> None:
    c = _judge(MOE / "0.6.17" / "fused-namespace.json", MOE_PLAN, ("unfused",))
    assert c.ratio == 1.0  # FlashInfer 0.6.17 replays them (and may crash: doctor says so)
    assert {p.reason for p in c.pairs} == {
        "keys do not say the finalize mode (FlashInfer < 0.6.18rc2)"
    }


def test_a_start_that_fell_back_is_explained_from_its_log() -> None:
    facts = read_log(MOE / "0.6.18" / "call-unfused-under-fused.log")
    c = cov.judge(_cache(MOE / "0.6.18" / "fused-namespace.json"), cov.from_log(facts.fallbacks))
    assert [(p.want.op, p.want.bucket, p.tuned) for p in c.pairs] == [
        ("trtllm::fused_moe::gemm1", 1, False),
        ("trtllm::fused_moe::gemm2", 1, False),
    ]
    assert all(
        p.reason and p.reason.startswith("finalize-mode miss: tuned fused only") for p in c.pairs
    )
    replay = read_log(MOE / "0.6.18" / "replay-unfused-under-fused.log")
    wants = cov.from_log(replay.fallbacks)
    assert sorted({w.bucket for w in wants}) == list(tuned_buckets(1024))  # every bucket missed


def _fallbacks_against_a_cache(n: int) -> tuple[v1.CacheFile, list[cov.Want]]:
    """n entries of 7 widths, and a log's n fallbacks of those shapes above the largest bucket
    (FlashInfer looks that one up; the F6 repro: 1000 lines x 20,000 entries took 8.4 s)."""
    from fi_cache.doctor.logs import Fallback

    key = "('bf16_gemm', 'R', (({m}, 4096), (4096, {w}), (0,), (-1, {w})), ({m}, {w}, 4096))"
    meta = {"flashinfer_version": "0.6.18"}
    entries = {key.format(m=m, w=2048 + 128 * (m % 7)): ["R", 1] for m in range(1, n + 1)}
    shapes = "(({m}, 4096), (4096, {w}), (0,), (-1, {w}))"
    fallbacks = [
        Fallback("bf16_gemm", -1, i, shapes.format(m=300_001 + i, w=2048 + 128 * (i % 7)))
        for i in range(n)
    ]
    return v1.CacheFile(meta, entries), cov.from_log(fallbacks)


def test_log_lookups_read_only_their_own_shapes_entries() -> None:
    from tests.growth import growth

    cache, wants = _fallbacks_against_a_cache(70)
    pairs = cov.judge(cache, wants).pairs
    assert len(pairs) == 70 and not any(p.tuned for p in pairs)
    assert all("keyed otherwise" in (p.reason or "") for p in pairs), pairs[0].reason

    def judged(n: int):  # type: ignore[no-untyped-def]
        cache, wants = _fallbacks_against_a_cache(n)
        return lambda: cov.judge(cache, wants)

    assert growth(judged, 140) < 2.6  # each lookup scanned every entry of the op: ~4
