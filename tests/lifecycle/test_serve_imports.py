"""What a serve loads before it hands over: only what its start needs. The warm, the engine's
server and the tier's reader (a serve asks the tier only where a daemon on the namespace uses
one) stay unloaded, as every serve pays for each module it imports (issue 43)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, write_script

FAKE = ROOT / "tests" / "fake_vllm.py"
FIXTURE = ROOT / "tests" / "fixtures" / "flashinfer" / "fi-0.6.18-moe-fused.json"

# Runs `fi-cache serve`, printing the modules loaded where it would hand over.
_DRIVER = """
import sys
import fi_cache.lifecycle.serve as serve

def caught(handover):
    print(" ".join(sorted(sys.modules)))
    raise SystemExit(0)

serve.hand_over = caught
from fi_cache.cli import main
sys.argv = ["fi-cache", *sys.argv[1:]]
main()
"""

NOT_LOADED = (
    "fi_cache.lifecycle.warm",  # warm only
    "fi_cache.engines.server",  # warm only
    "fi_cache.tier.judge",  # the tier's reader: only where a daemon uses a tier
    "fi_cache.tier.read",
    "fi_cache.tier.mooncake",
    "fi_cache.doctor.fix",  # fix texts: only where a finding needs one
    "fi_cache.store.pin",  # only for a pinned namespace
    "socket",  # the lock holder's host is uname's nodename
    "secrets",  # a lock file's temp name takes os.urandom's bytes
)


def test_a_serve_of_a_warm_namespace_loads_no_warm_no_tier_reader_and_no_fix(
    tmp_path: Path,
) -> None:
    """The namespace warmed first by the stand-in vLLM: serve's pre-flight checks its cache."""
    vllm = write_script(tmp_path / "vllm", f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    env = {
        **os.environ,
        "FI_CACHE_VLLM": str(vllm),
        "FAKE_VLLM_CACHE_SOURCE": str(FIXTURE),
        "PYTHONPATH": str(ROOT),
    }
    store = tmp_path / "store"
    warm = [sys.executable, "-m", "fi_cache", "--store", str(store), "warm", "--", "M"]
    subprocess.run(warm, env=env, capture_output=True, check=True, cwd=tmp_path)
    argv = ["--store", str(store), "serve", "--", "M"]
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, *argv], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "fi_cache.doctor.cache_checks" in loaded  # it served, checking the namespace's cache
    assert sorted(loaded.intersection(NOT_LOADED)) == []
