"""prune's library: parsing the selectors, the plan (pure), reading the store, applying it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fi_cache.errors import FiCacheError, Refused
from fi_cache.maintenance import prune
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import in_use, locks, trash
from fi_cache.store import manifest as manifests
from fi_cache.store.locks import flock as flock_mod
from fi_cache.store.locks import lockfile as lockfile_mod
from fi_cache.store.namespace import NAMESPACES_DIR, Namespace
from tests.conftest import HASH_A, MOE_617_FUSED, MOE_618_FUSED, MOE_618_UNFUSED

NOW = 1_750_000_000.0
DAY = 86400.0
H200 = "NVIDIA H200"


def make_namespace(
    store: Path,
    *,
    fi: str = "0.6.18",
    gpu: str = H200,
    cuda: str = "12.8",
    finalize: str = "fused",
    last_used: float | None = NOW,
    fixture: Path = MOE_618_FUSED,
    manifest: bool = True,
    mtime: float | None = None,
) -> Path:
    """A store namespace as warm leaves it: manifest.json and vllm/<hash>/autotune_configs.json."""
    ns = Namespace(
        Fingerprint(flashinfer_version=fi, gpu=gpu, arch="90a", cuda_version=cuda),
        "fused" if finalize == "fused" else "unfused",
    )
    directory = ns.path(store)
    cache = directory / "vllm" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    shutil.copy(fixture, cache)
    if manifest:
        used = NOW if last_used is None else last_used
        manifests.save(directory, manifests.Manifest.new(ns, now=used))
    if mtime is not None:
        for p in [directory, *directory.rglob("*")]:
            os.utime(p, (mtime, mtime))
    return directory


def killed_import(store: Path, age: float, cache: bytes = b'{"_metadata": {}, "(trunc') -> Path:
    """What an import SIGKILLed while unpacking leaves: `<store>/.import-*` holding part of a
    namespace (a cache cut short), last written `age` seconds ago."""
    from fi_cache.store import install

    staging = install.make_staging_dir(store)
    ns = staging / NAMESPACES_DIR / "0.6.18" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    member = ns / "vllm" / HASH_A / "autotune_configs.json"
    member.parent.mkdir(parents=True)
    member.write_bytes(cache)
    then = time.time() - age
    for path in [staging, *staging.rglob("*")]:
        os.utime(path, (then, then))
    return staging


def info(
    name: str,
    size: int = 100,
    last_used: float = NOW,
    *,
    fi: str = "0.6.18",
    gpu: str = "nvidia-h200",
    locked: bool = False,
) -> prune.NamespaceInfo:
    return prune.NamespaceInfo(
        dir=Path("/store/namespaces", fi, "90a", gpu, f"fused-{name}"),
        flashinfer_version=fi,
        arch="90a",
        gpu=gpu,
        finalize="fused",
        size=size,
        last_used=last_used,
        last_used_from="manifest",
        locked=locked,
    )


def names(p: prune.Plan) -> list[str]:
    return [ns.dir.name.removeprefix("fused-") for ns, _ in p.namespaces]


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 43200),
        ("90m", 5400),
        ("3600s", 3600),
        ("2w", 14 * DAY),
        ("0", 0),
        ("0s", 0),
        ("1.5D", 1.5 * DAY),
        (" 7d ", 7 * DAY),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert prune.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "", "d", "-1d", "3 days", "1y", "1e3s", "30dd"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(Refused, match="--older-than"):
        prune.parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20GB", 20 * 10**9),
        ("500MB", 500 * 10**6),
        ("1.5GiB", 1536 * 2**20),
        ("0", 0),
        ("20gb", 20 * 10**9),
        ("2 TiB", 2 * 2**40),
        ("10k", 10_000),
        ("4KiB", 4096),
        ("123", 123),
        ("1g", 10**9),
        ("7B", 7),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert prune.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "20 gigabytes", "1.2.3GB", "20XB", "1e9"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(Refused, match="--max-size"):
        prune.parse_size(text)


# --- the plan -------------------------------------------------------------------------------------


def test_older_than_selects_by_last_use_least_recent_first() -> None:
    spaces = [
        info("new", last_used=NOW - DAY),
        info("old", last_used=NOW - 40 * DAY),
        info("older", last_used=NOW - 90 * DAY),
    ]
    p = prune.plan(spaces, prune.Selection(older_than=30 * DAY), NOW)
    assert names(p) == ["older", "old"]
    assert p.namespaces[0][1] == ["unused for 90d"]
    assert p.bytes == 200 and p.kept_bytes == 100


def test_max_size_evicts_least_recently_used_until_the_rest_fits() -> None:
    spaces = [info(f"n{i}", size=100, last_used=NOW - i * DAY) for i in range(5)]
    p = prune.plan(spaces, prune.Selection(max_size=250), NOW)
    assert names(p) == ["n4", "n3", "n2"]  # n0 and n1 (the most recent, 200 B) fit in 250 B
    assert all(r == ["over --max-size (least recently used)"] for _, r in p.namespaces)
    assert p.kept_bytes == 200
    assert names(prune.plan(spaces, prune.Selection(max_size=0), NOW)) == [
        "n4",
        "n3",
        "n2",
        "n1",
        "n0",
    ]
    assert prune.plan(spaces, prune.Selection(max_size=500), NOW).empty


def test_max_size_keeps_a_prefix_of_the_most_recent() -> None:
    # A small old namespace that would fit is still evicted: eviction follows last use only.
    spaces = [info("big", 300, NOW), info("mid", 300, NOW - DAY), info("tiny", 1, NOW - 2 * DAY)]
    assert names(prune.plan(spaces, prune.Selection(max_size=400), NOW)) == ["tiny", "mid"]


def test_max_size_counts_what_other_selectors_free() -> None:
    spaces = [info("a", 100, NOW), info("b", 100, NOW - DAY), info("stale", 100, NOW - 60 * DAY)]
    p = prune.plan(spaces, prune.Selection(older_than=30 * DAY, max_size=200), NOW)
    assert names(p) == ["stale"]  # a and b fit once stale is gone
    assert p.namespaces[0][1] == ["unused for 60d"]


def test_locked_namespaces_are_never_planned_and_count_against_the_budget() -> None:
    spaces = [
        info("busy", 200, NOW - 50 * DAY, locked=True),
        info("a", 100, NOW),
        info("b", 100, NOW - DAY),
    ]
    p = prune.plan(spaces, prune.Selection(max_size=300), NOW)
    assert names(p) == ["b"]  # busy (200) stays whatever happens; a fits next to it
    assert [ns.dir.name for ns, _ in p.skipped_locked] == ["fused-busy"]
    p = prune.plan(spaces, prune.Selection(older_than=30 * DAY), NOW)
    assert p.empty and [r for _, r in p.skipped_locked] == [["unused for 50d"]]


def test_foreign_by_flashinfer_version_or_gpu() -> None:
    spaces = [
        info("same"),
        info("oldfi", fi="0.6.17"),
        info("a100", gpu="nvidia-a100-sxm4-80gb"),
        info("nofi", fi="unknown"),
        info("nogpu", gpu="unknown"),
    ]
    here = prune.Here("0.6.18", ("NVIDIA H200", "NVIDIA H200"))
    p = prune.plan(spaces, prune.Selection(foreign=True), NOW, here)
    assert sorted(names(p)) == ["a100", "oldfi"]
    reasons = dict((ns.dir.name, r) for ns, r in p.namespaces)
    assert reasons["fused-oldfi"] == ["foreign: FlashInfer 0.6.17 (here: 0.6.18)"]
    assert reasons["fused-a100"] == ["foreign: no nvidia-a100-sxm4-80gb here"]
    # What this machine does not know is not compared.
    no_gpu = prune.plan(spaces, prune.Selection(foreign=True), NOW, prune.Here("0.6.18", ()))
    assert names(no_gpu) == ["oldfi"]
    a100 = prune.Here(None, ("NVIDIA A100-SXM4-80GB",))  # compared as the path's slug
    assert sorted(names(prune.plan(spaces, prune.Selection(foreign=True), NOW, a100))) == [
        "nofi",
        "oldfi",
        "same",
    ]


def test_foreign_needs_flashinfer_or_a_gpu() -> None:
    with pytest.raises(Refused, match="without FlashInfer or a GPU"):
        prune.plan([info("a")], prune.Selection(foreign=True), NOW, prune.Here(None, ()))


def test_no_selector_plans_old_temp_files_only() -> None:
    spaces = [info("a", last_used=0.0), info("busy", locked=True), info("gone", last_used=0.0)]
    ns_dir = spaces[0].dir
    tmp = [
        prune.Leftover(Path("/store/.fi-cache-x.tmp"), 5, NOW - 3600),  # old: goes
        prune.Leftover(Path("/store/.fi-cache-y.tmp"), 5, NOW - 60),  # a writer may be running
        prune.Leftover(spaces[1].dir / ".autotuner_z.tmp", 5, NOW - 3600),  # locked namespace
        prune.Leftover(ns_dir / "vllm" / ".autotune_configs.json.tmp", 5, NOW - 3600),
    ]
    p = prune.plan(spaces, prune.Selection(), NOW, tmp=tmp)
    assert p.namespaces == [] and [t.path.name for t in p.tmp] == [
        ".fi-cache-x.tmp",
        ".autotune_configs.json.tmp",
    ]
    # With its namespace planned, a temp file goes with it (counted once).
    p = prune.plan(spaces, prune.Selection(older_than=DAY), NOW, tmp=tmp)
    assert [t.path.name for t in p.tmp] == [".fi-cache-x.tmp"]
    assert p.bytes == 200 + 5


# --- reading the store ----------------------------------------------------------------------------


def test_scan_reads_size_last_use_and_falls_back_to_file_times(store: Path) -> None:
    a = make_namespace(store, last_used=NOW - 5 * DAY)
    b = make_namespace(store, cuda="13.0", manifest=False, mtime=NOW - 9 * DAY)
    c = make_namespace(store, cuda="12.9", fixture=MOE_618_UNFUSED, finalize="unfused")
    (c / "manifest.json").write_text("{")  # corrupt: still a namespace, by file times
    found = {ns.dir: ns for ns in prune.scan_store(store)}
    assert set(found) == {a, b, c}
    fa, fb, fc = found[a], found[b], found[c]
    assert fa.last_used == NOW - 5 * DAY and fa.last_used_from == "manifest"
    assert fa.fingerprint is not None and fa.fingerprint.gpu == H200
    assert (fa.flashinfer_version, fa.arch, fa.gpu, fa.finalize) == (
        "0.6.18",
        "90a",
        "nvidia-h200",
        "fused",
    )
    files = [p for p in a.rglob("*") if p.is_file()]
    assert fa.size == sum(p.stat().st_size for p in files)
    assert fb.last_used == NOW - 9 * DAY and fb.last_used_from == "mtime"
    assert fb.size == MOE_618_FUSED.stat().st_size
    assert fc.problem and fc.last_used_from == "mtime" and fc.finalize == "unfused"
    assert not any(ns.locked for ns in found.values())


def test_scan_skips_what_is_not_a_namespace(store: Path) -> None:
    make_namespace(store)
    root = store / NAMESPACES_DIR
    (root / "0.6.18" / "90a" / "nvidia-h200" / "nodash").mkdir()
    (root / "0.6.18" / "90a" / "nvidia-h200" / ".hidden-x").mkdir()
    (root / "0.6.18" / "90a" / "nvidia-h200" / "fused-file").write_text("")
    (root / "0.6.18" / "90a" / "nvidia-h200" / "fused-link").symlink_to(store)
    assert len(prune.scan_store(store)) == 1
    assert prune.scan_store(store / "missing") == []


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_a_held_lock_is_seen_and_the_probe_changes_nothing(store: Path, strategy: str) -> None:
    busy = make_namespace(store)
    free = make_namespace(store, cuda="13.0")
    with locks.namespace_lock(free, "warm", strategy=strategy):
        pass  # leaves a released lock (a lock file on disk for flock)
    before = sorted(os.listdir(busy)), sorted(os.listdir(free))
    with locks.namespace_lock(busy, "warm", strategy=strategy) as me:
        before = sorted(os.listdir(busy)), sorted(os.listdir(free))
        found = {ns.dir: ns for ns in prune.scan_store(store, strategy)}
        assert (sorted(os.listdir(busy)), sorted(os.listdir(free))) == before
    assert found[busy].locked and found[busy].holder is not None
    assert found[busy].holder.pid == me.pid and found[busy].holder.purpose == "warm"
    assert not found[free].locked
    assert not any(ns.locked for ns in prune.scan_store(store, strategy))


def test_a_dead_holders_lock_file_is_not_held(store: Path) -> None:
    ns = make_namespace(store)
    holder = {"pid": 2**22 + 12345, "host": socket.gethostname(), "since": 0.0, "purpose": "warm"}
    (ns / locks.LOCK_NAME).write_text(json.dumps(holder))
    assert not prune.scan_store(store, "lockfile")[0].locked
    holder["host"] = "elsewhere"
    (ns / locks.LOCK_NAME).write_text(json.dumps(holder))
    assert prune.scan_store(store, "lockfile")[0].locked


# --- applying -------------------------------------------------------------------------------------


def test_apply_removes_the_plan_and_nothing_else(store: Path) -> None:
    old = make_namespace(store, fi="0.6.17", fixture=MOE_617_FUSED, last_used=NOW - 60 * DAY)
    kept = make_namespace(store, last_used=time.time())
    tmp = store / NAMESPACES_DIR / ".fi-cache-dead.tmp"
    tmp.write_text("x")
    os.utime(tmp, (NOW, NOW))
    p = prune.plan_store(store, prune.Selection(older_than=30 * DAY))
    assert [ns.dir for ns, _ in p.namespaces] == [old] and [t.path for t in p.tmp] == [tmp]
    out = prune.apply(p, store)
    assert [ns.dir for ns in out.removed] == [old] and not out.failed and not out.skipped
    assert not old.exists() and not tmp.exists() and kept.is_dir()
    assert not (store / NAMESPACES_DIR / "0.6.17").exists()  # empty parents go too
    assert list((store / trash.TRASH_DIR).iterdir()) == []
    assert out.freed == p.bytes
    again = prune.plan_store(store, prune.Selection(older_than=30 * DAY))
    assert again.empty


def test_apply_skips_a_namespace_locked_or_used_after_the_plan(store: Path) -> None:
    locked = make_namespace(store, last_used=NOW - 60 * DAY)
    used = make_namespace(store, cuda="13.0", last_used=NOW - 60 * DAY)
    gone = make_namespace(store, cuda="12.9", last_used=NOW - 60 * DAY)
    p = prune.plan_store(store, prune.Selection(older_than=30 * DAY))
    assert len(p.namespaces) == 3
    m = manifests.load(used)
    assert m is not None
    manifests.save(used, m.used(time.time()))
    shutil.rmtree(gone)
    with locks.namespace_lock(locked, "warm"):
        out = prune.apply(p, store)
    assert out.removed == [] and not out.failed
    why = {s.ns.dir: s for s in out.skipped}
    assert why[locked].locked and why[locked].holder and why[locked].holder.purpose == "warm"
    assert why[used].why == "used since the plan was made" and why[gone].why == "gone already"
    assert locked.is_dir() and used.is_dir()


def test_a_serve_since_the_last_warm_counts_as_use(store: Path) -> None:
    """serve notes its use on the in-use file (no manifest rewrite: lifecycle/serve_memo.py),
    and prune reads it there: a namespace served yesterday but warmed 60 days ago stays, and one
    served after the plan was made is skipped."""
    served = make_namespace(store, last_used=NOW - 60 * DAY)
    later = make_namespace(store, cuda="13.0", last_used=NOW - 60 * DAY)
    yesterday = time.time() - DAY
    in_use.note_served(served)
    os.utime(served / in_use.IN_USE_NAME, (yesterday, yesterday))
    p = prune.plan_store(store, prune.Selection(older_than=30 * DAY))
    assert [ns.dir for ns, _ in p.namespaces] == [later]
    in_use.note_served(later)
    out = prune.apply(p, store)
    assert out.removed == [] and out.skipped[0].why == "used since the plan was made"


def test_apply_empties_the_trash_of_an_interrupted_prune(store: Path) -> None:
    make_namespace(store)
    half = store / trash.TRASH_DIR / "123-45-fused-abc"
    (half / "vllm").mkdir(parents=True)
    (half / "vllm" / "x.json").write_text("{}")
    p = prune.plan_store(store, prune.Selection())
    assert [t.path for t in p.trash] == [half] and p.bytes == 2 and p.namespaces == []
    out = prune.apply(p, store)
    assert out.emptied_trash and not half.exists() and len(prune.scan_store(store)) == 1


def test_old_staging_dirs_of_killed_imports_are_removed_live_ones_kept(store: Path) -> None:
    """A killed import's `.import-*` is a temp leftover (same 10-minute rule); an import still
    unpacking or waiting for a namespace lock keeps its own fresh."""
    from fi_cache.store import install

    make_namespace(store)
    dead = killed_import(store, age=3600)
    alive = killed_import(store, age=3600)
    new = next((alive / NAMESPACES_DIR).glob("*/*/*/*"))
    target = store / new.relative_to(alive)
    waiting = threading.Thread(target=lambda: _install_quietly(install, new, target, store))
    with locks.namespace_lock(target, "warm"):
        waiting.start()  # blocked on our lock, like an import behind a long warm
        time.sleep(0.3)
        p = prune.plan_store(store, prune.Selection())
        assert [t.path for t in p.tmp] == [dead] and p.tmp[0].what.startswith("staging dir")
        assert p.tmp[0].size == len(b'{"_metadata": {}, "(trunc')
        out = prune.apply(p, store)
        assert out.removed_tmp == p.tmp and not out.failed
        assert not dead.exists() and alive.is_dir()
    waiting.join(10)
    assert (target / "vllm" / HASH_A / "autotune_configs.json").is_file()  # and it went on


def _install_quietly(install: Any, new: Path, target: Path, store: Path) -> None:
    with contextlib.suppress(FiCacheError):
        install.install_dir(new, target, store, timeout=2)


def test_an_installs_young_trash_entry_is_left_alone(store: Path) -> None:
    """An import moves the old namespace into the trash and puts it back if it fails: a prune
    meanwhile must not empty it. After an hour it is a leftover like any other."""
    now = time.time()
    trash_dir = store / trash.TRASH_DIR
    young = trash_dir / f"{trash.INSTALLING_PREFIX}{int((now - 60) * 1e9)}-42-fused-abc"
    old = trash_dir / f"{trash.INSTALLING_PREFIX}{int((now - 7200) * 1e9)}-42-fused-def"
    for d in (young, old):
        d.mkdir(parents=True)
    p = prune.plan(
        prune.scan_store(store), prune.Selection(), now, trash=prune.scan_leftovers(store)[1]
    )
    assert [t.path for t in p.trash] == [old]


def test_a_namespace_replaced_after_the_plan_is_not_removed(store: Path) -> None:
    """An import swapped a new dir in after the plan judged the old one: its lock is free at
    once, but it is not the namespace the plan chose."""
    ns = make_namespace(store)
    p = prune.plan_store(store, prune.Selection(older_than=0))
    assert [n.dir for n, _ in p.namespaces] == [ns]
    staged = store / "staged"
    shutil.copytree(ns, staged)
    shutil.rmtree(ns)
    staged.rename(ns)  # the same path, another dir
    out = prune.apply(p, store)
    assert out.removed == [] and ns.is_dir()
    assert [s.why for s in out.skipped] == ["replaced since the plan was made (an import)"]


def test_remove_tree_moves_then_deletes(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = make_namespace(store)
    seen: list[Path] = []
    real = trash.delete_tree

    def spy(path: Path) -> None:
        seen.append(path)
        assert not ns.exists() and path.is_dir()  # gone from namespaces/ before any deletion
        real(path)

    monkeypatch.setattr(trash, "delete_tree", spy)
    trash.remove_tree(ns, store)
    assert seen and seen[0].parent == store / trash.TRASH_DIR and not seen[0].exists()


def test_remove_tree_that_cannot_move_removes_nothing(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = make_namespace(store)

    def boom(*a: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(Refused, match="cannot remove"):
        trash.remove_tree(ns, store)
    assert (ns / "manifest.json").is_file()


def test_apply_reports_a_failure_and_goes_on(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = make_namespace(store, last_used=NOW - 60 * DAY)
    b = make_namespace(store, cuda="13.0", last_used=NOW - 50 * DAY)
    p = prune.plan_store(store, prune.Selection(older_than=30 * DAY))
    real = trash.remove_tree

    def flaky(path: Path, where: Path) -> None:
        if path == a:
            raise Refused("cannot remove: Permission denied", path)
        real(path, where)

    monkeypatch.setattr(trash, "remove_tree", flaky)
    out = prune.apply(p, store)
    assert [ns.dir for ns in out.removed] == [b] and [f[0] for f in out.failed] == [a]
    assert a.is_dir()


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_try_lock_does_not_wait_and_names_the_holder(store: Path, strategy: str) -> None:
    ns = make_namespace(store, last_used=NOW - 60 * DAY)
    with locks.namespace_lock(ns, "warm", strategy=strategy), pytest.MonkeyPatch.context() as mp:
        for waits in (flock_mod.time, lockfile_mod.time):  # a try never waits for the holder
            mp.setattr(waits, "sleep", lambda s: pytest.fail(f"try_namespace_lock slept {s} s"))
        with (
            pytest.raises(locks.NamespaceBusy, match="locked for warm by pid"),
            locks.try_namespace_lock(ns, "prune", strategy),
        ):
            pass
    with locks.try_namespace_lock(ns, "prune", strategy) as me:
        assert me.purpose == "prune"
    p = prune.plan_store(store, prune.Selection(older_than=DAY))
    out = prune.apply(p, store, strategy=strategy)
    assert [x.dir for x in out.removed] == [ns] and not ns.exists()


def test_temp_files_age_like_doctor_fix() -> None:
    from fi_cache.doctor.cache_checks import TMP_MAX_AGE_S

    assert prune.TMP_MAX_AGE_S == TMP_MAX_AGE_S
