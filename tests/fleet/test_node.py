"""An import keeps this node's rank files: a bundle pushed from another node of the deployment
holds that node's ranks only (vLLM 0.32+ MoE `-dp 2` on two nodes: dp0_rank0 there, dp1_rank1
here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.caches.inventory import scan
from fi_cache.environment import Environment, VllmInfo
from fi_cache.fleet import bundle
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.ranks.agreement import vllm_gate
from fi_cache.ranks.deployment import gather
from fi_cache.store import manifest as m
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_618, HASH_A, MOE_618_FUSED

FP = Fingerprint.from_metadata(json.loads(GEMM_618.read_text())["_metadata"], "90a")
HEAD, MINE = "autotune_configs_dp0_rank0.json", "autotune_configs_dp1_rank1.json"


def _namespace(store: Path, ranks: dict[str, bytes]) -> Path:
    ns = Namespace(FP, "fused")
    d = ns.path(store)
    hash_dir = d / "vllm" / HASH_A
    hash_dir.mkdir(parents=True, exist_ok=True)
    for name, data in ranks.items():
        (hash_dir / name).write_bytes(data)
    m.save(d, m.Manifest.new(ns, now=1.0))
    return hash_dir


def _fewer(source: Path, n: int) -> bytes:
    cf = v1.loads(source.read_bytes())
    kept = dict(list(cf.entries.items())[n:])
    return v1.dumps(v1.CacheFile(cf.metadata, kept, None, None)).encode()


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> Fingerprint:
    env = Environment(FP, (), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    return FP


def _head_bundle(tmp_path: Path, source: bytes) -> Path:
    head_store = tmp_path / "head"
    hash_dir = _namespace(head_store, {HEAD: source})
    out = tmp_path / "head.tar.gz"
    bundle.export(head_store, [hash_dir.parent.parent], out)
    return out


def test_import_of_the_head_nodes_bundle_keeps_this_nodes_rank_agreeing(
    run,
    store: Path,
    tmp_path: Path,
    here: Fingerprint,  # type: ignore[no-untyped-def]
) -> None:
    out = _head_bundle(tmp_path, GEMM_618.read_bytes())
    mine = _namespace(store, {MINE: _fewer(GEMM_618, 3)})  # this node's own, an older tune
    r = run("import", out)
    assert r.code == 0, r.err
    assert "kept this node's rank files the bundle lacks: 1 written" in r.out
    assert (mine / MINE).read_bytes() == (mine / HEAD).read_bytes()
    [dep] = gather(scan([mine]).caches)
    assert vllm_gate(dep.rank_files()).loads  # vLLM loads it on every rank: nobody re-tunes


def test_without_the_fill_the_import_would_leave_this_node_cold(
    store: Path, tmp_path: Path, here: Fingerprint
) -> None:
    out = _head_bundle(tmp_path, GEMM_618.read_bytes())
    _namespace(store, {})  # nothing of this node's: nothing to keep
    installed = bundle.import_bundle(store, out, FP, force=False)
    assert installed.node.filled == () and installed.node.refused == ()


def test_rank_keyed_moe_entries_are_not_faked_for_this_node(
    run,
    store: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """FlashInfer 0.6.18 keys CUTLASS MoE entries by tp_rank: rank 0's cannot stand in for
    rank 1's; the import says so and writes nothing for this node."""
    moe = v1.loads(MOE_618_FUSED.read_bytes())
    keyed = {
        k.replace(", 8, 1, 0, 1, 0, 1, 0,", ", 8, 2, 0, 1, 0, 1, 0,"): v
        for k, v in moe.entries.items()
    }
    head = v1.dumps(v1.CacheFile(moe.metadata, keyed, None, None)).encode()
    fp = Fingerprint.from_metadata(moe.metadata, "90a")
    env = Environment(fp, (), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    head_store = tmp_path / "head"
    ns = Namespace(fp, "fused")
    hd = ns.path(head_store) / "vllm" / HASH_A
    hd.mkdir(parents=True)
    (hd / "autotune_configs_dp0_rank0.json").write_bytes(head)
    m.save(ns.path(head_store), m.Manifest.new(ns, now=1.0))
    out = tmp_path / "moe.tar.gz"
    bundle.export(head_store, [ns.path(head_store)], out)
    mine = ns.path(store) / "vllm" / HASH_A
    mine.mkdir(parents=True)
    shutil.copy(MOE_618_FUSED, mine / "autotune_configs_dp0_rank1.json")
    m.save(ns.path(store), m.Manifest.new(ns, now=1.0))
    r = run("import", out)
    assert r.code == 0, r.err
    assert "this node's rank files were not kept (autotune_configs_dp0_rank1.json" in r.err
    assert not (mine / "autotune_configs_dp0_rank1.json").exists()
