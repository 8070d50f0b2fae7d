"""Seeding reads and writes only inside the namespace (lifecycle/seeding.py, maintenance/seed.py,
engines/vllm/predict.py), whatever the store's state says: a manifest naming an outside file or a
path through a symlink is never a seed source, and a planted answer to "which file will the
engine read" (vLLM's is saved in the store's state dir) is one note, never a write outside.
The engine is tests/third_engine.py's STAND-IN (tests/fake_vllm.py, not vLLM).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from threading import Event

import pytest

from fi_cache.engines.api import Run
from fi_cache.engines.vllm.predict import cache_key, cached
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.warm import WarmOptions, warm
from fi_cache.maintenance.seed import sources_for
from fi_cache.store import manifest as manifests
from fi_cache.store.manifest import CacheFileRecord, WarmRecord
from tests.third_engine import Heard, Third, request


@pytest.fixture
def store(tmp_path: Path) -> Path:
    warm(Third(), request("m"), WarmOptions(timeout=60), store := tmp_path / "store", Report())
    return store  # the namespace's first warm of model m: the seed source


class Planted(Third):
    """Third whose answer names files outside the namespace, as a prediction planted in the
    store's state dir does; `known`: answered at once (before the start), else while it runs."""

    def __init__(self, outside: Path, known: bool) -> None:
        self.outside, self.known = outside, known

    def seed_targets_known(
        self, run: Run, ns_dir: Path, store: Path
    ) -> tuple[list[Path], str | None] | None:
        return self.seed_targets(run, ns_dir, store) if self.known else None

    def seed_targets(
        self, run: Run, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        escape = ns_dir / "third" / ".." / ".." / "up" / "autotune_configs.json"
        return [self.outside / "autotune_configs.json", escape], None


@pytest.mark.parametrize("known", [True, False], ids=["before-start", "while-starting"])
def test_a_planted_answer_outside_the_namespace_is_one_note_and_no_write(
    store: Path, tmp_path: Path, known: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside-seed"
    heard = Heard()
    _, result = warm(
        Planted(outside, known),
        request("m", "--max-num-seqs", "8"),
        WarmOptions(timeout=60),
        store,
        heard.report(),
    )
    assert not outside.exists() and not (result.namespace_dir.parent / "up").exists()
    assert [f.seeded for f in result.files] == [0]  # the engine tuned as it would have
    [said] = [n for n in heard.noted if "not inside the namespace" in n]
    assert said.startswith(f"not seeding {outside / 'autotune_configs.json'}: ")
    assert "Traceback" not in capsys.readouterr().err


def _manifest_naming(ns_dir: Path, paths: list[str]) -> manifests.Manifest:
    m = manifests.load(ns_dir)
    assert m is not None
    files = [CacheFileRecord(p, 1, 1) for p in paths]
    return m.with_warm(WarmRecord(9e9, 1.0, None, ["m"], "m", files, None, engine="third"))


def test_seed_sources_never_lie_outside_the_namespace(store: Path, tmp_path: Path) -> None:
    [ns_dir] = [p.parent for p in store.glob("namespaces/*/*/*/*/manifest.json")]
    victim = tmp_path / "victim" / "x"
    victim.mkdir(parents=True)
    (victim / "autotune_configs.json").write_text("{}")  # 0600 elsewhere: must stay there
    (ns_dir / "third" / "link").symlink_to(victim)
    escape = os.path.relpath(victim / "autotune_configs.json", ns_dir)
    bad = [str(victim / "autotune_configs.json"), escape, "third/link/autotune_configs.json"]
    m = _manifest_naming(ns_dir, bad)  # in memory: load refuses such a manifest outright
    found = sources_for(ns_dir, m, lambda w: True, "autotune_configs.json", engine="third")
    assert found and all(p.resolve().is_relative_to(ns_dir) for p in found)
    assert not any(p.resolve() == victim / "autotune_configs.json" for p in found)


def test_a_planted_vllm_answer_outside_its_cache_dir_is_not_used(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cache_dir = tmp_path / "ns" / "vllm"
    env = {**os.environ, "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(cache_dir)}
    asked = ("/usr/bin/python3", "0.32.0", ["m"], env)
    kept = state / f"vllm-cache-{cache_key(*asked)}.json"

    def plant(directory: str, files: list[str]) -> None:
        answer = {
            "vllm_version": "0.32.0",
            "hash": "x",
            "dir": directory,
            "files": files,
            "root_from": "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        }
        kept.write_text(json.dumps(answer))

    plant(str(cache_dir / "abc"), ["autotune_configs.json"])
    assert cached(*asked, state) is not None  # an answer fi-cache saved: used
    for directory, files in [
        (str(tmp_path / "outside-seed"), ["autotune_configs.json"]),
        (str(cache_dir / ".." / ".." / "outside"), ["autotune_configs.json"]),
        (str(cache_dir / "abc"), ["../../../x.json"]),
    ]:
        plant(directory, files)
        assert cached(*asked, state) is None  # asked again: vLLM's fresh answer replaces it
