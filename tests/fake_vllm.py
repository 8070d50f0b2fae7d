"""A stand-in for the ``vllm`` executable, written for fi-cache's test-suite. This is NOT vLLM.

It imports nothing from vLLM, loads no model and uses no GPU. It only mimics what fi-cache can
observe from outside: ``vllm serve`` argument handling, log lines, the FlashInfer autotune cache
file that vLLM 0.27-0.33 writes under ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, the ``/health``
endpoint, exit codes and signal handling. Run it as ``python tests/fake_vllm.py serve MODEL ...``.

The cache goes to ``D/<sha256 hex>/autotune_configs.json`` (``autotune_configs_dp0_rank0.json``
when ``FAKE_VLLM_PER_RANK=1``; with ``FAKE_VLLM_RANKS=N`` one file per rank,
``autotune_configs_dp0_rank{r}.json``, rank r lacking the first r entries: ranks whose tunes
differ, as vLLM 0.32's do when each profiles on its own); the hash is over
``json.dumps([model, sorted(args)])`` where ``args`` is the argv after ``serve`` without
``--port``/``--host`` and their values.

Environment (all optional): FAKE_VLLM_RECORD (dir; argv/env appended to starts.jsonl),
FAKE_VLLM_MODE (ok|crash|hang|ignore-sigint|ignore-sigterm|exit-now), FAKE_VLLM_EXIT_CODE,
FAKE_VLLM_CACHE_SOURCE, FAKE_VLLM_PER_RANK, FAKE_VLLM_RANKS, FAKE_VLLM_NO_CACHE,
FAKE_VLLM_TUNE_SECONDS, FAKE_VLLM_HEALTH_DELAY, FAKE_VLLM_SPAWN_CHILD, FAKE_VLLM_V2,
FAKE_VLLM_IGNORE_SIGNALS, FAKE_VLLM_LOAD_SECONDS (how long its "model load" takes before it looks
for the cache file: vLLM reads it at kernel warm-up, ~40 s after launch on the H200's host).

FAKE_VLLM_V2=1 plays vLLM 0.33 with one rank: the entries go into FlashInfer's v2 store, written by
the real FlashInfer (0.7.x on PYTHONPATH; its `_collect_metadata` and `ManagedAutotuneCache`, the
code vLLM 0.33's `autotune_v2` reaches) at the root vLLM 0.33 passes: the override dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USAGE = "usage: vllm serve [model_tag] [options]  (fake_vllm.py: a test stand-in, not vLLM)"
ENV_PREFIXES = ("VLLM_", "FLASHINFER_", "FI_CACHE_", "NCCL_", "CUBLAS_", "PYTHONPATH")
DEFAULT_CACHE = {
    "_metadata": {
        "flashinfer_version": "0.6.18",
        "cuda_version": "13.0",
        "cublas_version": "13.1.0",
        "cudnn_version": "91900",
        "cudnn_frontend_version": "1.32.0",
        "gpu": "NVIDIA H200",
    },
    "('bf16_gemm', 'CublasltBf16GemmRunner', ((1, 4096), (4096, 2048)), ())": [
        "CublasltBf16GemmRunner",
        1,
    ],
}
TRACEBACK = """Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/vllm/entrypoints/openai/api_server.py", line 1, in run
  File "/usr/lib/python3/site-packages/flashinfer/autotuner.py", line 1, in choose_one
RuntimeError: Check failed: (id2 >= mGemm1TacticCount && id2 < mGemm1TacticCount + \
mGemm2TacticCount) is false: Invalid gemm2 profile id: 50"""
START = time.monotonic()
READY = threading.Event()


class Stop(Exception):
    """Raised by the signal handler to unwind the main thread."""


def log(msg: str, where: str = "api_server.py:1", level: str = "INFO") -> None:
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}", flush=True)


def fenv(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def parse(args: list[str]) -> tuple[str | None, str, int, list[str]]:
    """Leniently pick model, host and port out of the args after ``serve``."""
    model, host, port, key_args = None, "127.0.0.1", 8000, []
    if args and not args[0].startswith("-"):
        model = args[0]
    i = 0
    while i < len(args):
        tok = args[i]
        name, eq, val = tok.partition("=")
        takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("-")
        if tok.startswith("--") and not eq and takes_next:
            val = args[i + 1]
        step = 2 if tok.startswith("--") and takes_next else 1
        if name in ("--port", "--host"):
            if name == "--port":
                port = int(val)
            else:
                host = val
            i += step
            continue
        if name == "--model" and (eq or takes_next):
            model = val
        elif not tok.startswith("-") and model is None:
            model = tok
        key_args.append(tok)
        i += 1
    return model, host, port, key_args


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/health":
            self.send_response(404)
        elif READY.is_set() and time.monotonic() - START >= fenv("FAKE_VLLM_HEALTH_DELAY", 0.3):
            self.send_response(200)
        else:
            self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def count_configs(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return len([k for k in json.load(f) if k != "_metadata"])
    except (OSError, ValueError, TypeError):
        return 0


def write_cache(path: str) -> None:
    source = os.environ.get("FAKE_VLLM_CACHE_SOURCE")
    if source:
        with open(source, "rb") as f:
            data = f.read()
    else:
        data = json.dumps(DEFAULT_CACHE, indent=2).encode()
    ranks = int(os.environ.get("FAKE_VLLM_RANKS") or 1)
    if ranks > 1:
        d = os.path.dirname(path)
        for r in range(ranks):  # rank r lacks the first r entries
            whole = json.loads(data)
            for key in [k for k in whole if k.startswith("(")][:r]:
                del whole[key]
            name = f"autotune_configs_dp0_rank{r}.json"
            write_file(os.path.join(d, name), json.dumps(whole, indent=2).encode())
        return
    write_file(path, data)


def write_file(path: str, data: bytes) -> None:
    d, base = os.path.split(path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{base}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def v2_store(cache_dir: str | None) -> None:
    """Publish the entries through FlashInfer's own v2 writer, or report them loaded."""
    from tests.real_flashinfer.v2_writer import open_store, publish, winners

    store = open_store(cache_dir or None)
    entries = winners(os.environ["FAKE_VLLM_CACHE_SOURCE"])
    if all(store.lookup(k) is not None for k in entries):
        log(f"[Autotuner]: {len(entries)} entries found in {store.env_dir}", "autotuner.py:1")
        return
    log("[Autotuner]: Autotuning process starts ...", "autotuner.py:1")
    publish(store, entries)
    log(f"[Autotuner]: published {len(entries)} entries to {store.env_dir}", "autotuner.py:1")


def on_signal(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stop(signal.Signals(signum).name)


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        model, host, port, key_args = parse(argv[1:])
    except ValueError as e:
        print(f"{USAGE}\nerror: {e}", file=sys.stderr)
        return 2
    if model is None:
        print(USAGE, file=sys.stderr)
        print("error: the following arguments are required: model_tag", file=sys.stderr)
        return 2
    record, mode = os.environ.get("FAKE_VLLM_RECORD"), os.environ.get("FAKE_VLLM_MODE") or "ok"
    if record:
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        line = {"argv": argv, "env": env, "pid": os.getpid(), "started": time.time()}
        with open(os.path.join(record, "starts.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
    if mode == "exit-now":
        log(f"fake vLLM exiting at once (model {model})")
        return int(os.environ.get("FAKE_VLLM_EXIT_CODE") or 0)
    log("vLLM API server version 0.30.0")
    log(f"non-default args: {{'model': {model!r}, 'host': {host!r}, 'port': {port}}}")
    if os.environ.get("FAKE_VLLM_SPAWN_CHILD") == "1":  # same process group; never reaped here
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if record:
            with open(os.path.join(record, "child.pid"), "w", encoding="utf-8") as f:
                f.write(f"{child.pid}\n")
    ign = signal.SIG_IGN
    deaf = os.environ.get("FAKE_VLLM_IGNORE_SIGNALS") == "1"  # any mode: only SIGKILL stops it
    signal.signal(
        signal.SIGINT, ign if deaf or mode in ("ignore-sigint", "ignore-sigterm") else on_signal
    )
    signal.signal(signal.SIGTERM, ign if deaf or mode == "ignore-sigterm" else on_signal)
    try:
        server = ThreadingHTTPServer((host, port), Health)
    except OSError as e:
        log(str(e), level="ERROR")
        return 1
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        log("Loading model weights", "gpu_model_runner.py:1")
        cache_dir = os.environ.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
        if mode == "crash":
            log("[Autotuner]: Autotuning process starts ...", "autotuner.py:1")
            log("EngineCore failed to start.", "core.py:1", level="ERROR")
            print(TRACEBACK, file=sys.stderr, flush=True)
            server.server_close()
            return 1
        if os.environ.get("FAKE_VLLM_V2") == "1":
            v2_store(cache_dir)
        elif cache_dir and os.environ.get("FAKE_VLLM_NO_CACHE") != "1":
            digest = hashlib.sha256(json.dumps([model, sorted(key_args)]).encode()).hexdigest()
            per_rank = os.environ.get("FAKE_VLLM_PER_RANK") == "1"
            ranked = per_rank or int(os.environ.get("FAKE_VLLM_RANKS") or 1) > 1
            name = "autotune_configs_dp0_rank0.json" if ranked else "autotune_configs.json"
            path = os.path.join(cache_dir, digest, name)
            time.sleep(fenv("FAKE_VLLM_LOAD_SECONDS", 0))
            if os.path.exists(path):
                log(f"[Autotuner]: Loaded {count_configs(path)} configs from {path}", "utils.py:1")
            else:
                log("[Autotuner]: Autotuning process starts ...", "autotuner.py:1")
                while mode == "hang":  # stuck in "tuning": /health stays 503
                    time.sleep(1)
                time.sleep(fenv("FAKE_VLLM_TUNE_SECONDS", 0.2))
                write_cache(path)
                n = count_configs(path)
                log(
                    f"[Autotuner]: Saved {n} configs to {path} ({n} new, 0 from previous config)",
                    "utils.py:1",
                )
        else:
            time.sleep(fenv("FAKE_VLLM_TUNE_SECONDS", 0.2))
        if mode != "hang":
            READY.set()
        log(f"Starting vLLM API server on http://{host}:{port}")
        log("Application startup complete.", "launcher.py:1")
        while True:
            time.sleep(3600)
    except Stop:
        server.shutdown()
        server.server_close()
        raise


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Stop as stop:  # a signal stops the fake cleanly at any point: exit 0
        log(f"Received {stop}. Shutting down FastAPI HTTP server.", "launcher.py:1")
        sys.exit(0)
