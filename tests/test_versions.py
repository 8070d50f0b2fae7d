"""The version table: ordering of real release strings and vLLM's arch dir names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.versions import (
    SGLANG_FLASHINFER_PIN,
    Version,
    flashinfer_keys_carry_finalize,
    flashinfer_writes_generation,
    parse_version,
    sglang_finalize_default,
    vllm_arch,
)
from tests.conftest import flashinfer_dir


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
        (["9.0"], "13.0", "9.0 9.0a", "90a"),  # one arch, as FlashInfer's set has it
        (["12.0"], "12.6", None, None),  # FlashInfer raises inside detection: no arch
        (["9.0", "12.1"], "12.8", None, "90a"),  # detection stops at the GPU it cannot name
        (["9.0"], "13.0", "9.0  10.0", None),  # a double space: FlashInfer's import raises
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


_FI_ARCH = """
import json, os, sys
from flashinfer.compilation_context import CompilationContext
from flashinfer.jit import cpp_ext
out = []
for arch_list, cuda in json.loads(sys.argv[1]):
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list
    with open(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"), "w") as f:
        f.write(f"#!/bin/sh\\necho 'Cuda compilation tools, release {cuda}, V{cuda}.0'\\n")
    os.chmod(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"), 0o755)
    cpp_ext.get_cuda_version.cache_clear()
    try:
        archs = CompilationContext().TARGET_CUDA_ARCHS
        out.append("_".join(f"{ma}{mi}" for ma, mi in sorted(archs)) or None)
    except Exception:
        out.append(None)
print(json.dumps(out))
"""


def test_vllm_arch_agrees_with_flashinfers_own_code(tmp_path: Path) -> None:
    """FlashInfer 0.7.2.post1's CompilationContext, run on CPU with FLASHINFER_CUDA_ARCH_LIST and
    an nvcc that reports the CUDA version (nvcc's is read before torch's), names the same arch."""
    cases = [
        ("9.0", "13.0"),
        ("9.0 9.0a", "13.0"),
        ("8.0 9.0 10.0", "12.8"),
        ("10.3", "13.0"),
        ("12.0", "13.0"),
        ("12.0", "12.9"),
        ("12.0", "12.8"),
        ("12.0", "12.6"),
        ("12.1", "12.9"),
        ("12.1", "12.8"),
        ("12.1a", "12.0"),
        ("9.0  10.0", "13.0"),
    ]
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(flashinfer_dir("0.7.2.post1")),
        "CUDA_HOME": str(tmp_path / "cuda"),
    }
    out = subprocess.run(
        [sys.executable, "-c", _FI_ARCH, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = [vllm_arch([], cuda, arch_list) for arch_list, cuda in cases]
    assert ours == theirs


@pytest.mark.parametrize(
    "version, mode",
    [
        ("0.5.17", None),
        ("0.5.18", "fused"),
        ("0.5.20", "fused"),
        ("0.5.21", "unfused"),
        ("0.5.23", "unfused"),
        ("unknown", None),
    ],
)
def test_sglang_finalize_default_by_release(version: str, mode: str | None) -> None:
    assert sglang_finalize_default(version) == mode


def test_sglang_finalize_default_matches_the_wheels() -> None:
    """The release wheels' environ.py (those scripts/test.sh downloads: 0.5.18, 0.5.23) declare
    the default the table says."""
    import zipfile

    from tests.sglang_layout import WHEELS

    wheels = sorted(WHEELS.glob("sglang-*.whl"))
    if not wheels and not os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
        pytest.skip(f"no SGLang wheels in {WHEELS} (scripts/test.sh downloads them)")
    assert wheels, f"no SGLang wheels in {WHEELS}"
    for wheel in wheels:
        version = wheel.name.split("-")[1]
        with zipfile.ZipFile(wheel) as z:
            text = z.read("sglang/srt/environ.py").decode()
        m = re.search(r"SGLANG_FLASHINFER_MOE_FUSED_FINALIZE = EnvBool\((True|False)\)", text)
        said = None if m is None else ("fused" if m.group(1) == "True" else "unfused")
        assert sglang_finalize_default(version) == said, version
        assert version in SGLANG_FLASHINFER_PIN, version
