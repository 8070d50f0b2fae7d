"""`fi-cache align` and doctor's rank checks on a big deployment: 64 ranks on 8 nodes' copies
(8 ranks each) of one vLLM 0.32+ hash dir (MoE with -dp 8 -tp 8: `dp{d}_rank{8d+r}`), 5,000
entries per rank file. Half the entries are CUTLASS MoE keys carrying their rank (FlashInfer
0.6.18-0.7.1 keys, parsed to mask the rank), half rank-free GEMM keys; rank 63 is short of one
entry and one rank-free key has another tactic on every odd rank, so the gate fails and align
has choices to make.

Each measurement runs in a fresh process: `check` = `fi-cache doctor` over the 8 copies (reads,
gate, partial hits, divergent tactics, align's dry plan for the fix), `align` = `fi-cache align`
over the 8 copies (writes 8 x 64 files). Reported: wall seconds and peak RSS (ru_maxrss of the
child). Run: .venv/bin/python benchmarks/bench_ranks.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "tests" / "fixtures" / "h200" / "flashinfer-0.6.18-gemm.json"
HASH = "d" * 64
NODES, PER_NODE, ENTRIES = 8, 8, 5000


def _files(root: Path) -> list[Path]:
    meta = json.loads(GEMM.read_text())["_metadata"]
    copies = []
    for node in range(NODES):
        copy = root / f"node{node}" / HASH
        copy.mkdir(parents=True)
        copies.append(copy)
        for local in range(PER_NODE):
            rank = node * PER_NODE + local
            data: dict[str, object] = {"_metadata": meta}
            for i in range(ENTRIES // 2):
                moe = (
                    f"('trtllm::fused_moe::gemm1', 'MoERunner', (({i + 1}, 2048), (16, 1536, 2048),"
                    f" (0,), (16, 2048, 768), (0,)), (torch.bfloat16, torch.bfloat16, "
                    f"torch.bfloat16, 8, 8, {local}, 8, {local}, 1, 0, False, False, False, False, "
                    "False, False, True, 3, False, True))"
                )
                gemm = (
                    f"('bf16_gemm', 'CublasltBf16GemmRunner', (({i + 1}, 4096), (4096, 2048)), "
                    f"({i + 1}, 2048, 4096, torch.bfloat16))"
                )
                data[moe] = ["MoERunner", i % 45]
                data[gemm] = ["CublasltBf16GemmRunner", 1 if (i == 7 and rank % 2) else 0]
            if rank == 63:
                data.pop(next(k for k in data if k.startswith("('bf16_gemm'")))
            name = f"autotune_configs_dp{node}_rank{rank}.json"
            (copy / name).write_text(json.dumps(data, indent=2))
    return copies


def _timed(args: list[str], store: Path) -> tuple[float, float]:
    code = (
        "import resource, sys, time; from fi_cache.cli import main; t = time.perf_counter()\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "file=sys.stderr)"
    )
    env = {**os.environ, "FI_CACHE_DIR": str(store)}
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    seconds, kb = p.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(kb) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    runs = ap.parse_args().runs
    results: dict[str, list[tuple[float, float]]] = {"check": [], "align": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            copies = _files(Path(tmp))
            store = Path(tmp) / "store"
            paths = [str(c) for c in copies]
            results["check"].append(_timed(["--format", "json", "doctor", *paths], store))
            results["align"].append(_timed(["-q", "align", *paths], store))
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{NODES * PER_NODE} ranks on {NODES} copies x {ENTRIES} entries, {runs} runs (median):")
    for name, rows in results.items():
        secs = statistics.median(r[0] for r in rows)
        mem = statistics.median(r[1] for r in rows)
        print(
            f"  {name:6} {secs:6.2f} s   peak RSS {mem:6.0f} MB   runs: "
            + ", ".join(f"{r[0]:.2f}" for r in rows)
        )


if __name__ == "__main__":
    main()
