"""Seeding while the engine starts (lifecycle/seeding.py): when the engine needs seconds to say
which file it will read (vLLM's child imports vLLM), the warm starts it at once and places the
seed meanwhile, only where the engine has written nothing; afterwards it says whether the seed
was read. The engine is tests/third_engine.py's STAND-IN (tests/fake_vllm.py, not vLLM), made
slow to answer; FAKE_VLLM_LOAD_SECONDS plays vLLM's model load before its kernel warm-up.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from threading import Event

import pytest

from fi_cache.engines.api import Run
from fi_cache.errors import FiCacheError
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.warm import WarmOptions, WarmResult, warm
from fi_cache.model import v1
from tests.conftest import GEMM_618
from tests.third_engine import Heard, Third, request


class SlowToAnswer(Third):
    """Third, whose answer to "which file will you read" takes `seconds` (never known at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def seed_targets_known(
        self, run: Run, ns_dir: Path, store: Path
    ) -> tuple[list[Path], str | None] | None:
        return None

    def seed_targets(
        self, run: Run, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        if stop is not None and stop.wait(self.seconds):
            raise FiCacheError("stopped")
        return super().seed_targets(run, ns_dir, store)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    warm(Third(), request("m"), WarmOptions(timeout=60), store := tmp_path / "store", Report())
    return store  # the namespace's first warm of model m: the seed source


def _second(store: Path, seconds: float) -> tuple[WarmResult, list[str], float]:
    heard, started = Heard(), time.monotonic()
    _, result = warm(
        SlowToAnswer(seconds),
        request("m", "--max-num-seqs", "8"),
        WarmOptions(timeout=60),
        store,
        heard.report(),
    )
    return result, heard.noted, time.monotonic() - started


def test_the_seed_lands_while_the_engine_loads_and_is_read(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_LOAD_SECONDS", "3")
    result, noted, _ = _second(store, 0.3)
    [f] = result.files
    assert (f.seeded, f.entries) == (1, 1)
    target = result.namespace_dir / f.path
    [said] = [n for n in noted if n.startswith("seeded 1 entries from 1 earlier file(s)")]
    assert said.startswith(f"seeded 1 entries from 1 earlier file(s): {target} (")
    assert said.endswith("s after Third started)")
    started = next(i for i, n in enumerate(noted) if n.startswith("starting "))
    assert noted.index(said) > started  # placed while the engine ran, not before it


def test_an_engine_that_saved_first_keeps_its_own_file(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_HEALTH_DELAY", "4")  # saved at once, healthy only later
    result, noted, _ = _second(store, 1.5)
    [f] = result.files
    assert f.seeded == 0
    assert any(
        n.startswith(f"not seeding {result.namespace_dir / f.path}: Third wrote it first")
        for n in noted
    )


def test_a_seed_the_engine_did_not_read_is_not_counted(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine looked for its file before the seed landed, tuned, and saved its own over it."""
    monkeypatch.setenv("FAKE_VLLM_TUNE_SECONDS", "3")
    monkeypatch.setenv("FAKE_VLLM_CACHE_SOURCE", str(GEMM_618))  # its tuning: other entries
    result, noted, _ = _second(store, 0.5)
    [f] = result.files
    target = result.namespace_dir / f.path
    assert f.seeded == 0 and f.entries == len(v1.loads(GEMM_618.read_bytes()).entries)
    assert any(n.startswith(f"seeded 1 entries from 1 earlier file(s): {target} (") for n in noted)
    assert f"Third tuned {target} itself: it looked for the file before the seed landed" in (
        " ".join(noted)
    )
    assert json.loads(target.read_bytes()) == json.loads(GEMM_618.read_bytes())  # its own


def test_a_healthy_engine_does_not_wait_for_the_answer(store: Path) -> None:
    result, noted, seconds = _second(store, 60)
    [f] = result.files
    assert f.seeded == 0 and seconds < 30
    assert (
        "not seeding: Third was healthy before fi-cache knew which file it reads (it tuned "
        "without one)"
    ) in noted


class Mispredicts(Third):
    """Third whose answer names another hash dir than the one it then uses (vLLM's GPU worker
    resolving CUDA-graph sizes or an auto-fitted --max-model-len otherwise than predicted)."""

    def seed_targets(
        self, run: Run, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        return [self.cache_dir(ns_dir) / ("f" * 64) / "autotune_configs.json"], None


def test_a_seed_in_a_dir_the_engine_did_not_use_is_removed_and_said(store: Path) -> None:
    heard = Heard()
    _, result = warm(
        Mispredicts(),
        request("m", "--max-num-seqs", "8"),
        WarmOptions(timeout=60),
        store,
        heard.report(),
    )
    [f] = result.files
    assert f.seeded == 0 and "f" * 64 not in f.path  # the file it tuned, not the stray seed
    stray = result.namespace_dir / "third" / ("f" * 64)
    assert not stray.exists()
    [said] = [n for n in heard.noted if "not the seeded" in n]
    assert said.startswith(f"Third used {result.namespace_dir / f.path}, not the seeded {stray}")
    assert said.endswith("the unread seed is removed")


class Breaks(SlowToAnswer):
    def seed_targets(
        self, run: Run, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        raise RuntimeError("boom")


def test_a_seeding_thread_that_breaks_is_one_note_and_no_traceback(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    heard = Heard()
    _, result = warm(
        Breaks(0),
        request("m", "--max-num-seqs", "8"),
        WarmOptions(timeout=60),
        store,
        heard.report(),
    )
    assert [f.seeded for f in result.files] == [0]
    assert "not seeding: RuntimeError: boom" in heard.noted
    assert "Traceback" not in capsys.readouterr().err
