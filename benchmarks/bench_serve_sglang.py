"""How much `fi-cache serve --engine sglang` adds before SGLang starts, on a warm namespace
(the vLLM goal, < 0.3 s, applies).

SGLang has no CPU build, so "SGLang" is the STAND-IN server of the tests
(tests/engines/sglang/standin_sglang.py, in a venv of its own whose sglang dist says 0.5.23;
FI_CACHE_STANDIN_EXIT=1: it reads its arguments and SGLang's own environ.py from the wheel, then
exits). It is timed run directly and through `fi-cache serve --engine sglang --sglang ITS_SCRIPT`
on a namespace warmed first; the difference is fi-cache's side: interpreter start-up, imports,
reading SGLang's packages in a child of its Python, manifest and pre-flight, the /proc scan for
servers sharing the cache dir, exec.

Run: .venv/bin/python benchmarks/bench_serve_sglang.py [--runs N] (needs .cache/flashinfer-0.6.18
and .cache/sglang-wheels, which scripts/test.sh sets up).
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
sys.path.insert(0, str(ROOT))

from tests.sglang_rig import sglang_venv  # noqa: E402

MODEL = ["--model-path", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sglang = sglang_venv(Path(tmp, "venv"), "0.5.23", ROOT / ".cache" / "flashinfer-0.6.18")
        bin_dir = Path(tmp, "bin")
        bin_dir.mkdir()
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho '0, GPU-1234, NVIDIA H200, 9.0'\n")
        smi.chmod(0o755)
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "FI_CACHE_"))}
        env = {
            **keep,
            "HOME": tmp,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "FI_CACHE_STOP_GRACE": "2",
        }
        fi_cache = [sys.executable, "-m", "fi_cache", "--store", str(Path(tmp, "store"))]
        subprocess.run(
            [*fi_cache, "warm", "--engine", "sglang", "--sglang", str(sglang), *MODEL],
            env=env,
            check=True,
            capture_output=True,
        )
        quick = {**env, "FI_CACHE_STANDIN_EXIT": "1"}
        direct = [str(sglang), "serve", *MODEL]
        served = [*fi_cache, "serve", "--engine", "sglang", "--sglang", str(sglang), *MODEL]
        timed(direct, quick), timed(served, quick)  # page cache and the env probe's cache
        plain, wrapped = [], []
        for _ in range(args.runs):
            plain.append(timed(direct, quick))
            wrapped.append(timed(served, quick))
    a, b = statistics.median(plain), statistics.median(wrapped)
    print(f"runs: {args.runs}")
    print(f"stand-in SGLang alone:          median {a * 1000:.0f} ms")
    print(f"through fi-cache serve:         median {b * 1000:.0f} ms")
    print(f"fi-cache serve --engine sglang: {max(0.0, b - a) * 1000:.0f} ms (goal < 300 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
