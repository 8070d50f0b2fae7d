"""--gpu takes the names fi-cache prints: target.resolve_gpu against the names known."""

from __future__ import annotations

import pytest

from fi_cache.cli.render import short_gpu
from fi_cache.doctor.target import resolve_gpu
from fi_cache.errors import Refused

KNOWN = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"]


def test_the_short_name_ls_prints_is_the_one_full_name_it_stands_for() -> None:
    assert resolve_gpu(short_gpu("NVIDIA H200"), KNOWN) == "NVIDIA H200"
    assert resolve_gpu("H100 PCIe", KNOWN) == "NVIDIA H100 PCIe"  # the name without the vendor
    assert resolve_gpu("NVIDIA H100 PCIe", []) == "NVIDIA H100 PCIe"  # a full name as given


def test_a_short_name_of_several_is_refused_naming_them() -> None:
    with pytest.raises(Refused, match="NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe"):
        resolve_gpu("H100", KNOWN)


def test_an_unknown_short_name_is_nvidias_and_a_longer_name_is_kept() -> None:
    assert resolve_gpu("B200", KNOWN) == "NVIDIA B200"
    assert resolve_gpu("AMD Instinct MI300X", KNOWN) == "AMD Instinct MI300X"
