"""push/pull between a store namespace and the tier (fi_cache/tier/publish.py): verified tables
only, never over another table unless --replace, never adopted across environments."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Tier

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import Namespace
from fi_cache.tier.keys import rank_key
from fi_cache.tier.mooncake import TierClient
from tests.conftest import GEMM_618, Result

Run = Callable[..., Result]
H200 = Fingerprint.from_metadata(json.loads(GEMM_618.read_text())["_metadata"], "90a")


@pytest.fixture
def client(tier: Tier, monkeypatch: pytest.MonkeyPatch) -> Iterator[TierClient]:
    for name in ("MOONCAKE_CONFIG_PATH", "MC_TCP_BIND_ADDRESS", "FI_CACHE_TIER_TIMEOUT_S"):
        monkeypatch.setenv(name, tier.env[name])
    env = Environment(H200, (), VllmInfo("0.34.0", None, None), "2.8.0")
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    with TierClient.connect(tier.env, 1 << 20) as c:
        yield c


def _namespace(store: Path, config_hash: str, table: bytes, fp: Fingerprint = H200) -> Path:
    ns = Namespace(fp, "fused")
    d = ns.path(store)
    f = d / "vllm" / config_hash / "autotune_configs_dp0_rank0.json"
    f.parent.mkdir(parents=True)
    f.write_bytes(table)
    manifests.save(d, manifests.Manifest.new(ns))
    return f


def _with(gpu: str | None = None, **meta: str) -> bytes:
    doc = json.loads(GEMM_618.read_text())
    doc["_metadata"].update(meta, **({"gpu": gpu} if gpu else {}))
    doc.pop("_generation", None)  # a hash of the content: stale once edited
    return json.dumps(doc).encode()


def test_push_refuses_a_key_holding_another_table_unless_replace(
    run: Run, store: Path, client: TierClient
) -> None:
    h = "7" * 64
    key = rank_key(h, 0, 0)
    client.remove(key)
    client.publish(key, _with("NVIDIA H100 80GB HBM3"))
    _namespace(store, h, GEMM_618.read_bytes())
    url = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/"
    refused = run("push", url, "--namespace", "fused")
    assert refused.code == 2 and "already holds another table" in refused.err
    assert json.loads(client.get(key))["_metadata"]["gpu"] == "NVIDIA H100 80GB HBM3"
    replaced = run("push", url, "--namespace", "fused", "--replace")
    assert replaced.code == 0 and f"replaced mooncake://{key}" in replaced.out
    assert client.get(key) == GEMM_618.read_bytes()
    client.remove(key)


def test_push_refuses_an_indeterminate_table_and_writes_nothing(
    run: Run, store: Path, client: TierClient
) -> None:
    h = "8" * 64
    _namespace(store, h, _with(cudnn_frontend_version="unknown"))
    r = run(
        "push", f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/", "--namespace", "fused"
    )
    assert r.code == 2 and "indeterminate (cudnn_frontend_version)" in r.err
    assert client.exists([rank_key(h, 0, 0)]) == [False]


def test_pull_adopts_a_fitting_table_and_refuses_a_foreign_one(
    run: Run, store: Path, client: TierClient
) -> None:
    h, g = "9" * 64, "0" * 64
    for x in (h, g):
        client.remove(rank_key(x, 0, 0))
    client.publish(rank_key(h, 0, 0), GEMM_618.read_bytes())
    client.publish(rank_key(g, 0, 0), _with("NVIDIA H100 80GB HBM3"))
    ok = run("pull", f"mooncake://{rank_key(h, 0, 0)}")
    assert ok.code == 0, ok.err
    dest = Namespace(H200, "fused").path(store) / "vllm" / h / "autotune_configs_dp0_rank0.json"
    assert dest.read_bytes() == GEMM_618.read_bytes()
    assert run("--format", "json", "ls", str(dest)).json()["caches"][0]["namespace"]
    foreign = run("pull", f"mooncake://vllm-warmup-cache/flashinfer_autotune/{g}/")
    assert foreign.code == 2 and "not pulled: written in another environment" in foreign.err
    assert not (dest.parent.parent / g).exists()
    for x in (h, g):
        client.remove(rank_key(x, 0, 0))


def test_pull_refuses_a_fused_0617_table_for_the_unfused_namespace(
    run: Run, store: Path, client: TierClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import MOE_617_FUSED

    fp = Fingerprint.from_metadata(json.loads(MOE_617_FUSED.read_text())["_metadata"], "90a")
    # a vLLM that reads VLLM_FLASHINFER_MOE_FUSED_FINALIZE: unfused really runs unfused
    env = Environment(fp, (), VllmInfo("0.34.0", "/site/vllm/envs.py", True), "2.8.0")
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    h = "b2" * 32
    client.remove(rank_key(h, 0, 0))
    client.publish(rank_key(h, 0, 0), MOE_617_FUSED.read_bytes())
    url = f"mooncake://{rank_key(h, 0, 0)}"
    r = run("pull", url, "--finalize", "unfused")
    assert r.code == 2 and "not pulled: MoE GEMM2 entries here were tuned fused" in r.err, r.err
    assert not Namespace(fp, "unfused").path(store).exists()
    assert run("pull", url).code == 0  # the fused namespace: its own mode
    client.remove(rank_key(h, 0, 0))


def test_push_of_a_mode_blind_moe_table_says_which_mode_adopters_must_run(
    run: Run, store: Path, client: TierClient
) -> None:
    from tests.conftest import MOE_617_FUSED

    h = "c3" * 32
    client.remove(rank_key(h, 0, 0))
    url = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/"
    stray = _namespace(store, h, MOE_617_FUSED.read_bytes())  # a 0.6.17 file in H200's 0.6.18 ns
    r = run("push", url, "--namespace", "fused")
    assert (
        r.code == 2 and "its flashinfer_version '0.6.17' is not its namespace's (0.6.18)" in r.err
    )
    assert client.exists([rank_key(h, 0, 0)]) == [False]
    stray.unlink()
    fp = Fingerprint.from_metadata(json.loads(MOE_617_FUSED.read_text())["_metadata"], "90a")
    ns_dir = _namespace(store, h, MOE_617_FUSED.read_bytes(), fp).parents[2]
    r = run("push", url, "--namespace", str(ns_dir))
    assert r.code == 0, r.err
    assert "record no finalize mode, nor does the tier's key" in r.err
    assert client.exists([rank_key(h, 0, 0)]) == [True]
    client.remove(rank_key(h, 0, 0))
