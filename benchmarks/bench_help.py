#!/usr/bin/env python3
"""`fi-cache --help` against a bare `import click` (goal: median ratio <= 1.5), side by side.

    .venv/bin/python benchmarks/bench_help.py [--runs 15]

Each round runs, in alternating order, `python -c "import click"` and `fi-cache --help` (the venv's
console script, else `python -m fi_cache --help`)
as fresh processes (wall time, interpreter start-up included) and keeps the ratio of the two, so
a loaded machine slows both alike; prints the medians of both and of the per-round ratios, and
the fi_cache modules `--help` imports (`python -X importtime`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    cwd = env.get("PYTHONPATH") if env else None  # `-m` puts the cwd first on sys.path
    t0 = time.perf_counter()
    subprocess.run(
        argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd
    )
    return time.perf_counter() - t0


def _imported() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fi_cache", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    return sorted(n for n in names if n.startswith("fi_cache"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument(
        "--tree",
        type=Path,
        help="also time `python -m fi_cache --help` of this "
        "checkout (an older commit's worktree), in the same rounds",
    )
    opts = ap.parse_args()
    runs = opts.runs
    click_argv = [sys.executable, "-c", "import click"]
    script = Path(sys.executable).with_name("fi-cache")  # the console script a user runs
    help_argv = (
        [str(script), "--help"] if script.exists() else [sys.executable, "-m", "fi_cache", "--help"]
    )
    module = [sys.executable, "-m", "fi_cache", "--help"]
    old_env = {**os.environ, "PYTHONPATH": str(opts.tree)} if opts.tree else None
    _wall(click_argv), _wall(help_argv)  # warm the page cache
    clicks, helps, olds = [], [], []
    for i in range(runs):
        order = [("click", click_argv, None), ("help", help_argv, None)]
        if old_env is not None:
            order.append(("old", module, old_env))
        if i % 2:
            order.reverse()  # neither goes first every round
        times = {name: _wall(argv, env) for name, argv, env in order}
        clicks.append(times["click"])
        helps.append(times["help"])
        if old_env is not None:
            olds.append(times["old"])
    ratios = [h / c for h, c in zip(helps, clicks, strict=True)]
    print(f"import click        median {statistics.median(clicks) * 1000:.0f} ms")
    print(f"fi-cache --help     median {statistics.median(helps) * 1000:.0f} ms")
    spread = f"min {min(ratios):.2f}, max {max(ratios):.2f}"
    print(f"ratio per round     median {statistics.median(ratios):.2f} ({spread}; goal <= 1.5)")
    if olds:
        old_ratio = statistics.median(o / c for o, c in zip(olds, clicks, strict=True))
        print(
            f"{opts.tree} (-m fi_cache --help)  median {statistics.median(olds) * 1000:.0f} ms, "
            f"ratio {old_ratio:.2f}"
        )
    mods = _imported()
    print(f"fi_cache modules imported by --help: {len(mods)}: {' '.join(mods)}")


if __name__ == "__main__":
    main()
