"""What a serve loads before it hands over: only what its start needs. The warm, the engine's
server and the tier's reader (a serve asks the tier only where a daemon on the namespace uses
one) stay unloaded, as every serve pays for each module it imports (issue 43)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, write_script

# Runs `fi-cache serve`, printing the fi_cache modules loaded where it would hand over.
_DRIVER = """
import sys
import fi_cache.lifecycle.serve as serve

def caught(handover):
    print(" ".join(sorted(m for m in sys.modules if m.startswith("fi_cache"))))
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
)


def test_a_serve_loads_no_warm_and_no_tier_reader(tmp_path: Path) -> None:
    vllm = write_script(tmp_path / "vllm", "#!/bin/sh\nexit 0\n")  # found, never run
    env = {**os.environ, "FI_CACHE_VLLM": str(vllm), "PYTHONPATH": str(ROOT)}
    argv = ["--store", str(tmp_path / "store"), "serve", "--no-warm", "--", "M"]
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, *argv], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "fi_cache.lifecycle.prepare" in loaded  # it did serve
    assert sorted(loaded.intersection(NOT_LOADED)) == []
