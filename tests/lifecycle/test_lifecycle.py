"""The lifecycle is the engines' and not vLLM's: a third serving engine, given only its adapter
(engines/api.py's ServerEngine), is warmed, seeded, recorded and served by the same flow
(tests/third_engine.py: a STAND-IN, nothing in fi_cache knows it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from threading import Event

import pytest

from fi_cache.engines.api import Run, WarmFailed
from fi_cache.environment import Environment, Gpu, VllmInfo
from fi_cache.errors import Refused
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.serve import ServeOptions, serve
from fi_cache.lifecycle.warm import WarmOptions, warm
from fi_cache.model import v1
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_618
from tests.third_engine import FAKE, FP, Heard, Third
from tests.third_engine import request as _request


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_a_third_engine_is_warmed_and_recorded_under_its_own_name(store: Path) -> None:
    heard = Heard()
    run, result = warm(Third(), _request("m"), WarmOptions(timeout=60), store, heard.report())
    assert heard.warned == ["third: chose unfused"]  # its finalize rule, said before it starts
    assert run.ns.finalize == "unfused" and not result.reused
    [f] = result.files
    assert f.path.startswith("third/") and f.entries == 1
    assert any(n.startswith("healthy:") for n in heard.noted)
    m = manifests.load(result.namespace_dir)
    assert m is not None
    [w] = m.warms
    assert (w.engine, w.engine_version, w.argv) == ("third", "1.0", ["m"])


def test_a_third_engine_is_seeded_from_its_own_earlier_warm(store: Path) -> None:
    warm(Third(), _request("m"), WarmOptions(timeout=60), store, Report())
    heard = Heard()
    _, second = warm(
        Third(),
        _request("m", "--max-num-seqs", "8"),
        WarmOptions(timeout=60),
        store,
        heard.report(),
    )
    [f] = second.files
    assert f.seeded == 1 and f.entries == 1  # the new config started from the first's entries
    assert any(n.startswith("seeded 1 entries from 1 earlier file(s)") for n in heard.noted)


def test_another_model_is_never_a_seed_source(store: Path) -> None:
    warm(Third(), _request("m"), WarmOptions(timeout=60), store, Report())
    _, other = warm(Third(), _request("n"), WarmOptions(timeout=60), store, Report())
    assert [f.seeded for f in other.files] == [0]


def test_serve_warms_a_cold_namespace_once_then_hands_over(store: Path) -> None:
    options = ServeOptions(timeout=60)
    first = serve(Third(), _request("m", warm=False), options, store, Report())
    assert first.warmed is not None and first.ns_dir is not None
    assert first.command == [sys.executable, str(FAKE), "serve", "m"]
    assert first.environ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == str(first.ns_dir / "third")
    again = serve(Third(), _request("m", warm=False), options, store, Report())
    assert again.warmed is None  # warm already: the engine starts once


def test_an_empty_start_of_an_engine_that_must_tune_is_a_failed_warm(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_NO_CACHE", "1")
    with pytest.raises(WarmFailed, match="Third became healthy and saved nothing") as exc:
        warm(Third(), _request("m"), WarmOptions(timeout=60), store, Report())
    assert exc.value.saved_log is not None and exc.value.saved_log.is_file()
    ns_dir = Namespace(FP, "unfused").path(store)
    assert not (ns_dir / "third").exists()  # a failed first start leaves no empty tree
    assert manifests.load(ns_dir) is None


def test_a_warm_leaves_every_rank_the_same_file(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks that tuned different subsets (vLLM 0.32+ would re-tune both at the next start;
    SGLang 0.5.19+ would delete both): after the warm both hold the union, as recorded."""
    monkeypatch.setenv("FAKE_VLLM_RANKS", "2")
    monkeypatch.setenv("FAKE_VLLM_CACHE_SOURCE", str(GEMM_618))
    heard = Heard()
    _, result = warm(Third(), _request("m"), WarmOptions(timeout=60), store, heard.report())
    whole = len(v1.loads(GEMM_618.read_bytes()).entries)
    assert sorted((Path(f.path).name, f.entries) for f in result.files) == [
        ("autotune_configs_dp0_rank0.json", whole),
        ("autotune_configs_dp0_rank1.json", whole),
    ]
    a, b = (result.namespace_dir / f.path for f in result.files)
    assert a.read_bytes() == b.read_bytes()
    assert any(n.startswith("aligned the rank files of") for n in heard.noted)


class TwoRanks(Third):
    """Third on a node whose own file is rank 1's (another node warmed rank 0's and pushed)."""

    def seed_targets(
        self, run: Run, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        [path], why = super().seed_targets(run, ns_dir, store)
        return [path.with_name("autotune_configs_dp0_rank1.json")], why


def test_serve_fills_this_nodes_missing_rank_file_from_the_other_ranks(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_RANKS", "2")
    monkeypatch.setenv("FAKE_VLLM_CACHE_SOURCE", str(GEMM_618))
    _, result = warm(TwoRanks(), _request("m"), WarmOptions(timeout=60), store, Report())
    rank0, rank1 = sorted(result.namespace_dir / f.path for f in result.files)
    rank1.unlink()  # this node pulled a bundle holding only the other node's rank
    heard = Heard()
    handover = serve(
        TwoRanks(), _request("m", warm=False), ServeOptions(timeout=60), store, heard.report()
    )
    assert handover.warmed is None  # warm already: the engine starts once, and does not re-tune
    assert rank1.read_bytes() == rank0.read_bytes()
    assert any(
        "this node's rank files autotune_configs_dp0_rank1.json were missing" in n
        for n in heard.noted
    )


def test_a_second_warm_of_the_same_arguments_starts_nothing(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(record))
    warm(Third(), _request("m"), WarmOptions(timeout=60), store, Report())
    _, again = warm(Third(), _request("m"), WarmOptions(timeout=60), store, Report())
    assert again.already and again.reused
    assert len((record / "starts.jsonl").read_text().splitlines()) == 1  # one start only
    _, forced = warm(Third(), _request("m"), WarmOptions(timeout=60, again=True), store, Report())
    assert not forced.already
    assert len((record / "starts.jsonl").read_text().splitlines()) == 2


def test_serve_pull_starts_a_node_with_an_empty_store_warm(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A pod whose store is emptied at every boot, on the second node of a deployment: `serve
    --pull URL` imports the tuning node's bundle (rank 0's file only) and fills rank 1's, so
    nothing warms and no rank tunes again."""
    from fi_cache import environment
    from fi_cache.fleet import transfer

    monkeypatch.setenv("FAKE_VLLM_RANKS", "2")
    monkeypatch.setenv("FAKE_VLLM_CACHE_SOURCE", str(GEMM_618))
    env = Environment(FP, (Gpu(0, "NVIDIA H200", "9.0"),), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    head = tmp_path / "head-store"
    _, result = warm(TwoRanks(), _request("m"), WarmOptions(timeout=60), head, Report())
    rank0, rank1 = sorted(result.namespace_dir / f.path for f in result.files)
    rank1.unlink()  # the head node writes only its own rank's file
    url = (tmp_path / "bucket").as_uri()
    transfer.push(head, url, [result.namespace_dir], None, False)
    heard = Heard()
    handover = serve(
        TwoRanks(), _request("m"), ServeOptions(timeout=60, pull=url), store, heard.report()
    )
    assert handover.warmed is None  # warm from the bundle: the engine starts once
    here = store / result.namespace_dir.relative_to(head)
    assert (here / rank1.relative_to(result.namespace_dir)).read_bytes() == rank0.read_bytes()
    assert any(n.startswith("pulled 1 namespace(s)") for n in heard.noted)


def test_a_failed_pull_is_a_warning_and_serve_goes_on(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    heard = Heard()
    url = (tmp_path / "no-such-bucket").as_uri()
    handover = serve(
        Third(), _request("m"), ServeOptions(timeout=60, pull=url), store, heard.report()
    )
    assert handover.warmed is not None  # cold: warmed as without --pull
    assert any(w.startswith(f"pull from {url} failed") for w in heard.warned)


def test_serve_fills_a_rank_file_only_under_the_namespace_lock_and_pin(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pin that lands after serve's own check and before the fill: the fill, under the
    namespace lock as align, sees it and writes nothing (a warning)."""
    from fi_cache.maintenance import align
    from fi_cache.store import pin

    monkeypatch.setenv("FAKE_VLLM_RANKS", "2")
    monkeypatch.setenv("FAKE_VLLM_CACHE_SOURCE", str(GEMM_618))
    _, result = warm(TwoRanks(), _request("m"), WarmOptions(timeout=60), store, Report())
    _rank0, rank1 = sorted(result.namespace_dir / f.path for f in result.files)
    rank1.unlink()
    first_plan = align.plan

    def pinned_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        pin.pin(result.namespace_dir)
        return first_plan(*args, **kwargs)

    monkeypatch.setattr(align, "plan", pinned_meanwhile)
    heard = Heard()
    with pytest.raises(Refused, match="pinned"):  # then the pinned namespace is no warm's either
        serve(
            TwoRanks(), _request("m", warm=False), ServeOptions(timeout=60), store, heard.report()
        )
    assert not rank1.exists()
    assert any(
        "rank files autotune_configs_dp0_rank1.json are missing" in w and "pinned" in w
        for w in heard.warned
    )
