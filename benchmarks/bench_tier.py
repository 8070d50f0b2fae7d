#!/usr/bin/env python3
"""`fi-cache ls` and `doctor` over a Mooncake tier of 1,024 keys (vLLM 0.34's preload tier).

    .venv/bin/python benchmarks/bench_tier.py              # 2 hash dirs x 512 rank keys, 3 runs
    .venv/bin/python benchmarks/bench_tier.py --runs 1     # a smoke test

Starts a real `mooncake_master` and a segment holder on 127.0.0.1 (tests/tier/mooncake_rig.py;
nothing else is contacted), publishes the real H200 table (tests/fixtures/h200, 8 kB) under every
rank key dp0..dp7 x rank0..rank63 of two config hashes, then times the CLI as a user runs it, in a
subprocess (interpreter start-up, the Mooncake worker's start and connection, the probe of every
rank name, the reads and the decoding included): `ls` of both hash dirs, and `doctor` of both
against an H200 target (and `ls` of one key: the fixed cost). Prints median / min / max of --runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "tier"))

from mooncake_rig import running  # noqa: E402

from fi_cache.tier.keys import rank_key  # noqa: E402
from fi_cache.tier.mooncake import TierClient  # noqa: E402

TABLE = REPO / "tests" / "fixtures" / "h200" / "flashinfer-0.6.18-gemm.json"
HASHES = ("1" * 64, "2" * 64)


def _time(argv: list[str], env: dict[str, str], runs: int, want: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(argv, env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - t)
        if r.returncode != want:
            sys.exit(f"{' '.join(argv[3:5])} exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    data = TABLE.read_bytes()
    keys = [rank_key(h, d, r) for h in HASHES for d in range(8) for r in range(64)]
    with tempfile.TemporaryDirectory() as tmp, running(Path(tmp), 64 << 20) as rig:
        t = time.perf_counter()
        with TierClient.connect(rig.env, 1 << 20) as client:
            for key in keys:
                client.publish(key, data)
        print(f"published {len(keys)} keys of {len(data)} bytes in {time.perf_counter() - t:.2f} s")
        urls = [f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/" for h in HASHES]
        cli = [sys.executable, "-m", "fi_cache", "--store", str(Path(tmp) / "store")]
        target = ["--gpu", "NVIDIA H200", "--flashinfer-version", "0.6.18"]
        for name, argv in (
            ("ls of 1 key", [*cli, "ls", f"mooncake://{keys[0]}"]),
            ("ls over 1024 keys", [*cli, "ls", *urls]),
            ("doctor over 1024 keys", [*cli, "doctor", *urls, *target]),
        ):
            times = _time(argv, rig.env, args.runs, 0)
            print(
                f"{name}: median {statistics.median(times):.2f} s "
                f"(min {min(times):.2f}, max {max(times):.2f}, {args.runs} runs)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
