"""evict in a store namespace: recorded in its manifest (when, by which selector, which keys from
which file), shown by `show`, done under the namespace lock; a broken manifest stops it before
anything is written. The file is vLLM 0.26's real fused tune on an H200 (FlashInfer 0.6.17)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache.errors import FiCacheError
from fi_cache.maintenance.evict import Selector, apply
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from tests.conftest import VLLM_026_FUSED, VLLM_026_REL, vllm_026_namespace

FUSED, REL = VLLM_026_FUSED, VLLM_026_REL


def _warmed(store: Path) -> Path:
    """A namespace as a vLLM 0.26 warm leaves it: its file and a manifest recording the warm."""
    return vllm_026_namespace(store)


def test_the_manifest_records_each_evict_and_show_says_what_went(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _warmed(store)
    dry = run("evict", ns, "--op", "gemm2", "--tactic", "104", "--dry-run")
    assert dry.code == 0 and "recorded" not in dry.err
    assert manifests.load(ns).evictions == ()  # type: ignore[union-attr]
    r = run("evict", ns, "--op", "gemm2", "--tactic", "104")
    assert r.code == 0 and "evicted 2, kept 40" in r.out and "manifest.json" in r.err
    j = run("--format", "json", "evict", ns, "--bucket", "8192")
    [row] = j.json()["files"]
    assert row["recorded"] is True and row["namespace"] == str(ns)
    m = manifests.load(ns)
    assert m is not None and len(m.warms) == 1  # the warm is still there
    first, second = m.evictions
    assert first.selector == {"op": "gemm2", "tactic": 104}
    assert second.selector == {"bucket": 8192}
    [f] = first.files
    assert f.path == REL and len(f.evicted) == 2 and f.kept == 40
    assert not set(f.evicted) & set(json.loads((ns / REL).read_text()))  # gone from the file
    shown = run("show", ns / REL)
    assert "evicted 2 entries" in shown.out
    assert "fi-cache evict --op gemm2 --tactic 104" in shown.out
    doc = run("--format", "json", "show", ns / REL).json()
    assert [e["selector"] for e in doc["namespace"]["evictions"]] == [
        {"op": "gemm2", "tactic": 104},
        {"bucket": 8192},
    ]


def test_a_file_outside_the_store_is_evicted_without_a_record(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "autotune_configs.json"
    shutil.copy(FUSED, path)
    [row] = run("--format", "json", "evict", path, "--bucket", "1").json()["files"]
    assert row["recorded"] is False and row["namespace"] is None and len(row["evicted"]) == 2
    assert run("--format", "json", "show", path).json()["namespace"] is None


def test_a_broken_manifest_stops_the_evict_before_anything_is_written(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _warmed(store)
    (ns / "manifest.json").write_text('{"schema": 1, "warms": [')
    r = run("evict", ns, "--op", "gemm2", "--tactic", "104")
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "manifest.json" in r.err
    assert (ns / REL).read_bytes() == FUSED.read_bytes()


def test_evict_waits_for_a_warm_holding_the_namespace(store: Path) -> None:
    ns = _warmed(store)
    with locks.namespace_lock(ns, "warm"), pytest.raises(FiCacheError, match="warm by pid"):
        apply([ns], Selector(op="gemm2", tactic=104), store, timeout=0.3)
    assert (ns / REL).read_bytes() == FUSED.read_bytes()
    assert manifests.load(ns).evictions == ()  # type: ignore[union-attr]
