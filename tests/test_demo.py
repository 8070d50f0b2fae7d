"""scripts/demo.sh, the README's first command: it runs, fast, with no GPU, and shows the
FlashInfer <= 0.6.17 collision being prevented on the real H200 files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


def test_the_demo_keeps_0617_fused_and_unfused_apart_and_names_a_copied_file(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FI_CACHE_", "VLLM_"))}
    env.update(
        FI_CACHE_DEMO_PYTHON=sys.executable,
        FI_CACHE_DEMO_WORK=str(tmp_path / "work"),
        PYTHONPATH=str(ROOT),
    )
    start = time.monotonic()
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert time.monotonic() - start < 30
    assert "Traceback" not in out
    nss = tmp_path / "work" / "store" / "namespaces" / "0.6.17" / "90a" / "nvidia-h200"
    fused, unfused = sorted(nss.iterdir())  # one namespace per finalize mode, same fingerprint
    assert fused.name.startswith("fused-") and unfused.name.startswith("unfused-")
    assert f"namespace {fused}\n" in out and f"namespace {unfused}\n" in out
    copied = hashlib.sha256(b"another model").hexdigest()
    doctor = out.split("$ fi-cache doctor --finalize unfused")[1].split("$ fi-cache serve")[0]
    [finding] = [line for line in doctor.splitlines() if line.startswith("error")]
    assert "stale-gemm2-profile" in finding and f"{unfused.name}/vllm/{copied[:8]}" in finding
    assert "ids [99, 100, 102, 104] crash start-up" in finding  # the real H200 tactic ids
    refused = out.split("# refuses before vLLM could die on it")[1]
    assert f"vllm/{copied}/autotune_configs.json" in refused
    assert "(serve refused: exit 1)" in refused
