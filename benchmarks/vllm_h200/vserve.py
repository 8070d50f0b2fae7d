"""Run one vLLM (or fi-cache) command for run.sh's steps and write what it did as JSON.

    python3 vserve.py OUT_DIR NAME [--health PORT] [--request MODEL] [--timeout S] -- CMD...
    python3 vserve.py summary OUT_DIR     # a Markdown table of every run's JSON
    python3 vserve.py compare OUT_DIR     # doctor -- ARGS's predicted files vs the files vLLM named

Starts CMD in its own session with stdout+stderr in OUT_DIR/NAME.log. With --health it polls
http://127.0.0.1:PORT/health until 200 (then, with --request, sends one completion), and stops the
whole process group (SIGINT, SIGTERM, SIGKILL) as fi-cache's warm does; without it, waits for CMD
to exit. OUT_DIR/NAME.json gets: rc, seconds to /health, wall time, the FlashInfer autotune time
(from "[Autotuner]: Autotuning process starts/ends" in the log, else in FlashInfer's own
flashinfer_jit.log under $FLASHINFER_WORKSPACE_BASE, read from where it ended before the run),
vLLM's "init engine ... took" seconds, the autotune cache file vLLM named, any "Invalid gemm2
profile id" line, and the completion's text.
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

_FI_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - INFO - autotuner\.py:\d+ - flashinfer\.jit: "
TUNE_START = re.compile(_FI_STAMP + r"\[Autotuner\]: Autotuning process starts")
TUNE_END = re.compile(_FI_STAMP + r"\[Autotuner\]: Autotuning process ends")
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
CACHE_FILE = re.compile(r"Using FlashInfer autotune cache file: (\S+)")
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
        f"http://127.0.0.1:{port}/v1/completions", data=body.encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
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


def run(
    out: Path, name: str, cmd: list[str], port: int | None, model: str | None, timeout: float
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.log"
    jit_before = {p: p.stat().st_size for p in _jit_logs()}
    res: dict[str, object] = {"name": name, "cmd": cmd, "health_port": port}
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        health_s = None
        try:
            while time.monotonic() - t0 < timeout and proc.poll() is None:
                if port is not None and _healthy(port):
                    health_s = round(time.monotonic() - t0, 2)
                    break
                time.sleep(0.5)
            res["health_s"] = health_s
            if health_s is not None and model:
                try:
                    res["completion"] = _complete(port or 0, model)
                except (OSError, ValueError, KeyError) as exc:
                    res["completion_error"] = repr(exc)
            res["timed_out"] = proc.poll() is None and health_s is None
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
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def summary(out: Path) -> str:
    rows = [
        "| run | rc | to /health (s) | wall (s) | autotune (s) | init engine (s) | gemm2 error |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for f in sorted(out.glob("[0-9]*.json")):
        d = json.loads(f.read_text())
        if "cmd" not in d:
            continue  # doctor/ls output, not a run
        err = "yes" if d.get("gemm2_error") else ""
        rows.append(f"| {d['name']} | {d['rc']} | {d.get('health_s')} | {d['wall_s']} | "
                    f"{d.get('autotune_s')} | {d.get('init_engine_s')} | {err} |")  # fmt: skip
    return "\n".join(rows)


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
    cases = [("fused", "fused", "1a-plain-fused-cold"), ("unfused", "unfused", "1b-plain-unfused"),
             ("fresh-finalize1", "fresh-finalize1", "1a-plain-fused-cold"),
             ("fresh-finalize0", "fresh-finalize0", "1b-plain-unfused")]  # fmt: skip
    for mode, doc_name, run_name in cases:
        doc, run_json = out / f"2d-doctor-args-{doc_name}.json", out / f"{run_name}.json"
        try:
            predicted = sorted(_paths(json.loads(doc.read_text())))
        except (OSError, ValueError) as exc:
            predicted = [f"unreadable: {exc!r}"]
        written = json.loads(run_json.read_text())["cache_files"] if run_json.exists() else []
        # doctor names the hash dir ("cache-location"), vLLM the file in it
        hit = [w for w in written if w in predicted or str(Path(w).parent) in predicted]
        res[mode] = {"predicted": predicted, "vllm_named": written,
                     "match": bool(written) and len(hit) == len(written)}  # fmt: skip
    return res


def main(argv: list[str]) -> int:
    if argv[:1] == ["summary"]:
        print(summary(Path(argv[1])))
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
    port = int(flags["--health"]) if "--health" in flags else None
    res = run(out, name, cmd, port, flags.get("--request"), float(flags.get("--timeout", 600)))
    keys = ("rc", "health_s", "wall_s", "autotune_s", "init_engine_s", "gemm2_error", "completion")
    print(name, json.dumps({k: res.get(k) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
