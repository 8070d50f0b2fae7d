"""The tables of docs/benchmarks.md's issue-44 section from run.sh's results dir:
    python benchmarks/verdict_h200/summary.py RESULTS_DIR
Per FlashInfer version: the share of entries `fi-cache bench` finds slower than the default in each
fresh tune (plain and --repeat 3), the expected effect, and how many entries two fresh tunes differ
in (`fi-cache diff`: changed + only in one), with medians over the runs."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _walls(d: Path) -> dict[str, float]:
    out = {}
    text = (d / "timing.txt").read_text() if (d / "timing.txt").exists() else ""
    for m in re.finditer(r"^(\S+) rc=(\d+) wall_s=([\d.]+)", text, re.M):
        out[m.group(1)] = float(m.group(3))
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3g}" if values else "-"


def version(d: Path) -> list[str]:
    walls = _walls(d)
    lines = [f"### FlashInfer {d.name}", ""]
    head = [
        "table",
        "run",
        "entries",
        "faster",
        "noise",
        "slower",
        "untimed/skipped",
        "slower share",
        "effect vs default",
        "bench wall s",
        "tune wall s",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    shares: dict[str, list[float]] = {"plain": [], "repeat": []}
    for bench in sorted(d.glob("bench-*.json")):
        doc = _load(bench)
        name = bench.stem.removeprefix("bench-")
        if doc is None:
            lines.append(f"| {name} | - | (no JSON: see {bench.stem}.err) |" + " |" * 8)
            continue
        s = doc["summary"]
        c = s["counts"]
        kind, _, run = name.partition("-")
        if kind in shares:
            shares[kind].append(s["slower_share"])
        effect = "-" if s["effect"] is None else f"{s['effect']:+.1%}"
        other = c.get("untimed", 0) + c.get("skipped", 0)
        lines.append(
            f"| {kind} | {run or '-'} | {s['entries']} | {c.get('faster', 0)} "
            f"| {c.get('noise', 0)} "
            f"| {c.get('slower', 0)} | {other} | {s['slower_share']:.0%} | {effect} "
            f"| {walls.get(bench.stem, float('nan')):.1f} | {walls.get(name, float('nan')):.1f} |"
        )
    lines += ["", "| tables | median slower share |", "| --- | --- |"]
    for kind, values in shares.items():
        lines.append(f"| {kind} | {_median(values)} (n={len(values)}) |")
    lines += [
        "",
        "| pair of fresh tunes | entries | differing (changed + only in one) |",
        "| --- | --- | --- |",
    ]
    differ: dict[str, list[float]] = {"plain": [], "repeat": []}
    for diff in sorted(d.glob("diff-*.json")):
        doc = _load(diff)
        if doc is None:
            continue
        n = doc["changed"] + doc["only_a"] + doc["only_b"]
        kind = diff.stem.split("-")[1]
        differ.setdefault(kind, []).append(n)
        total = doc["same"] + n
        lines.append(f"| {diff.stem.removeprefix('diff-')} | {total} | {n} |")
    lines += ["", "| tables | median differing entries |", "| --- | --- |"]
    for kind, values in differ.items():
        lines.append(f"| {kind} | {_median(values)} (n={len(values)}) |")
    return [*lines, ""]


def main() -> None:
    root = Path(sys.argv[1])
    host = (root / "host.txt").read_text().strip() if (root / "host.txt").exists() else "?"
    print(f"host: {host}\n")
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        print("\n".join(version(d)))


if __name__ == "__main__":
    main()
