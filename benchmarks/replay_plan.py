#!/usr/bin/env python3
"""Replay a plan against a cache file the way a restarted engine would: the same calls under
`flashinfer.autotune(False, cache=FILE)`. Prints one JSON line: seconds (the calls, with the
file load), hits and misses (AutoTuner cache lookups). Used by bench_tune_gpu.sh.

    python benchmarks/replay_plan.py PLAN.toml CACHE.json [--mode fused|unfused]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fi_cache.engines.flashinfer import plan as plans
from fi_cache.engines.flashinfer.driver import Job, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("cache", type=Path)
    ap.add_argument("--mode", default="fused", choices=["fused", "unfused"])
    args = ap.parse_args()
    plan = plans.loads(args.plan.read_text(), str(args.plan))
    events: list[dict[str, object]] = []
    replies = iter([{"cache": str(args.cache)}])
    started = time.perf_counter()
    code = run(
        Job(args.mode, plan.for_mode(args.mode), tune=False), events.append, lambda: next(replies)
    )
    done = next((e for e in events if e["event"] in ("done", "error")), {})
    print(json.dumps({"exit": code, "wall_s": round(time.perf_counter() - started, 3), **done}))
    return code


if __name__ == "__main__":
    sys.exit(main())
