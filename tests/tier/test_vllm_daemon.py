"""vLLM 0.34's own tier code (the wheel's artifact_store / warmup_cache, tests/tier/vllm_daemon.py)
and fi-cache on one real Mooncake master: the daemon publishes and fi-cache judges; fi-cache
publishes and the daemon adopts; a foreign first writer blocks the daemon until fi-cache removes
it, and then the daemon's publish lands."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Tier
from vllm_daemon import Daemon

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.namespace import Namespace
from fi_cache.tier.keys import rank_key
from fi_cache.tier.mooncake import TierClient
from tests.conftest import GEMM_618, Result
from tests.vllm_wheels import need

Run = Callable[..., Result]
H200_META = json.loads(GEMM_618.read_text())["_metadata"]
H200 = Fingerprint.from_metadata(H200_META, "90a")
TARGET = ["--gpu", "NVIDIA H200", "--flashinfer-version", H200_META["flashinfer_version"]]


@pytest.fixture
def daemon(tier: Tier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    need("0.34.0")
    for name in ("MOONCAKE_CONFIG_PATH", "MC_TCP_BIND_ADDRESS", "FI_CACHE_TIER_TIMEOUT_S"):
        monkeypatch.setenv(name, tier.env[name])
    env = Environment(H200, (), VllmInfo("0.34.0", None, None), "2.8.0")
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    d = Daemon(tmp_path / "daemon-cache")
    yield d
    d.close()


@pytest.fixture
def client(tier: Tier) -> Iterator[TierClient]:
    with TierClient.connect(tier.env, 1 << 20) as c:
        yield c


def _h100_table() -> bytes:
    doc = json.loads(GEMM_618.read_text())
    doc["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    return json.dumps(doc).encode()


def test_the_daemons_key_is_fi_caches_key(daemon: Daemon) -> None:
    h = "c" * 64
    runner = daemon.runner(h, dp=1, rank=3)
    assert daemon.cache._runner_key(runner)[0] == rank_key(h, 1, 3)


def test_the_daemon_publishes_and_fi_cache_judges(daemon: Daemon, run: Run) -> None:
    h = "d" * 64
    tuned = daemon.rank_file(h)
    tuned.parent.mkdir(parents=True)
    tuned.write_bytes(GEMM_618.read_bytes())  # what flashinfer_autotune left on disk
    daemon.cache._publish_autotune_table(daemon.runner(h))
    url = f"mooncake://{rank_key(h, 0, 0)}"
    shown = run("--format", "json", "show", url).json()
    assert shown["metadata"] == H200_META
    r = run("doctor", url, *TARGET)
    assert r.code == 0 and "0 error(s), 0 warning(s)" in r.out, r.out + r.err
    h100 = run("doctor", url, "--gpu", "NVIDIA H100 80GB HBM3")
    assert h100.code == 1 and "every H100 80GB HBM3 daemon on a fresh node rejects it" in h100.out


def test_fi_cache_publishes_and_the_daemon_adopts(daemon: Daemon, run: Run, store: Path) -> None:
    h = "e" * 64
    ns = Namespace(H200, "fused").path(store)
    ours = ns / "vllm" / h / "autotune_configs_dp0_rank1.json"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(GEMM_618.read_bytes())
    (ns / "manifest.json").write_text("")  # replaced below by a real one
    from fi_cache.store import manifest as manifests

    manifests.save(ns, manifests.Manifest.new(Namespace(H200, "fused")))
    hash_dir = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/"
    pushed = run("push", hash_dir, "--namespace", "fused")
    assert pushed.code == 0 and f"published mooncake://{rank_key(h, 0, 1)}" in pushed.out, (
        pushed.out + pushed.err
    )
    assert run("push", hash_dir, "--namespace", "fused").out.startswith("already there")
    runner = daemon.runner(h, rank=1)
    assert daemon.cache._adopt_from_stores(runner)  # vLLM's own adopt took fi-cache's table
    installed = json.loads(daemon.rank_file(h, rank=1).read_bytes())
    assert installed == json.loads(GEMM_618.read_bytes())


def test_a_foreign_first_writer_is_found_removed_and_the_next_publish_lands(
    daemon: Daemon, run: Run, client: TierClient
) -> None:
    h = "f" * 64
    key = rank_key(h, 0, 0)
    h100 = daemon.artifact_store.MooncakeArtifactStore()  # an H100's daemon, alive: its
    h100.put(key, _h100_table())  # segment holds what it put, and it was first
    try:
        tuned = daemon.rank_file(h)
        tuned.parent.mkdir(parents=True)
        tuned.write_bytes(GEMM_618.read_bytes())
        daemon.cache._publish_autotune_table(daemon.runner(h))  # the H200's publish: a no-op
        assert json.loads(client.get(key))["_metadata"]["gpu"] == "NVIDIA H100 80GB HBM3"
        url = f"mooncake://{key}"
        found = run("doctor", f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/", *TARGET)
        assert found.code == 1 and f"error   foreign-environment  {url}:" in found.out
        assert "vLLM never replaces it: first writer wins" in found.out
        assert run("evict", url).code == 0
        daemon.cache._publish_autotune_table(daemon.runner(h))
        assert json.loads(client.get(key))["_metadata"]["gpu"] == "NVIDIA H200"
        assert run("doctor", url, *TARGET).code == 0
    finally:
        h100._store.close()
