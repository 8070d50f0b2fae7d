"""How much `fi-cache serve` adds before vLLM starts, on a warm namespace (goal: < 0.3 s).

Measures wall time of the stand-in vLLM (tests/fake_vllm.py, FAKE_VLLM_MODE=exit-now: it records
its start and exits at once) run directly, versus through `fi-cache serve` on a namespace warmed
first. The difference is fi-cache's overhead: interpreter start-up, imports, environment probe,
manifest and pre-flight, exec. Run: .venv/bin/python benchmarks/bench_serve.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_vllm.py"
FIXTURE = ROOT / "tests" / "fixtures" / "flashinfer" / "fi-0.6.18-moe-fused.json"
MODEL = "Qwen/Qwen3-30B-A3B"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="fi-cache-bench-serve-") as tmp:
        wrapper = Path(tmp, "vllm")
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
        wrapper.chmod(0o755)
        env = {
            **os.environ,
            "FI_CACHE_VLLM": str(wrapper),
            "FAKE_VLLM_CACHE_SOURCE": str(FIXTURE),
            "PYTHONPATH": str(ROOT),
        }
        fi = [sys.executable, "-m", "fi_cache", "--store", str(Path(tmp, "store"))]
        subprocess.run([*fi, "warm", "--", MODEL], env=env, check=True, capture_output=True)
        now = {**env, "FAKE_VLLM_MODE": "exit-now"}
        direct_cmd = [str(wrapper), "serve", MODEL]
        serve_cmd = [*fi, "serve", "--", MODEL]
        timed(direct_cmd, now), timed(serve_cmd, now)  # warm-up
        direct, served = [], []
        for _ in range(runs):  # interleaved, so machine noise hits both alike
            direct.append(timed(direct_cmd, now))
            served.append(timed(serve_cmd, now))
    d, s = statistics.median(direct), statistics.median(served)
    print(
        f"stand-in vLLM directly     median {d * 1000:7.1f} ms  (min {min(direct) * 1000:.1f}, "
        f"max {max(direct) * 1000:.1f}, n={runs})"
    )
    print(
        f"through fi-cache serve     median {s * 1000:7.1f} ms  (min {min(served) * 1000:.1f}, "
        f"max {max(served) * 1000:.1f}, n={runs})"
    )
    verdict = "met" if s - d < 0.3 else "MISSED"
    print(f"overhead (median - median) {(s - d) * 1000:7.1f} ms  goal < 300 ms: {verdict}")


if __name__ == "__main__":
    main()
