#!/usr/bin/env python3
"""Every reading command on one big cache, against `verify` of the same file (issue 42).

    nice .venv/bin/python benchmarks/bench_big.py [--sizes 1000,10000,50000,200000] [--runs 3]
        [--only "diff,diff (json),merge"] [--tree OTHER_CHECKOUT --tree .]

--only: these commands and verify. --tree (repeatable): time each command in each of these
checkouts (its fi_cache, its cwd), side by side in one run: rows `diff @NAME`, NAME the tree's
directory name; default: this checkout alone.

Goal: each command on a 200,000-entry cache within 4x of `verify` of that file, and linear:
its growth exponent (the log-log slope of its time from the smallest size to the largest)
about 1.

Per size N: a synthetic v1 cache of N `bf16_gemm` entries (the key pattern of FlashInfer
0.6.18's real files, token dim M = 1..N, 7 N-widths; `_generation` as FlashInfer computes it,
text from `fi_cache.model.v1.dumps`), a second one with half of it shifted and every 10th
tactic changed (for diff and merge), a vLLM 0.32+ hash dir of 8 rank files of N/8 entries
each, overlapping by half (align, doctor), a plan of 24 `mm_bf16` ops whose shapes the cache
holds (coverage --plan), and a FlashInfer 0.6.18 log of N/20 "No tuned config covers" lines
plus N/20 "Invalid gemm2 profile id" lines of distinct pids (coverage --log, doctor --log).
Each command is a fresh `python -m fi_cache` process, writes go to a scratch copy; the
medians of --runs runs are reported, in seconds, every command of a size run side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fi_cache.model import v1  # noqa: E402

META = {
    "flashinfer_version": "0.6.18",
    "cuda_version": "13.0",
    "cublas_version": "13.1.0",
    "cudnn_version": "91900",
    "cudnn_frontend_version": "1.32.0",
    "gpu": "NVIDIA H200",
}
RANKS = 8
PLAN_OPS = 24
GOAL_RATIO = 4.0


def key(i: int) -> str:
    """The i-th bf16_gemm key, as FlashInfer 0.6.18 writes one (M = i + 1, 7 widths N)."""
    m, n = 1 + i, 2048 + (i % 7) * 128
    return (
        f"('bf16_gemm', 'CublasltBf16GemmRunner', (({m}, 4096), (4096, {n}), (0,), (0,), "
        f"(-1, {n}), (33554432,)), ({m}, {n}, 4096, torch.bfloat16))"
    )


def cache_text(n: int, start: int = 0, seed: int = 0, changed_every: int = 0) -> str:
    rnd = random.Random(seed)
    entries = {}
    for i in range(start, start + n):
        tactic = rnd.randrange(0, 8)
        if changed_every and i % changed_every == 0:
            tactic += 8
        entries[key(i)] = ["CublasltBf16GemmRunner", tactic]
    cf = v1.CacheFile(dict(META), entries, generation="")
    return v1.dumps(cf, with_generation=True)


def plan_text() -> str:
    """24 mm_bf16 ops (k 4096, the cache's 7 widths n) over 8 token counts each."""
    ops = []
    for i in range(PLAN_OPS):
        n = 2048 + (i % 7) * 128
        ops.append(f'[[ops]]\nop = "mm_bf16"\nk = 4096\nn = {n}\ntokens = [{8 << (i % 8)}]\n')
    return "\n".join(ops)


def log_text(lines: int) -> str:
    out = []
    for i in range(lines):
        m, n = i + 300001, 2048 + (i % 7) * 128
        out.append(
            f"2026-12-01 20:55:27,309 - WARNING - autotuner.py:1688 - flashinfer.jit: "
            f"[AutoTuner]: No tuned config covers bf16_gemm input_shapes=(({m}, 4096), "
            f"(4096, {n}), (0,), (0,), (-1, {n}), (33554432,)); falling back to "
            f"runner=CublasltBf16GemmRunner tactic=-1.\n"
        )
        out.append(
            f"(EngineCore_DP0 pid={i}) ERROR 12-01 20:55:27 [core.py:1] RuntimeError: "
            f"Invalid gemm2 profile id: {i}\n"
        )
    return "".join(out)


def build(root: Path, n: int) -> dict[str, Path]:
    root.mkdir(parents=True)
    paths = {
        "a": root / "a.json",
        "b": root / "b.json",
        "plan": root / "plan.toml",
        "log": root / "start.log",
    }
    paths["a"].write_text(cache_text(n))
    paths["b"].write_text(cache_text(n, start=n // 2, seed=1, changed_every=10))
    paths["plan"].write_text(plan_text())
    paths["log"].write_text(log_text(max(n // 20, 1)))
    deploy = root / "deploy" / hashlib.sha256(str(n).encode()).hexdigest()
    deploy.mkdir(parents=True)
    per = max(n // RANKS, 1)
    for r in range(RANKS):
        text = cache_text(per, start=r * per // 2, seed=r)
        (deploy / f"autotune_configs_dp0_rank{r}.json").write_text(text)
    paths["deploy"] = deploy
    return paths


def commands(p: dict[str, Path], scratch: Path) -> dict[str, list[str]]:
    a, b = str(p["a"]), str(p["b"])
    return {
        "verify": ["verify", a],
        "ls": ["ls", a],
        "show": ["show", a],
        "diff": ["diff", a, b],
        "diff (json)": ["--format", "json", "diff", a, b],
        "evict --dry-run": ["evict", a, "--bucket", "5", "--dry-run"],
        "merge": ["merge", a, b, "-o", str(scratch / "merged.json")],
        "coverage --plan": ["coverage", a, "--plan", str(p["plan"])],
        "coverage --log": ["coverage", a, "--log", str(p["log"])],
        "doctor": ["doctor", str(p["deploy"])],
        "doctor --log": ["doctor", "--log", str(p["log"])],
        "align --dry-run": ["align", str(p["deploy"]), "--dry-run"],
    }


def run_once(args: list[str], env: dict[str, str], tree: Path = REPO) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child): on a shared machine the CPU time is the
    steadier of the two."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fi_cache", *args],
        env={**env, "PYTHONPATH": str(tree)},
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"fi-cache {' '.join(args)}: exit {done.returncode}: {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000,200000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated command names (+ verify)")
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to time (repeatable)")
    opts = ap.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    only = None if opts.only is None else {"verify", *opts.only.split(",")}
    trees = [t.resolve() for t in opts.tree] if opts.tree else [REPO]
    work = Path(tempfile.mkdtemp(prefix="fi-cache-bench-big-"))
    env = {**os.environ, "FI_CACHE_DIR": str(work / "store"), "PYTHONPATH": str(REPO)}
    times: dict[int, dict[str, float]] = {}
    cpus: dict[int, dict[str, float]] = {}
    try:
        for n in sizes:
            paths = build(work / str(n), n)
            scratch = work / f"scratch-{n}"
            scratch.mkdir()
            cmds = {}
            for name, args in commands(paths, scratch).items():
                if only is not None and name not in only:
                    continue
                for tree in trees:
                    cmds[name if len(trees) == 1 else f"{name} @{tree.name}"] = (args, tree)
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
            for _ in range(opts.runs):  # round-robin: a busy moment hits every command alike
                for name, (args, tree) in cmds.items():
                    samples[name].append(run_once(args, env, tree))
            times[n] = {name: statistics.median(w for w, _ in s) for name, s in samples.items()}
            cpus[n] = {name: statistics.median(c for _, c in s) for name, s in samples.items()}
            print(f"# {n:,} entries done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(sizes, times, cpus, opts.runs)


def _verify_of(name: str) -> str:
    """The verify row to compare `name` with: the one of the same --tree."""
    return "verify" + (" @" + name.split(" @", 1)[1] if " @" in name else "")


def _slope(t: dict[int, dict[str, float]], name: str, small: int, big: int) -> str:
    return f"{math.log(t[big][name] / t[small][name]) / math.log(big / small):.2f}"


def report(
    sizes: list[int],
    times: dict[int, dict[str, float]],
    cpus: dict[int, dict[str, float]],
    runs: int,
) -> None:
    names = list(times[sizes[0]])
    big, small, mid = sizes[-1], sizes[0], sizes[-2] if len(sizes) > 1 else sizes[0]
    head = [
        "command",
        *(f"{n:,}" for n in sizes),
        f"x verify @{big:,}",
        f"exp. {small:,}-{big:,}",
        f"exp. {mid:,}-{big:,}",
        f"CPU s @{big:,}",
        "CPU x verify",
    ]
    print(
        f"{platform.node()} ({os.cpu_count()} cores), Python {platform.python_version()}, "
        f"median of {runs} runs, wall seconds (a fresh process each)"
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        row = [name, *(f"{times[n][name]:.2f}" for n in sizes)]
        verify = _verify_of(name)  # verify run from the same tree
        row.append(f"{times[big][name] / times[big][verify]:.1f}")
        row += [_slope(times, name, small, big), _slope(times, name, mid, big)]
        row += [f"{cpus[big][name]:.2f}", f"{cpus[big][name] / cpus[big][verify]:.1f}"]
        print("| " + " | ".join(row) + " |")
    print(
        f"goal: every command within {GOAL_RATIO:g}x of verify at {big:,} entries, growth "
        "exponent about 1 (linear; start-up flattens the smallest sizes)"
    )


if __name__ == "__main__":
    main()
