"""The caches FlashInfer 0.7.2.post1 and 0.6.18 wrote on a real H200 (tests/fixtures/h200-fi07,
see its README): fi-cache's readers take the v2 stores and the v1 files as they are, FlashInfer's
own readers load them, and the restart records show which keys a restart profiles again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fi_cache.caches import inventory
from fi_cache.model import keys, v1, v2
from tests.conftest import FIXTURES, fi_load_argv, fi_load_result, flashinfer_dir

FI07 = FIXTURES / "h200-fi07"
V072 = FI07 / "fi-0.7.2.post1"
STORES = {
    "v2-default": {},
    "v2-vllm-policy": {"measure_execution_mode": "cuda_graph", "measure_cold_l2": "True"},
}
V1_FILES = {
    "0.7.2.post1": (V072 / "autotune_configs_dp0_rank0.json", 36),
    "0.6.18": (FI07 / "fi-0.6.18" / "autotune_configs_dp0_rank0.json", 38),
}
CUBLASLT = "CublasltBf16GemmRunner"


def _record(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("store", list(STORES))
def test_v2_store_read_as_flashinfer_wrote_it(store: str) -> None:
    inv = inventory.scan([V072 / store])
    assert not inv.problems and not inv.empty
    [cache] = inv.caches
    assert cache.found.format == "v2" and not cache.read_defects  # env hash = dir, names = hashes
    assert not list(v1.defects(cache.file))
    meta = cache.file.metadata
    assert meta["flashinfer_version"] == "0.7.2.post1" and meta["gpu"] == "NVIDIA H200"
    assert {k: meta[k] for k in STORES[store]} == STORES[store]  # the policy is in the identity
    assert len(cache.file.entries) == 36  # 12 buckets x 3 runners: no workspace-grown twins
    assert set(cache.file.ops()) == {"bf16_gemm", "fp8_gemm"}
    for path in sorted((cache.found.path / v2.ENTRIES_DIR).glob("*.json")):
        entry = v2.parse_entry(path.name, json.loads(path.read_text()))
        assert {"key_fields", "profiling_policy"} <= set(entry.extra)  # 0.7.2.post1 writes both


@pytest.mark.parametrize("version", list(V1_FILES))
def test_v1_file_read(version: str) -> None:
    path, n = V1_FILES[version]
    [cache] = inventory.scan([path]).caches
    assert len(cache.file.entries) == n and not list(v1.defects(cache.file))
    assert cache.file.generation == v1.compute_generation(cache.file)
    # 0.7.2.post1 appends the profiling policy to every value; 0.6.18 writes [runner, tactic].
    assert {len(v) for v in cache.file.entries.values()} == {3 if version == "0.7.2.post1" else 2}


@pytest.mark.parametrize(
    "record",
    [
        "fi-0.7.2.post1/v2-default-restart.json",
        "fi-0.7.2.post1/v1-restart.json",
        "fi-0.7.2.post1/v2-vllm-policy-restart.json",
        "fi-0.6.18/v1-restart.json",
    ],
)
def test_restart_profiles_cublaslt_buckets_under_the_callers_m(record: str) -> None:
    """A restart on the unchanged cache profiles 22 buckets of 3 calls: the cuBLASLt runner keys
    its entries by M (extras[0]); choose_one looks every bucket up with the caller's M, but stores
    it under the bucket's own M, so only the bucket equal to the caller's M hits."""
    rec = _record(FI07 / record)
    calls = {c["i"]: c for c in rec["calls"]}
    assert rec["keys_before"] == rec["keys_after"] and not rec["new_keys"]
    assert {p["i"] for p in rec["profiled"]} == {3, 5, 7}  # cuBLASLt at M = 16, 128, 1024
    assert len(rec["profiled"]) == 22
    for p in rec["profiled"]:
        looked, stored = keys.parse_key(p["lookup_key"]), keys.parse_key(p["stored_key"])
        assert p["runner"] == stored.runner == CUBLASLT and p["stored_in_file"]
        assert not p["lookup_in_file"] and looked.profile == stored.profile
        assert isinstance(looked.extras, tuple) and isinstance(stored.extras, tuple)
        assert looked.extras[1:] == stored.extras[1:]  # only M differs
        assert looked.extras[0] == calls[p["i"]]["tokens"] and stored.extras[0] == p["bucket"]
        assert p["bucket"] < calls[p["i"]]["tokens"]


@pytest.mark.parametrize(
    "record", ["fi-0.7.2.post1/v2-default-replay.json", "fi-0.6.18/v1-replay.json"]
)
def test_replay_misses_cublaslt_off_bucket(record: str) -> None:
    """Serving (no tuning): cuBLASLt's tuned tactic is used only at an M that is a bucket."""
    misses = {(x["runner"], x["m"]) for x in _record(FI07 / record)["lookups"] if not x["hit"]}
    assert misses == {(CUBLASLT, 3), (CUBLASLT, 100), (CUBLASLT, 1000)}


def test_flashinfer_072_loads_its_own_files() -> None:
    """FlashInfer 0.7.2.post1's own readers: load_configs takes all 36 v1 entries, the managed
    store's preload all 36 v2 entries of each store (the checks lookup() makes, in bulk)."""
    site = str(flashinfer_dir("0.7.2.post1"))
    env = {**os.environ, "PYTHONPATH": site}
    p = subprocess.run(
        fi_load_argv(V1_FILES["0.7.2.post1"][0]),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert fi_load_result(p)["loaded"] == 36, p.stderr[-2000:]
    script = (
        "import json, sys, pathlib\n"
        "from flashinfer.autotune_cache import ManagedAutotuneCache\n"
        "for root in sys.argv[1:]:\n"
        "    [m] = pathlib.Path(root).glob('v2/*/manifest.json')\n"
        "    man = {k: v for k, v in json.loads(m.read_text()).items() if k != 'cache_schema'}\n"
        "    store = ManagedAutotuneCache(man, root)\n"
        "    entries, total, skipped = store.preload()\n"
        "    print(json.dumps([store.env_hash == m.parent.name, len(entries), total, skipped]))\n"
    )
    roots = [str(V072 / s) for s in STORES]
    p = subprocess.run(
        [sys.executable, "-c", script, *roots],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert [json.loads(line) for line in p.stdout.splitlines()] == [[True, 36, 36, 0]] * 2
