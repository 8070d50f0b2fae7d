"""serve's pre-flight over the tier (fi_cache/tier/preflight.py, lifecycle/serve.py): when this
node's `vllm preload` daemon writes the namespace's dir with `--warmup-cache-stores mooncake`,
the tables under the config hash fi-cache knows the start uses are judged on a real Mooncake
master, as `doctor mooncake://` judges them: a crash (the other finalize mode's FlashInfer
<= 0.6.17 table) is an error, the rest warnings. The daemon is a process /proc shows as
`vllm preload` (standin_daemon.py); vLLM itself never reads the tier (only the daemon adopts)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Tier

from fi_cache.doctor.inputs import Target
from fi_cache.errors import FiCacheError
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.serve import ServeOptions, serve
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.namespace import Namespace
from fi_cache.tier import preflight
from fi_cache.tier.keys import rank_key
from fi_cache.tier.mooncake import TierClient
from tests.conftest import GEMM_618, MOE_617_FUSED
from tests.third_engine import Heard, Third, request
from tests.tier.standin_daemon import preload_daemon

STORES = ("--warmup-cache-stores", "mooncake")
H200_618 = Fingerprint.from_metadata(json.loads(GEMM_618.read_text())["_metadata"], "90a")
H200_617 = Fingerprint.from_metadata(json.loads(MOE_617_FUSED.read_text())["_metadata"], "90a")


def _without_config(tier: Tier) -> dict[str, str]:
    """serve's own environment: the tier's config is only in the daemon's (fleet.md's recipe)."""
    return {k: v for k, v in tier.env.items() if k != "MOONCAKE_CONFIG_PATH"}


def _publish(tier: Tier, config_hash: str, table: bytes) -> None:
    with TierClient.connect(tier.env, 1 << 20) as client:
        assert client.publish(rank_key(config_hash, 0, 0), table).written


def test_a_foreign_table_under_the_deployments_key_is_a_warning(tier: Tier, tmp_path: Path) -> None:
    h = "a1" * 32
    doc = json.loads(GEMM_618.read_text())
    doc["_metadata"]["gpu"] = "NVIDIA H100 80GB HBM3"
    _publish(tier, h, json.dumps(doc).encode())
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path), **tier.env}
    target = Target(H200_618, "0.34.0", True, "fused")
    with preload_daemon(tmp_path, env, options=STORES):
        findings, note = preflight.check(lambda: h, tmp_path / "ns", target, _without_config(tier))
    assert note is None
    assert {f.severity for f in findings} == {"warning"}  # in the tier: errors (judge.py)
    [f] = [f for f in findings if f.check == "foreign-environment"]
    assert f.path == f"mooncake://{rank_key(h, 0, 0)}"
    assert "every H200 daemon on a fresh node rejects it" in f.message
    assert f.fix.startswith(f"fi-cache evict mooncake://{rank_key(h, 0, 0)} --dry-run")


def test_the_other_finalize_modes_gemm2_table_is_an_error(tier: Tier, tmp_path: Path) -> None:
    h = "a2" * 32
    _publish(tier, h, MOE_617_FUSED.read_bytes())
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path), **tier.env}
    target = Target(H200_617, "0.34.0", True, "unfused")
    with preload_daemon(tmp_path, env, options=STORES):
        findings, _ = preflight.check(lambda: h, tmp_path, target, _without_config(tier))
    errors = [f for f in findings if f.severity == "error"]
    assert [f.check for f in errors] == ["stale-gemm2-profile"]
    assert "`Invalid gemm2 profile id` crashes start-up" in errors[0].message


def test_no_tier_is_asked_without_a_daemon_sharing_through_mooncake(tmp_path: Path) -> None:
    target = Target(H200_618, "0.34.0", True, "fused")
    broken = {"MOONCAKE_CONFIG_PATH": str(tmp_path / "missing.json")}  # read: a note
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path), **broken}
    asked: list[str] = []

    def config_hash() -> str:  # the prediction's lookup: only when a daemon uses a tier
        asked.append("a3" * 32)
        return asked[-1]

    assert preflight.check(config_hash, tmp_path, target, broken) == ([], None)  # no daemon
    with preload_daemon(tmp_path, env):  # a daemon with its disk store only
        assert preflight.check(config_hash, tmp_path, target, broken) == ([], None)
    assert asked == []
    with preload_daemon(tmp_path, env, options=STORES):  # the tier is used: it is asked
        findings, note = preflight.check(config_hash, tmp_path, target, broken)
    assert findings == [] and note is not None and len(asked) == 1
    hash_dir = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{'a3' * 32}/"
    assert note.startswith(f"tier not checked ({hash_dir}): ")
    assert note.endswith(
        "missing.json: cannot read MOONCAKE_CONFIG_PATH: No such file or directory"
    )


class TierNode(Third):
    """Third on a FlashInfer 0.6.17 H200 namespace, whose saved prediction names one rank file
    of hash `H4` (what fi-cache knows of a vLLM start once it has asked vLLM)."""

    def resolve(self, *args: Any, **kwargs: Any) -> Any:
        target = super().resolve(*args, **kwargs)
        return replace(target, ns=Namespace(H200_617, target.ns.finalize))

    def seed_targets_known(
        self, run: Any, ns_dir: Path, store: Path
    ) -> tuple[list[Path], str | None] | None:
        return [self.cache_dir(ns_dir) / H4 / "autotune_configs_dp0_rank0.json"], None


H4 = "a4" * 32


def test_serve_stops_before_a_start_the_tiers_table_would_crash(
    tier: Tier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _publish(tier, H4, MOE_617_FUSED.read_bytes())  # fused; TierNode serves unfused
    for name, value in _without_config(tier).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    store = tmp_path / "store"
    daemon_env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(store), **tier.env}
    options = ServeOptions(warm=False, tier_check=preflight.check)
    heard = Heard()
    with preload_daemon(tmp_path, daemon_env, options=STORES):
        with pytest.raises(FiCacheError, match="pre-flight found 1 error"):
            serve(TierNode(), request("m", warm=False), options, store, Report())
        forced = replace(request("m", warm=False), force=True)
        handover = serve(TierNode(), forced, options, store, heard.report())
    assert handover.finalize == "unfused"
