"""The version table: ordering of real release strings and vLLM's arch dir names."""

from __future__ import annotations

import pytest

from fi_cache.versions import (
    Version,
    flashinfer_keys_carry_finalize,
    flashinfer_writes_generation,
    parse_version,
    vllm_arch,
)


@pytest.mark.parametrize(
    "older, newer",
    [
        ("0.6.17", "0.6.18rc2"),
        ("0.6.18rc1", "0.6.18rc2"),
        ("0.6.18rc2", "0.6.18"),
        ("0.6.18", "0.6.18.post1"),
        ("0.6.8.post1", "0.6.11"),
        ("0.7.0.dev3", "0.7.0rc1"),
        ("0.7.0", "0.7.0.post1"),
        ("0.7.2.post1", "0.7.4"),
        ("0.29.0", "0.30.0+cu130"),
    ],
)
def test_release_order(older: str, newer: str) -> None:
    assert Version.parse(older) < Version.parse(newer)


def test_equal_spellings() -> None:
    assert Version.parse("0.7") == Version.parse("0.7.0")
    assert parse_version("unknown") is None and parse_version("*") is None
    assert parse_version("banana") is None


def test_finalize_boundary_is_0_6_18rc2() -> None:
    assert flashinfer_keys_carry_finalize("0.6.17") is False
    assert flashinfer_keys_carry_finalize("0.6.18rc1") is False
    assert flashinfer_keys_carry_finalize("0.6.18rc2") is True
    assert flashinfer_keys_carry_finalize("0.7.4") is True
    assert flashinfer_keys_carry_finalize(None) is None
    assert flashinfer_writes_generation("0.6.18") is True


@pytest.mark.parametrize(
    "caps, cuda, arch_list, expected",
    [
        (["9.0"], "13.0", None, "90a"),
        (["9.0", "9.0"], "13.0", None, "90a"),
        (["8.0"], "12.8", None, "80"),
        (["10.0", "9.0", "8.0"], "13.0", None, "80_90a_100a"),
        (["10.3"], "13.0", None, "103a"),
        (["12.0"], "13.0", None, "120f"),
        (["12.0"], "12.8", None, "120a"),
        (["12.1"], "13.0", None, "121a"),
        (["9.0"], "13.0", "9.0 10.0a", "90a_100a"),
        (["9.0"], "13.0", "12.1a", "121a"),
        ([], None, None, None),
    ],
)
def test_vllm_arch_dir(
    caps: list[str], cuda: str | None, arch_list: str | None, expected: str | None
) -> None:
    assert vllm_arch(caps, cuda, arch_list) == expected


def test_version_ranges_read_in_the_wheels() -> None:
    from fi_cache.versions import DOUBLE_REDUCE, MOE_KEY_HAS_RANKS, WARM_CACHE_HANG, V

    # FlashInfer 0.7.1's MoE keys still hold the ranks; 0.7.2rc3 (so vLLM 0.33's 0.7.2.post1) not.
    assert V("0.7.1") in MOE_KEY_HAS_RANKS and V("0.7.2rc3") not in MOE_KEY_HAS_RANKS
    assert V("0.7.2.post1") not in MOE_KEY_HAS_RANKS
    # vLLM 0.32 already gates loading on every rank having a matching per-rank file.
    assert V("0.31.0") in WARM_CACHE_HANG and V("0.32.0") not in WARM_CACHE_HANG
    assert V("0.15.1") in DOUBLE_REDUCE and V("0.22.0") not in DOUBLE_REDUCE
