"""Finalize mode of fused-MoE entries, from the keys FlashInfer 0.6.17/0.6.18 really write."""

from __future__ import annotations

from fi_cache.model import keys, moe, v1
from fi_cache.versions import MOE_EXTRAS_FIELDS
from tests.conftest import MOE_617_FUSED, MOE_617_UNFUSED, MOE_618_FUSED, MOE_618_UNFUSED


def _moe_keys(path) -> list[keys.CacheKey]:  # type: ignore[no-untyped-def]
    cf = v1.loads(path.read_bytes())
    return [k for k in map(keys.parse_key, cf.entries) if moe.is_moe(k.op)]


def test_0618_keys_carry_the_finalize_mode() -> None:
    assert {moe.finalize_mode(k) for k in _moe_keys(MOE_618_FUSED)} == {"fused"}
    assert {moe.finalize_mode(k) for k in _moe_keys(MOE_618_UNFUSED)} == {"unfused"}
    assert v1.loads(MOE_618_FUSED.read_bytes()).finalize() == "fused"


def test_0617_keys_cannot_tell_fused_from_unfused() -> None:
    fused, unfused = _moe_keys(MOE_617_FUSED), _moe_keys(MOE_617_UNFUSED)
    assert {moe.finalize_mode(k) for k in fused + unfused} == {"unknown"}
    # the collision itself: the same keys, whichever mode tuned them
    assert {keys.format_key(k) for k in fused} == {keys.format_key(k) for k in unfused}


def test_extras_get_their_field_names() -> None:
    key = _moe_keys(MOE_618_FUSED)[0]
    named = moe.named_extras(key)
    assert named is not None
    assert named["top_k"] == 8 and named["use_fused_finalize"] is True
    assert str(named["x_dtype"]) == "torch.bfloat16"
    assert list(named) == list(MOE_EXTRAS_FIELDS[20])


def test_0_7_4_layout_has_17_fields_and_the_same_last_field() -> None:
    fields = MOE_EXTRAS_FIELDS[17]
    assert len(fields) == 17 and fields[-1] == "use_fused_finalize"
    assert not {"tp_rank", "ep_rank", "cluster_rank"} & set(fields)
    extras = ", ".join(
        ["torch.bfloat16"] * 3 + ["8"] + ["1"] * 3 + ["False"] * 6 + ["True", "3", "False", "False"]
    )
    key = keys.parse_key(f"('trtllm::fused_moe::gemm2', 'MoERunner', ((8, 2048),), ({extras}))")
    assert moe.finalize_mode(key) == "unfused"


def test_file_mode_from_entry_modes() -> None:
    assert moe.combine(set()) is None
    assert moe.combine({"fused"}) == "fused"
    assert moe.combine({"fused", "unfused"}) == "mixed"
    assert moe.combine({"unknown"}) == "unknown"


def test_moelayer_stage_ops_count_as_moe() -> None:
    assert moe.is_moe("moe_cutlass_sm90_gemm2") and moe.is_moe("trtllm::fused_moe::gemm1")
    assert not moe.is_moe("bf16_gemm") and not moe.is_moe("moe_align")


# --- what a fused-tuned GEMM2 id does in an unfused run (<= 0.6.17 keys) --------------------------


def test_the_measured_h200_lists_split_ids_as_the_issue_states() -> None:
    """bf16 on SM90: ids 45-62 are the same configs in both lists, 63-89 differ, >= 90 crash."""
    from fi_cache.model.moe import split_gemm2
    from fi_cache.versions import moe_tactic_lists

    lists = moe_tactic_lists("0.6.17", 90, "bf16")
    assert lists is not None and (lists.gemm1, lists.gemm2_count("fused")) == (45, 81)
    assert lists.gemm2_count("unfused") == 45
    s = split_gemm2(list(range(45, 126)), 45, lists.gemm2["fused"], lists.gemm2["unfused"])
    assert s.same_kernel == tuple(range(45, 63))
    assert s.other_kernel == tuple(range(63, 90)) and s.crash == tuple(range(90, 126))
    back = split_gemm2(list(range(45, 90)), 45, lists.gemm2["unfused"], lists.gemm2["fused"])
    assert back.crash == () and back.same_kernel == tuple(range(45, 63))  # fused's list is longer
    assert moe_tactic_lists("0.6.17", 100, "bf16") is None  # not measured: no split claimed
