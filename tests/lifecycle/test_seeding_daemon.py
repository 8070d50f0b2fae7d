"""A warm's seeding leaves a dir a running `vllm preload` daemon writes alone: one note, nothing
seeded (the daemon's own tuning and D2D seeding write those files). The engine is
tests/third_engine.py's stand-in; the daemon a process /proc shows as `vllm preload`."""

from __future__ import annotations

from pathlib import Path

from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.warm import WarmOptions, warm
from tests.third_engine import Heard, Third, request
from tests.tier.standin_daemon import preload_daemon


def test_seeding_skips_a_dir_a_running_daemon_writes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    warm(Third(), request("m"), WarmOptions(timeout=60), store, Report())  # the seed source
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(store)}  # a root holding the namespace
    heard = Heard()
    with preload_daemon(tmp_path, env) as proc:
        _, result = warm(
            Third(),
            request("m", "--max-num-seqs", "8"),
            WarmOptions(timeout=60),
            store,
            heard.report(),
        )
    [f] = result.files
    assert f.seeded == 0
    [said] = [n for n in heard.noted if n.startswith("not seeding: ")]
    assert said == (
        f"not seeding: vLLM's preload daemon (pid {proc.pid}) writes {store.resolve()} "
        "(its tuning and D2D seeding write these files)"
    )
