#!/usr/bin/env python3
"""Benchmark `fi-cache prune --dry-run` over a store of 1,000 namespaces (goal: under 1 s).

    .venv/bin/python benchmarks/bench_prune.py            # 7 runs after one warm-up
    .venv/bin/python benchmarks/bench_prune.py --runs 3   # quicker
    .venv/bin/python benchmarks/bench_prune.py --profile  # also cProfile the in-process plan

The store is built under a tempfile.TemporaryDirectory (removed afterwards) the way warm leaves
it: `namespaces/<fi>/<arch>/<gpu>/<finalize>-<hash>/` with `manifest.json` (last use spread over
120 days, written by `fi_cache.store.manifest.save`) and one small cache file, a real FlashInfer
file from tests/fixtures/, under `vllm/<64-hex>/`; a fifth of the namespaces hold a released lock.
Measured: `fi-cache prune --dry-run --older-than 30d --max-size 1GB` as a subprocess (wall time,
interpreter start-up included; median/min/max), then the in-process scan and plan for reference,
and once, for information, the in-process apply of that plan.
The prune command is registered the way fi_cache/cli/__init__.py will (until it is there, a
one-line wrapper registers fi_cache.cli.prune.COMMANDS).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "flashinfer" / "fi-0.6.18-moe-fused.json"
NAMESPACES = 1000
GOAL_S = 1.0
ARGS = ["prune", "--dry-run", "--older-than", "30d", "--max-size", "1GB"]
_WRAPPER = (
    "from fi_cache.cli import cli, main; from fi_cache.cli.prune import COMMANDS; "
    "[cli.add_command(c) for c in COMMANDS if c.name not in cli.commands]; main()"
)


def build_store(store: Path, n: int) -> None:
    from fi_cache.model.fingerprint import Fingerprint
    from fi_cache.store import locks, manifest
    from fi_cache.store.namespace import Namespace

    rng = random.Random(1000)
    now = time.time()
    versions = ["0.6.16", "0.6.17", "0.6.18", "0.7.0"]
    gpus = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA B200"]
    data = FIXTURE.read_bytes()
    for i in range(n):
        fp = Fingerprint(
            flashinfer_version=versions[i % len(versions)],
            gpu=gpus[i % len(gpus)],
            arch="90a",
            cuda_version=f"12.{i % 10}",
            cublas_version=str(i),  # a distinct namespace each
        )
        ns = Namespace(fp, "fused" if i % 2 else "unfused")
        d = ns.path(store)
        cache = d / "vllm" / f"{rng.getrandbits(256):064x}" / "autotune_configs.json"
        cache.parent.mkdir(parents=True)
        cache.write_bytes(data)
        used = now - rng.uniform(0, 120) * 86400
        manifest.save(d, manifest.Manifest.new(ns, now=used))
        if i % 5 == 0:
            with locks.namespace_lock(d, "warm", strategy="flock"):
                pass  # leaves the lock file, as every warmed namespace has


class Stats:
    def __init__(self, times: list[float]) -> None:
        self.times = times
        self.median = statistics.median(times)
        self.min = min(times)
        self.max = max(times)

    def line(self, name: str) -> str:
        return (
            f"  {name:<46} median {self.median * 1000:7.0f} ms   "
            f"min {self.min * 1000:7.0f} ms   max {self.max * 1000:7.0f} ms   "
            f"(n={len(self.times)})"
        )


def measure(fn: Callable[[], Any], runs: int) -> Stats:
    fn()  # warm-up (page cache, .pyc)
    times = []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return Stats(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs per measurement (after a warm-up)")
    ap.add_argument("--namespaces", type=int, default=NAMESPACES)
    ap.add_argument("--profile", action="store_true", help="cProfile the in-process plan")
    args = ap.parse_args()
    runs = args.runs

    import fi_cache
    from fi_cache.maintenance import prune

    print(f"fi-cache {fi_cache.__version__}, python {sys.version.split()[0]}, {args.runs} runs")
    with tempfile.TemporaryDirectory(prefix="fi-cache-bench-prune-") as tmp:
        store = Path(tmp) / "store"
        t0 = time.perf_counter()
        build_store(store, args.namespaces)
        size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
        print(
            f"  built {args.namespaces} namespaces ({size / 1e6:.1f} MB) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        cmd = [sys.executable, "-c", _WRAPPER, "--store", str(store), "--format", "json", *ARGS]

        def subprocess_run() -> str:
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"bench: prune exited {out.returncode}: {out.stderr}")
            return out.stdout

        doc = json.loads(subprocess_run())
        planned, locked = len(doc["plan"]), len(doc["skipped_locked"])
        if not planned or doc["applied"]:
            raise SystemExit(f"bench: unexpected plan: {planned} planned, applied {doc['applied']}")
        print(
            f"  plan: {planned} namespaces, {doc['bytes'] / 1e6:.1f} MB to free, "
            f"{locked} skipped as locked"
        )
        sub = measure(subprocess_run, runs)
        print(sub.line("prune --dry-run, subprocess (wall)"))
        help_cmd = [sys.executable, "-c", _WRAPPER, "--help"]
        start = measure(lambda: subprocess.run(help_cmd, capture_output=True, check=True), runs)
        print(start.line("(reference) same interpreter, --help"))
        criteria = prune.Selection(older_than=30 * 86400, max_size=10**9)
        scan = measure(lambda: prune.scan_store(store), runs)
        print(scan.line("in-process scan_store"))
        whole = measure(lambda: prune.plan_store(store, criteria), runs)
        print(whole.line("in-process plan_store (scan + leftovers + plan)"))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            prune.plan_store(store, criteria)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative").print_stats(15)
            print(buf.getvalue())
        the_plan = prune.plan_store(store, criteria)
        t0 = time.perf_counter()
        outcome = prune.apply(the_plan, store)
        applied = time.perf_counter() - t0
        if len(outcome.removed) != planned or outcome.failed:
            raise SystemExit(f"bench: apply removed {len(outcome.removed)} of {planned}")
        per = applied / planned * 1000
        print(
            f"  (info) in-process apply of that plan, one run: {applied * 1000:.0f} ms "
            f"({per:.1f} ms per namespace: lock, rename, fsync, rmtree)"
        )
        shutil.rmtree(store)
    verdict = "met" if sub.median < GOAL_S else "**missed**"
    print(
        f"\n| benchmark | runs | median | min | max | goal | result |\n"
        f"| --- | ---: | ---: | ---: | ---: | --- | --- |\n"
        f"| prune --dry-run, {args.namespaces} namespaces, subprocess | {len(sub.times)} | "
        f"{sub.median * 1000:.0f} ms | {sub.min * 1000:.0f} ms | {sub.max * 1000:.0f} ms | "
        f"< {GOAL_S:.0f} s | {verdict} |"
    )
    return 0 if sub.median < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
