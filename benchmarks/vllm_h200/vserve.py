"""Run one vLLM (or fi-cache) command for run.sh's steps and write what it did as JSON.

    python3 vserve.py OUT_DIR NAME [--health PORT | --watch-health PORT] [--request MODEL]
                      [--launch-marker TEXT] [--healthy-marker TEXT] [--timeout S] -- CMD...
    python3 vserve.py summary OUT_DIR     # a Markdown table of every run's JSON
    python3 vserve.py stats OUT_DIR       # step 3m: median (min-max, n) per kind of start
    python3 vserve.py compare OUT_DIR     # doctor -- ARGS's predicted files vs the files vLLM named

Starts CMD in its own session with stdout+stderr in OUT_DIR/NAME.log. With --health it polls
http://127.0.0.1:PORT/health until 200 (then, with --request, sends one completion), and stops the
whole process group (SIGINT, SIGTERM, SIGKILL) as fi-cache's warm does; without it, waits for CMD
to exit. --watch-health PORT polls the same way but lets CMD run to its exit (a `fi-cache warm
--port PORT`, which stops vLLM itself once healthy); --launch-marker: the seconds at which TEXT
first shows in the log ("fi-cache: starting ", printed just before the warm starts vLLM), so
launch_s is fi-cache's part and vllm_health_s = health_s - launch_s vLLM's own (0 without it);
--healthy-marker ("fi-cache: healthy: "): its time is health_s when the poll missed /health (a
warm stops vLLM within its own 0.5 s poll; health_from says which). Polls every 0.1 s.
OUT_DIR/NAME.json gets: rc, seconds to /health, wall time, the FlashInfer
autotune time (from "[Autotuner]: Autotuning process starts/ends" in the log, else in
FlashInfer's own flashinfer_jit.log under $FLASHINFER_WORKSPACE_BASE, read from where it ended
before the run), vLLM's "init engine ... took" seconds, the autotune cache file vLLM named, any
"Invalid gemm2 profile id" line, and the completion's text.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

_FI_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - INFO - autotuner\.py:\d+ - flashinfer\.jit: "
TUNE_START = re.compile(_FI_STAMP + r"\[Autotuner\]: Autotuning process starts")
TUNE_END = re.compile(_FI_STAMP + r"\[Autotuner\]: Autotuning process ends")
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
CACHE_FILE = re.compile(r"Using FlashInfer autotune cache file: (\S+)")
LOADED = re.compile(_FI_STAMP + r"\[Autotuner\]: Loaded (\d+) configs from (\S+)")
# fi-cache's seeding lines (lifecycle/seeding.py): placed while vLLM starts, "(N.Ns after vLLM
# started)"; not placed; or placed too late and replaced by vLLM's own tuning
SEED_NOTE = re.compile(r"fi-cache: (seeded \d+ entries.*|not seeding.*|vLLM tuned .* itself.*)")
SEED_AFTER = re.compile(r"seeded (\d+) entries .*\(([\d.]+)s after vLLM started\)")
GEMM2 = re.compile(r".*Invalid gemm2 profile id.*")


def _jit_logs() -> list[Path]:
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE")
    return sorted(Path(base).rglob("flashinfer_jit.log")) if base else []


def _tune_seconds(text: str) -> list[float]:
    stamp = "%Y-%m-%d %H:%M:%S,%f"
    starts = [datetime.strptime(m.group(1), stamp) for m in TUNE_START.finditer(text)]
    ends = [datetime.strptime(m.group(1), stamp) for m in TUNE_END.finditer(text)]
    return [round((e - s).total_seconds(), 3) for s, e in zip(starts, ends, strict=False)]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _complete(port: int, model: str) -> str:
    body = json.dumps({"model": model, "prompt": "w1 w2 w3", "max_tokens": 8, "temperature": 0})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return str(json.loads(r.read())["choices"][0]["text"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # an engine core left in the group holds the GPU


def _marked(log: Path, marker: str) -> bool:
    try:
        return marker.encode() in log.read_bytes()
    except OSError:
        return False


def run(
    out: Path,
    name: str,
    cmd: list[str],
    port: int | None,
    model: str | None,
    timeout: float,
    watch: bool = False,
    marker: str | None = None,
    healthy_marker: str | None = None,
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.log"
    jit_before = {p: p.stat().st_size for p in _jit_logs()}
    res: dict[str, object] = {"name": name, "cmd": cmd, "health_port": port, "watch": watch}
    t0 = time.monotonic()
    res["started_epoch"] = round(time.time(), 2)
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        health_s = None
        launch_s = None if marker else 0.0
        marked_s = None
        try:
            while time.monotonic() - t0 < timeout and proc.poll() is None:
                now = round(time.monotonic() - t0, 2)
                if launch_s is None and _marked(log, marker or ""):
                    launch_s = now
                if healthy_marker and marked_s is None and _marked(log, healthy_marker):
                    marked_s = now
                if port is not None and health_s is None and _healthy(port):
                    health_s = round(time.monotonic() - t0, 2)
                    if not watch:
                        break
                time.sleep(0.1)
            res["health_polled_s"] = health_s
            res["healthy_marker_s"] = marked_s
            res["health_from"] = "poll" if health_s is not None else None
            if health_s is None and marked_s is not None:
                health_s, res["health_from"] = marked_s, "marker"
            res["health_s"] = health_s
            res["launch_s"] = launch_s
            own = None if health_s is None or launch_s is None else round(health_s - launch_s, 2)
            res["vllm_health_s"] = own
            if health_s is not None and model:
                try:
                    res["completion"] = _complete(port or 0, model)
                except (OSError, ValueError, KeyError) as exc:
                    res["completion_error"] = repr(exc)
            res["timed_out"] = proc.poll() is None and (health_s is None or watch)
        finally:
            _stop(proc)
    res["rc"] = proc.returncode
    res["wall_s"] = round(time.monotonic() - t0, 2)
    text = log.read_text(errors="replace")
    jit = "".join(p.read_text(errors="replace")[jit_before.get(p, 0) :] for p in _jit_logs())
    res["autotune_s"] = _tune_seconds(text) or _tune_seconds(jit)
    res["autotune_from"] = "log" if _tune_seconds(text) else ("flashinfer_jit.log" if jit else None)
    res["init_engine_s"] = [float(x) for x in INIT.findall(text)]
    res["cache_files"] = sorted(set(CACHE_FILE.findall(text)))
    res["gemm2_error"] = GEMM2.findall(text)[:3]
    res.update(_seed_timing(text + jit, res))
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def _seed_timing(text: str, res: dict[str, object]) -> dict[str, object]:
    """When fi-cache placed the seed and when FlashInfer loaded a file, both in seconds from
    this command's start (FlashInfer stamps local time, to the millisecond)."""
    stamp = "%Y-%m-%d %H:%M:%S,%f"
    t0, launch = float(str(res["started_epoch"])), res.get("launch_s")
    loaded = [
        {
            "at_s": round(datetime.strptime(m.group(1), stamp).timestamp() - t0, 2),
            "configs": int(m.group(2)),
            "path": m.group(3),
        }
        for m in LOADED.finditer(text)
    ]
    loaded = [d for i, d in enumerate(loaded) if d not in loaded[:i]]  # log and jit log alike
    out: dict[str, object] = {"seed_notes": SEED_NOTE.findall(text), "loaded": loaded}
    if (m := SEED_AFTER.search(text)) and isinstance(launch, float | int):
        out["seed_placed_s"] = round(float(launch) + float(m.group(2)), 2)
    return out


def summary(out: Path) -> str:
    rows = [
        "| run | rc | to /health (s) | wall (s) | autotune (s) | init engine (s) | gemm2 error |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for f in sorted(out.glob("*.json")):
        d = json.loads(f.read_text())
        if "cmd" not in d:
            continue  # doctor/ls output, not a run
        err = "yes" if d.get("gemm2_error") else ""
        rows.append(
            f"| {d['name']} | {d['rc']} | {d.get('health_s')} | {d['wall_s']} | "
            f"{d.get('autotune_s')} | {d.get('init_engine_s')} | {err} |"
        )
    return "\n".join(rows)


def _kind(name: str) -> str:
    """r2-same-file -> same-file: the rounds of one kind of start (step 3m)."""
    m = re.match(r"r\d+-(.+)", name)
    return m.group(1) if m else name


def _spread(xs: list[float]) -> dict[str, Any]:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    mid = len(xs) // 2
    med = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return {"median": round(med, 2), "min": xs[0], "max": xs[-1], "n": len(xs), "values": xs}


STAT_KEYS = ("health_s", "vllm_health_s", "launch_s", "autotune_s", "wall_s")


def stats(out: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """Step 3m's runs, per kind: seconds to /health (from the command's start and from vLLM's
    launch), fi-cache's part before the launch, FlashInfer autotune (summed over the start's
    tuning passes) and wall time; failed runs (no /health; a warm's exit != 0) are listed, not
    counted."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.glob("*.json")):
        d = json.loads(f.read_text())
        if "cmd" in d and re.match(r"(r\d+|0)-", str(d["name"])):
            kinds.setdefault(_kind(str(d["name"])), []).append(d)
    res: dict[str, dict[str, Any]] = {}
    for kind, runs in kinds.items():
        # a --health run is stopped by us (its exit code is the signal's); a warm must exit 0
        ok = [
            d
            for d in runs
            if d.get("health_s") is not None and (d.get("rc") == 0 or not d.get("watch"))
        ]
        for d in ok:
            d["autotune_s"] = round(sum(d.get("autotune_s") or []), 3)
        res[kind] = {
            "runs": [d["name"] for d in runs],
            "failed": [d["name"] for d in runs if d not in ok],
        }
        for k in STAT_KEYS:
            res[kind][k] = _spread([float(d[k]) for d in ok if d.get(k) is not None])

    def cell(v: dict[str, Any]) -> str:
        return f"{v['median']} ({v['min']}-{v['max']}, n={v['n']})" if v["n"] else "-"

    rows = [
        "| start | to /health | vLLM launch to /health | before vLLM's launch | autotune | "
        "wall | failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for kind, v in res.items():
        cells = " | ".join(cell(v[k]) for k in STAT_KEYS)
        rows.append(f"| {kind} | {cells} | {', '.join(v['failed'])} |")
    same, seeded = res.get("same-file"), res.get("seeded")
    for k in ("health_s", "vllm_health_s"):
        if same and seeded and same[k]["n"] and seeded[k]["n"]:
            a, b = same[k]["median"], seeded[k]["median"]
            rows.append(
                f"\nseeded / same-file, {k} medians: {b} / {a} = {b / a:.3f} "
                f"({(b / a - 1) * 100:+.1f} %)"
            )
    return res, "\n".join(rows)


def _paths(node: object) -> set[str]:
    """Every string in a JSON document that names a vLLM autotune file or its hash dir."""
    if isinstance(node, dict):
        return set().union(*(_paths(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(_paths(v) for v in node)) if node else set()
    name = str(node)
    hit = "flashinfer_autotune_cache" in name or "autotune_configs" in name
    return {name} if hit and name.startswith("/") else set()


def compare(out: Path) -> dict[str, object]:
    res: dict[str, object] = {}
    cases = [
        ("fused", "fused", "1a-plain-fused-cold"),
        ("unfused", "unfused", "1b-plain-unfused"),
        ("fresh-finalize1", "fresh-finalize1", "1a-plain-fused-cold"),
        ("fresh-finalize0", "fresh-finalize0", "1b-plain-unfused"),
    ]
    for mode, doc_name, run_name in cases:
        doc, run_json = out / f"2d-doctor-args-{doc_name}.json", out / f"{run_name}.json"
        try:
            predicted = sorted(_paths(json.loads(doc.read_text())))
        except (OSError, ValueError) as exc:
            predicted = [f"unreadable: {exc!r}"]
        written = json.loads(run_json.read_text())["cache_files"] if run_json.exists() else []
        # doctor names the hash dir ("cache-location"), vLLM the file in it
        hit = [w for w in written if w in predicted or str(Path(w).parent) in predicted]
        res[mode] = {
            "predicted": predicted,
            "vllm_named": written,
            "match": bool(written) and len(hit) == len(written),
        }
    return res


def main(argv: list[str]) -> int:
    if argv[:1] == ["summary"]:
        print(summary(Path(argv[1])))
        return 0
    if argv[:1] == ["stats"]:
        res, table = stats(Path(argv[1]))
        (Path(argv[1]) / "step3m-stats.json").write_text(json.dumps(res, indent=1) + "\n")
        print(table)
        return 0
    if argv[:1] == ["compare"]:
        print(json.dumps(compare(Path(argv[1])), indent=1))
        return 0
    if "--" not in argv or len(argv) < 4:
        sys.exit(__doc__)
    at = argv.index("--")
    opts, cmd = argv[:at], argv[at + 1 :]
    out, name, rest = Path(opts[0]), opts[1], opts[2:]
    flags = dict(zip(rest[::2], rest[1::2], strict=False))
    watch = "--watch-health" in flags
    port = (
        int(flags.get("--health") or flags["--watch-health"])
        if ("--health" in flags or watch)
        else None
    )
    timeout = float(flags.get("--timeout", 600))
    marker, healthy = flags.get("--launch-marker"), flags.get("--healthy-marker")
    res = run(out, name, cmd, port, flags.get("--request"), timeout, watch, marker, healthy)
    keys = (
        "rc",
        "health_s",
        "health_from",
        "healthy_marker_s",
        "launch_s",
        "vllm_health_s",
        "wall_s",
        "autotune_s",
        "init_engine_s",
        "gemm2_error",
        "completion",
    )
    print(name, json.dumps({k: res.get(k) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
