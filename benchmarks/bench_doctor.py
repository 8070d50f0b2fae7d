"""`fi-cache doctor` on a store of 400 caches plus a 50 MB log (goal: under 2 s).

The 400 caches (300 entries each, a third MoE keys, FlashInfer's real format) go into this
machine's own fused namespace of a temporary store, so every check looks at them; the log is
50 MB of vLLM-like noise with real FlashInfer lines and a gemm2 crash mixed in. Timed as a
subprocess (interpreter start-up included). Run: .venv/bin/python benchmarks/bench_doctor.py
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_inventory import EntryFactory

ROOT = Path(__file__).resolve().parent.parent
LOG_FIXTURE = ROOT / "tests" / "fixtures" / "h200" / "flashinfer-0.6.18-tune.log"
NOISE = [
    "INFO 11-30 02:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 1024.3 tokens/s, "
    "Avg generation throughput: 311.7 tokens/s, Running: 12 reqs, Waiting: 0 reqs\n",
    'INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
    "(EngineCore_DP0 pid=4242) DEBUG 11-30 02:00:{s:02d} [core.py:812] step {n} took 0.031 s\n",
]


def build(tmp: Path, caches: int, log_mb: int) -> tuple[list[str], Path]:
    fi = [sys.executable, "-m", "fi_cache", "--store", str(tmp / "store")]
    env = json.loads(
        subprocess.run(
            [*fi, "--format", "json", "env", "--no-exact"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    ns = Path(env["namespaces"]["fused"]) / "vllm"
    factory = EntryFactory()
    rng = random.Random(7)
    for i in range(caches):
        path = ns / f"{rng.getrandbits(256):064x}" / "autotune_configs.json"
        path.parent.mkdir(parents=True)
        path.write_text(factory.file_text(300, seed=i))
    real = LOG_FIXTURE.read_text().splitlines(keepends=True)
    log = tmp / "vllm.log"
    with open(log, "w") as f:
        n = 0
        while f.tell() < log_mb * 1024 * 1024:
            n += 1
            f.write(NOISE[n % 3].format(s=n % 60, p=30000 + n % 999, n=n))
            if n % 50000 == 0:
                f.writelines(real[:20])
        f.write(
            "(EngineCore_DP0 pid=4242) RuntimeError: Check failed: (id2 >= mGemm1TacticCount "
            "&& id2 < mGemm1TacticCount + mGemm2TacticCount) is false: Invalid gemm2 profile "
            "id: 50\n"
        )
    return [*fi, "--format", "json", "doctor", "--log", str(log)], log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="fi-cache-bench-doctor-") as tmp:
        cmd, log = build(Path(tmp), 400, 50)
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)
        checks = sorted({f["check"] for f in out["findings"]})
        print(
            f"store: 400 caches x 300 entries; log {log.stat().st_size / 2**20:.1f} MB; "
            f"findings: {len(out['findings'])} ({', '.join(checks)})"
        )
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=False)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(
        f"doctor: median {med:.3f} s  (min {min(times):.3f}, max {max(times):.3f}, n={runs})  "
        f"goal < 2 s: {'met' if med < 2 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
