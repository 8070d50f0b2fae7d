"""diff over real files: vLLM 0.26's fused and unfused H200 tunes (FlashInfer 0.6.17 keys say no
mode), FlashInfer 0.6.18's (its keys do)."""

from __future__ import annotations

import json

from fi_cache.model import v1
from fi_cache.model.diff import diff
from tests.conftest import FIXTURES, MOE_618_FUSED, MOE_618_UNFUSED

H200_VLLM = FIXTURES / "h200-vllm"


def _cf(name: str) -> v1.CacheFile:
    return v1.loads((H200_VLLM / name).read_bytes())


def test_two_finalize_modes_of_one_model_pick_other_tactics_for_the_same_keys() -> None:
    d = diff(
        _cf("vllm-0.26-fused-autotune_configs.json"), _cf("vllm-0.26-unfused-autotune_configs.json")
    )
    assert (d.count("only-a"), d.count("only-b"), d.count("changed"), d.same) == (0, 0, 25, 17)
    gemm2 = [e for e in d.entries if e.op == "trtllm::fused_moe::gemm2"]
    assert len(gemm2) == 21 and not d.metadata
    first = next(e for e in gemm2 if e.bucket.startswith("1024x2048 "))
    assert first.a is not None and first.b is not None
    assert (first.a.tactic, first.a.family) == (75, "finalize|swap_base")  # 0.6.17: mode unsaid
    assert (first.b.tactic, first.b.family) == (53, "base")  # base ids lead both lists


def test_keys_that_carry_the_mode_are_only_in_one_file_and_named_by_family() -> None:
    d = diff(v1.loads(MOE_618_FUSED.read_bytes()), v1.loads(MOE_618_UNFUSED.read_bytes()))
    moe = [e for e in d.entries if e.op and "gemm2" in e.op]
    assert moe and all(e.change in ("only-a", "only-b") for e in moe)
    families = {e.a.family for e in moe if e.a} | {e.b.family for e in moe if e.b}
    assert families and not any("|" in f for f in families if f)  # the key says the mode


def test_a_file_against_itself_and_a_changed_metadata_field() -> None:
    raw = json.loads(MOE_618_FUSED.read_text())
    same = v1.loads(MOE_618_FUSED.read_bytes())
    assert not diff(same, same).differs
    raw["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    other = v1.loads(json.dumps(raw).encode())
    d = diff(same, other)
    assert d.differs and d.metadata == {"gpu": ("NVIDIA H200", "NVIDIA H100 80GB HBM3")}


def test_buckets_sort_numerically_whether_or_not_their_key_shape_was_seen_before() -> None:
    # A key shape met for the first time is parsed, later ones are read off their text: both
    # kinds must sort together (the first 1-, 2-, 3-digit bucket of a shape sorted last).
    from fi_cache.model import v1
    from fi_cache.model.diff import diff as diff_of

    key = "('gemm_x{n}', 'R', (({m}, 4096), (4096, 2048)), ())"
    meta = {"flashinfer_version": "0.6.18"}
    ms = (1024, 2, 128, 1, 16, 3)
    a = v1.CacheFile(meta, {key.format(n=7, m=m): ["R", 1] for m in ms})
    b = v1.CacheFile(meta, {key.format(n=7, m=m): ["R", 2] for m in ms})
    rows = diff_of(a, b).entries
    assert [e.bucket.split("x")[0] for e in rows] == ["1", "2", "3", "16", "128", "1024"]
