"""doctor names a namespace file replaced after fi-cache's warm (doctor/replaced_checks.py): the
preload daemon's D2D adopt installs a peer's table over the local file (seed.py 0.34:102-130),
written by the 0.34 wheel's own FlashInferWarmupCache.install (tests/tier/vllm_daemon.py runs
it on CPU); and a file another writer replaced with fewer entries than the warm left."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from fi_cache import doctor
from fi_cache.caches.discover import classify_file
from fi_cache.caches.inventory import read
from fi_cache.doctor.inputs import CacheView, Inputs, Target
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.manifest import CacheFileRecord, EvictedFile, EvictRecord, WarmRecord
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_618
from tests.tier.vllm_daemon import Daemon

HASH = "c" * 64
NAME = "autotune_configs_dp0_rank0.json"
REL = f"vllm/{HASH}/{NAME}"
ARGV = ["Qwen/Qwen3-8B", "-tp", "2"]


def _warmed(store: Path) -> tuple[Path, Path, manifests.Manifest]:
    """A namespace whose warm (ended 50 s ago) left the H200's 0.6.18 table in a rank file."""
    meta = json.loads(GEMM_618.read_text())["_metadata"]
    ns = Namespace(Fingerprint.from_metadata(meta, arch="90a"), "fused")
    ns_dir = ns.path(store)
    path = ns_dir / REL
    path.parent.mkdir(parents=True)
    shutil.copy(GEMM_618, path)
    started = time.time() - 60
    os.utime(path, (started + 5, started + 5))
    entries = len(v1.loads(path.read_bytes()).entries)
    rec = CacheFileRecord(REL, entries, path.stat().st_size)
    m = manifests.Manifest.new(ns, now=started).with_warm(
        WarmRecord(started, 10.0, "0.34.0", ARGV, "k", [rec], True)
    )
    manifests.save(ns_dir, m)
    return ns_dir, path, m


def _peer_table() -> bytes:
    """A peer's file of the same environment, as its FlashInfer saved it: half the entries."""
    cf = v1.loads(GEMM_618.read_bytes())
    half = dict(list(cf.entries.items())[::2])
    return v1.dumps(v1.CacheFile(cf.metadata, half, None, cf.generation)).encode()


def test_doctor_names_the_file_the_daemons_d2d_replaced(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    ns_dir, path, _ = _warmed(store)
    daemon = Daemon(ns_dir / "vllm")  # the daemon's root: fi-cache's namespace (fleet.md)
    cache = type(daemon.cache)([])  # the disk store only: no shared tier gave anything
    payload = cache.validate_payload({NAME: json.loads(_peer_table())})  # what D2D fetched
    cache.install(daemon.runner(HASH), payload)  # seed.py 0.34:122, over the local file
    assert b"\n" not in path.read_bytes()
    r = run("--format", "json", "doctor", ns_dir)
    [f] = [f for f in r.json()["findings"] if f["check"] == "replaced-after-warm"]
    assert f["severity"] == "warning" and f["path"] == str(path)
    assert f["message"].startswith(
        "replaced after fi-cache's warm (by the preload daemon's D2D seeding, or another "
        "writer): it is now one line of JSON, as vLLM's preload daemon writes a table it "
        "installs from a peer (D2D)"
    )
    assert "D2D checks its _metadata only" in f["message"]
    assert "fi-cache warm --again -- Qwen/Qwen3-8B -tp 2" in f["fix"]
    assert f["details"]["entries"] < f["details"]["warm_entries"]


def _findings(ns_dir: Path, path: Path, m: manifests.Manifest) -> list[str]:
    cache = read(classify_file(path))
    target = Target(Fingerprint.from_metadata(cache.metadata, "90a"))
    view = CacheView(cache, ns_dir, "fused", m, v1.defects(cache.file))
    return [f.message for f in doctor.run(Inputs(target, (view,)), ["replaced-after-warm"])]


def test_fewer_entries_than_the_warm_left_is_replaced_by_another_writer(tmp_path: Path) -> None:
    ns_dir, path, m = _warmed(tmp_path / "store")
    assert _findings(ns_dir, path, m) == []  # the warm's own file
    path.write_bytes(_peer_table())  # copied in as its FlashInfer wrote it: indented
    [said] = _findings(ns_dir, path, m)
    entries, left = (
        len(v1.loads(path.read_bytes()).entries),
        len(v1.loads(GEMM_618.read_bytes()).entries),
    )
    assert f"it holds {entries} entries where the warm left {left} and no evict took them" in said
    evict = EvictRecord(time.time(), {"op": "x"}, [EvictedFile(REL, [], entries)])
    assert _findings(ns_dir, path, m.with_eviction(evict)) == []  # fi-cache's evict took them


def test_a_file_the_engine_added_to_after_the_warm_is_not_replaced(tmp_path: Path) -> None:
    ns_dir, path, m = _warmed(tmp_path / "store")
    cf = v1.loads(path.read_bytes())
    more = {**cf.entries, "('extra_op', 'Runner', ((1,),), ())": ["Runner", 0]}
    path.write_text(v1.dumps(v1.CacheFile(cf.metadata, more, None, cf.generation)))
    assert _findings(ns_dir, path, m) == []  # FlashInfer's save after a start: indented, more


def test_an_equal_peers_table_installed_over_the_warms_is_not_replaced(tmp_path: Path) -> None:
    """D2D from a peer holding the same table (both nodes fed by fi-cache) rewrites the file on
    one line, and nothing the engine loads changed: not named."""
    ns_dir, path, m = _warmed(tmp_path / "store")
    daemon = Daemon(ns_dir / "vllm")
    cache = type(daemon.cache)([])
    payload = cache.validate_payload({NAME: json.loads(GEMM_618.read_bytes())})
    cache.install(daemon.runner(HASH), payload)
    assert b"\n" not in path.read_bytes()
    assert _findings(ns_dir, path, m) == []
