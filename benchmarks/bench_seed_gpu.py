"""Issue 15's measurement, on a GPU: a start after a vLLM config change (same shapes, a new file)
with and without fi-cache's seeding, under FlashInfer's own autotuner.

Each start is fi-cache's tuning child (`python -m fi_cache.engines.flashinfer`): it runs the plan's
calls under `flashinfer.autotune(True, cache=FILE)` in a fresh process, as a vLLM start would, and
reports every bucket FlashInfer profiles. Per run, in a namespace-shaped temp dir:
  cold      FILE_A empty                           (the first start: everything is tuned)
  no-seed   FILE_B empty (a new config hash)       (what vLLM does today after a config change)
  seeded    FILE_C seeded by fi-cache from FILE_A  (maintenance/seed.py, what warm/serve do)
  same-file FILE_A again                           (the floor: a restart with nothing changed)
Printed: tuning seconds (FlashInfer's autotune context), profiled buckets, calls that tuned.

    python benchmarks/bench_seed_gpu.py --plan examples/plans/h200-gemm.toml --runs 3 [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from fi_cache.engines.flashinfer import plan as plans
from fi_cache.engines.flashinfer.driver import Job
from fi_cache.engines.flashinfer.launch import TuningChild
from fi_cache.maintenance import seed
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace

RANK0 = "autotune_configs_dp0_rank0.json"


def start(plan: plans.Plan, mode: str, cache: Path) -> dict[str, Any]:
    """One start's tuning, in a fresh process: seconds, buckets profiled, calls that tuned."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with TuningChild(sys.executable, 1800.0, 10.0) as child:
        child.send(Job(mode, plan.for_mode(mode)).to_json())  # type: ignore[arg-type]
        list(child.until("ready"))
        child.send({"cache": str(cache)})
        events = list(child.until("done"))
    buckets = [e for e in events if e["event"] == "bucket"]
    return {
        "seconds": float(events[-1]["seconds"]),
        "buckets": len(buckets),
        "calls_tuned": len({e["i"] for e in buckets}),
        "calls": sum(1 for e in events if e["event"] == "called"),
        "entries": len(v1.loads(cache.read_bytes()).entries),
    }


def one_run(plan: plans.Plan, mode: str, tmp: Path) -> dict[str, dict[str, Any]]:
    ns_dir = tmp / "ns"
    file_a = ns_dir / "vllm" / ("a" * 64) / RANK0
    out = {"cold": start(plan, mode, file_a)}
    out["no-seed"] = start(plan, mode, ns_dir / "vllm" / ("b" * 64) / RANK0)
    warm = WarmRecord(
        1.0,
        1.0,
        None,
        ["m", "--max-model-len", "4096"],
        "k",
        [CacheFileRecord(str(file_a.relative_to(ns_dir)), 0, 0)],
        None,
    )
    m = Manifest.new(Namespace(Fingerprint(), "fused")).with_warm(warm)
    target = ns_dir / "vllm" / ("c" * 64) / RANK0
    seeds, notes = seed.plan(ns_dir, m, lambda w: w.argv[:1] == ["m"], [target])
    assert seeds and not notes, notes
    seed.write(seeds[0])
    out["seeded"] = {**start(plan, mode, target), "seeded_entries": seeds[0].entries}
    out["same-file"] = start(plan, mode, file_a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--mode", default="fused")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args()
    plan = plans.loads(opts.plan.read_text(), str(opts.plan))
    runs = []
    for i in range(opts.runs):
        with tempfile.TemporaryDirectory(prefix="fi-cache-seed-") as tmp:
            runs.append(one_run(plan, opts.mode, Path(tmp)))
        print(f"run {i + 1}: {json.dumps(runs[-1])}", flush=True)
    for kind in ("cold", "no-seed", "seeded", "same-file"):
        secs = [r[kind]["seconds"] for r in runs]
        tuned = [r[kind]["calls_tuned"] for r in runs]
        buckets = [r[kind]["buckets"] for r in runs]
        print(
            f"{kind:8} median {statistics.median(secs):8.3f} s  (min {min(secs):.3f}, max "
            f"{max(secs):.3f})  calls tuned {tuned}  buckets {buckets}"
        )
    ratio = statistics.median(r["seeded"]["seconds"] / r["cold"]["seconds"] for r in runs)
    print(f"seeded / cold tuning time: median {ratio:.1%} (goal <= 5%, 0 calls tuned)")
    if opts.out:
        opts.out.write_text(json.dumps({"plan": str(opts.plan), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
