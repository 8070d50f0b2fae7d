"""The caches `fi-cache warm --engine flashinfer` tuned on a real H200 (tests/fixtures/h200-tuned,
see its README): FlashInfer of the same version loads them, fi-cache verifies them, their
manifests reproduce the namespace they came from, and a store holding one is clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import Namespace
from tests.conftest import (
    FIXTURES,
    FLASHINFER_INSTALLS,
    H200_ROW,
    ROOT,
    fake_gpu_bin,
    fi_load_argv,
    fi_load_result,
    flashinfer_dir,
    run_parallel,
    seed_flashinfer_probe,
    start_if_needed,
)

TUNED = FIXTURES / "h200-tuned"
# The store path each came from (README); the hash pins Namespace's digest of the fingerprint.
RELPATHS = {
    "0.6.17": "namespaces/0.6.17/90a/nvidia-h200/fused-011c66d87555",
    "0.6.18": "namespaces/0.6.18/90a/nvidia-h200/fused-a43c9a9618a2",
}
VERSIONS = list(RELPATHS)
# 12 buckets x 3 GEMM runners, + bucket 1 of both bf16 runners keyed again after the workspace grew
ENTRIES = 38


def _dir(version: str) -> Path:
    return TUNED / f"fi-{version}"


def _cache(version: str) -> Path:
    return _dir(version) / "flashinfer" / "autotune_configs.json"


def _manifest(version: str) -> manifests.Manifest:
    return manifests.from_json(json.loads((_dir(version) / "manifest.json").read_text()))


def _fi_cache(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    [p] = run_parallel({"args": [sys.executable, "-m", "fi_cache", *map(str, args)], "env": env})
    return p


def _load_all() -> dict[str, subprocess.CompletedProcess[str]]:
    """fi_load.py on each fixture, with its own FlashInfer version, in parallel."""
    versions = [v for v in VERSIONS if v in FLASHINFER_INSTALLS]
    jobs = [
        {
            "args": fi_load_argv(_cache(v)),
            "env": {**os.environ, "PYTHONPATH": str(FLASHINFER_INSTALLS[v])},
        }
        for v in versions
    ]
    return dict(zip(versions, run_parallel(*jobs), strict=True))


@pytest.fixture(scope="module", autouse=True)
def _loading(request: pytest.FixtureRequest) -> Iterator[Future[Any] | None]:
    """Start FlashInfer's loads when the module starts (if a selected test needs them): the
    other tests run meanwhile."""
    yield from start_if_needed(request, "loaded", _load_all)


@pytest.fixture(scope="module")
def loaded(_loading: Future[Any] | None) -> dict[str, subprocess.CompletedProcess[str]]:
    assert _loading is not None
    return _loading.result()  # type: ignore[no-any-return]


def test_verify_accepts_them() -> None:
    p = _fi_cache("verify", *(_dir(v) for v in VERSIONS))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "2 ok, 0 with problems"
    assert lines[0].startswith("ok ") and lines[0].endswith(f"({ENTRIES} entries)")
    assert lines[1].startswith("ok ") and lines[1].endswith(f"({ENTRIES} entries, _generation ok)")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_manifest_reproduces_the_namespace_it_came_from(version: str) -> None:
    m = _manifest(version)
    assert m.finalize == "fused"
    assert m.fingerprint.flashinfer_version == version and m.fingerprint.gpu == "NVIDIA H200"
    assert Namespace(m.fingerprint, "fused").relpath == Path(RELPATHS[version])
    # The fingerprint is the file's own `_metadata` (what FlashInfer stamped) and the arch.
    saved = json.loads(_cache(version).read_text())["_metadata"]
    assert {k: v for k, v in m.fingerprint.metadata().items() if v is not None} == saved
    assert [w.engine for w in m.warms] == ["flashinfer", "flashinfer"]
    assert all(w.files[0].entries == ENTRIES for w in m.warms)


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", VERSIONS)
def test_a_store_holding_the_fixture_is_clean(tmp_path: Path, version: str) -> None:
    """Copied where it came from, on a machine that is that H200: this namespace is the one
    fi-cache picks (`env`), and doctor finds nothing wrong with it."""
    fi = flashinfer_dir(version)  # its dist-info gives the cheap probe the FlashInfer version
    store = tmp_path / "store"
    shutil.copytree(_dir(version), store / RELPATHS[version])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FI_CACHE_", "VLLM_"))}
    env.update(
        PATH=f"{fake_gpu_bin(tmp_path / 'bin', H200_ROW)}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(fi), str(ROOT)]),
    )
    saved = json.loads(_cache(version).read_text())["_metadata"]
    seed_flashinfer_probe(store, env, saved)
    where = _fi_cache("--store", store, "--format", "json", "env", env=env)
    assert json.loads(where.stdout)["namespaces"]["fused"] == str(store / RELPATHS[version])
    doctor = _fi_cache("--store", store, "--format", "json", "doctor", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["findings"] == [] and report["errors"] == report["warnings"] == 0


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", VERSIONS)
def test_flashinfer_of_the_same_version_loads_every_entry(
    loaded: dict[str, subprocess.CompletedProcess[str]], version: str
) -> None:
    flashinfer_dir(version)
    result = fi_load_result(loaded[version])
    assert "error" not in result, result.get("error")
    assert result["flashinfer_version"] == version
    assert result["returned"] is True and result["loaded"] == ENTRIES
    saved = json.loads(_cache(version).read_text())
    assert result["keys"] == sorted(k for k in saved if not k.startswith("_"))
    assert result["values"] == {k: saved[k][:2] for k in result["keys"]}


def test_a_plans_scale_shape_reached_flashinfers_keys_on_the_h200() -> None:
    """call-style/: one plan, bmm_fp8 called with 0-d scales and with a (1,) activation scale
    (vLLM's dynamic quantisation): FlashInfer tuned each style under its own keys, bucket by
    bucket, so a cache tuned one way is not looked up by a caller of the other."""
    p = _fi_cache("--format", "json", "show", TUNED / "call-style" / "autotune_configs.json")
    assert p.returncode == 0, p.stderr
    by_style: dict[str, list[int]] = {}
    for e in json.loads(p.stdout)["entries"]:
        a, _b, a_scale, b_scale, _out, _ws = e["profile"]
        assert e["op"] == "fp8_gemm" and b_scale == []
        by_style.setdefault(json.dumps(a_scale), []).append(a[1])
    assert {k: sorted(v) for k, v in by_style.items()} == {
        "[]": [1, 2, 4, 8, 16],
        "[1]": [1, 2, 4, 8, 16],
    }
