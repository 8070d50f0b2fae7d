#!/usr/bin/env python3
"""`fi-cache diff` and `fi-cache coverage` on a 64-rank deployment, 5,000 entries per rank file.

    .venv/bin/python benchmarks/bench_diff_coverage.py [--runs 3]

Two copies A and B of one vLLM 0.32+ hash dir of 64 rank files (MoE with -dp 8 -tp 8:
`autotune_configs_dp{d}_rank{8d+r}.json`), 5,000 entries each, generated as bench_inventory.py
does: the key patterns and values of the real FlashInfer 0.6.18 files in tests/fixtures/ with
the token dim M varied, `_generation` from `fi_cache.model.v1.compute_generation`, the text from
`fi_cache.model.v1.dumps` (FlashInfer 0.6.18's bytes). In B each rank's file has 2% of its
tactics changed and 1% of its keys dropped, so diff has every kind of row to report.

Both commands take one cache per side, not a deployment, so a 64-rank check is 64 invocations,
each a fresh `fi-cache` process (interpreter start-up included), run one after another:
- diff:     `fi-cache --format json diff A/rank_i B/rank_i` for i = 0..63 (exit 1: they differ)
- coverage: `fi-cache --format json coverage A/rank_i --plan examples/plans/h200-gemm.toml`
Per run: the sweep's total wall seconds, and the largest peak RSS (ru_maxrss from wait4 of each
child) of its 64 processes. Reported: median and min-max over --runs runs (n), per sweep and per
invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench_inventory.py is a sibling script, not a package: its generator is reused as it is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_inventory import EntryFactory, _fi_cache_cmd, _write_private

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "examples" / "plans" / "h200-gemm.toml"
HASH = "d" * 64
DP, TP, ENTRIES = 8, 8, 5000
RANKS = DP * TP


def _name(rank: int) -> str:
    return f"autotune_configs_dp{rank // TP}_rank{rank}.json"


def build(root: Path, factory: EntryFactory) -> tuple[Path, Path]:
    """A/<hash>/ and B/<hash>/ with RANKS rank files each; B's differ from A's."""
    from fi_cache.model import v1

    a, b = root / "A" / HASH, root / "B" / HASH
    for rank in range(RANKS):
        entries = factory.entries(ENTRIES, seed=rank)
        rng = random.Random(10_000 + rank)
        other = dict(entries)
        keys = list(other)
        for key in rng.sample(keys, ENTRIES // 50):  # another tactic: 2% of the keys
            runner, tactic = other[key][0], other[key][1]
            other[key] = [runner, tactic + 1 if isinstance(tactic, int) else -1, *other[key][2:]]
        for key in rng.sample(keys, ENTRIES // 100):  # only in A: 1% of the keys
            other.pop(key, None)
        for side, data in ((a, entries), (b, other)):
            cf = v1.CacheFile(factory.metadata, data)
            cf = v1.CacheFile(cf.metadata, cf.entries, None, v1.compute_generation(cf))
            _write_private(side / _name(rank), v1.dumps(cf))
    return a, b


def timed(argv: list[str], expect: int) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one `fi-cache` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*_fi_cache_cmd(), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if code != expect:
        raise SystemExit(f"bench: fi-cache {' '.join(argv)} exited {code}: {err}")
    return seconds, usage.ru_maxrss / 1024  # Linux: KiB


def check(a: Path, b: Path) -> None:
    """The commands see what was built: every key difference in diff, 100% coverage."""
    cmd = _fi_cache_cmd()
    d = subprocess.run(
        [*cmd, "--format", "json", "diff", str(a / _name(5)), str(b / _name(5))],
        capture_output=True,
        check=False,
    )
    doc = json.loads(d.stdout)
    want = (ENTRIES // 100, 0, ENTRIES // 50)
    got = (doc["only_a"], doc["only_b"], doc["changed"])
    # A sampled tactic change can land on a dropped key: then it counts as only in A.
    if d.returncode != 1 or got[0] != want[0] or got[1] or not 0 < got[2] <= want[2]:
        raise SystemExit(f"bench: diff found {got}, built {want}: {d.stderr.decode()}")
    c = subprocess.run(
        [*cmd, "--format", "json", "coverage", str(a / _name(5)), "--plan", str(PLAN)],
        capture_output=True,
        check=False,
    )
    cov = json.loads(c.stdout)
    if c.returncode != 0 or not cov["pairs"]:
        raise SystemExit(f"bench: coverage {c.returncode}: {c.stderr.decode()}")
    print(
        f"  check: diff of rank 5 = {got[0]} only in A, {got[2]} changed, {doc['same']} same; "
        f"coverage = {cov['tuned']} of {cov['pairs']} pairs ({cov['coverage']}%)"
    )


def sweep(argv_of: list[list[str]], expect: int) -> tuple[float, float, list[float]]:
    """(total seconds, max peak RSS MB, per-invocation seconds) of argvs run one after another."""
    rows = [timed(argv, expect) for argv in argv_of]
    return sum(r[0] for r in rows), max(r[1] for r in rows), [r[0] for r in rows]


def _mmm(values: list[float], fmt: str) -> str:
    return (
        f"{format(statistics.median(values), fmt)} "
        f"({format(min(values), fmt)}-{format(max(values), fmt)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    runs = ap.parse_args().runs

    import fi_cache

    print(
        f"fi-cache {fi_cache.__version__}, python {platform.python_version()}, "
        f"{platform.machine()}, nproc {os.cpu_count()}, {runs} runs"
    )
    factory = EntryFactory()
    results: dict[str, list[tuple[float, float, list[float]]]] = {"diff": [], "coverage": []}
    with tempfile.TemporaryDirectory(prefix="fi-cache-bench-") as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        a, b = build(tmp, factory)
        size = sum(p.stat().st_size for p in a.iterdir()) / 1e6
        print(
            f"  built 2 x {RANKS} rank files x {ENTRIES} entries ({size:.1f} MB per side) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        check(a, b)
        store = tmp / "store"
        base = ["--store", str(store), "--format", "json"]
        diffs = [[*base, "diff", str(a / _name(r)), str(b / _name(r))] for r in range(RANKS)]
        covs = [[*base, "coverage", str(a / _name(r)), "--plan", str(PLAN)] for r in range(RANKS)]
        for _ in range(runs):  # interleaved, so both see the same machine state
            results["diff"].append(sweep(diffs, 1))
            results["coverage"].append(sweep(covs, 0))
    print(
        f"\n{RANKS} ranks x {ENTRIES} entries, {RANKS} sequential invocations per sweep, "
        f"median (min-max), n={runs}:"
    )
    print("| command | sweep of 64, s | per invocation, s | peak RSS, MB |")
    print("| --- | ---: | ---: | ---: |")
    for name, rows in results.items():
        per = [s for r in rows for s in r[2]]
        print(
            f"| {name} | {_mmm([r[0] for r in rows], '.2f')} | {_mmm(per, '.3f')} | "
            f"{_mmm([r[1] for r in rows], '.0f')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
