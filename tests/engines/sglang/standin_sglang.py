"""STAND-IN for SGLang's server (`sglang serve ARGS`), for tests without a GPU: SGLang has no CPU
build on PyPI. Run as the `sglang` console script of a test venv (tests/engines/sglang/rig.py)
whose sglang dist-info says which release it is (0.5.18 or 0.5.23).

SGLang's own code, read from that release's wheel (.cache/sglang-wheels, downloaded by
scripts/test.sh, never installed) and run here:
- sglang/srt/environ.py, whole: how SGLANG_CACHE_DIR, SGLANG_FLASHINFER_MOE_FUSED_FINALIZE and
  SGLANG_FLASHINFER_AUTOTUNE_CACHE are read (EnvStr, EnvBool, `.set()`), and
  `redirect_third_party_caches()`, which `import sglang` runs first (sglang/__init__.py:11-14);
- `flashinfer_autotune_cache_path` and the runs/ branch of model_executor/runner/
  flashinfer_autotune.py (tests/sglang_layout.py): where the rank file goes.

FlashInfer's own code: the rank file is loaded and saved by `flashinfer.autotune(True, cache=...)`
(as SGLang 0.5.17-0.5.20 do) or, for 0.5.21+, by that release's own `flashinfer_autotune_context`
from its wheel (explicit `load_configs` / `save_configs`, saving at every start: 0.5.21:282-298,
0.5.23:327-367; its TP group here is one rank, so the rank digest is tests/ranks/gloo_sglang.py's;
FlashInfer 0.6.x has no `autotune_v2`, which 0.5.23 enters with persistent_cache=False: a
no-op stands in), around FlashInfer's real `cutlass_fused_moe`, called with
`use_fused_finalize` read from SGLang's variable as moe_runner/flashinfer_cutlass.py 0.5.23:391
passes it. The kernel and the device are tests/engines/flashinfer/cpu_tune_child.py's CPU
stand-ins (an H200's metadata is stamped).

MIMICKED, not run (SGLang 0.5.23's behaviour, file:line in docs/research/sglang-releases.md):
a few server flags (others are refused, as SGLang's parser does); --enable-deterministic-inference
sets the variable to 0 (arg_groups/serving_hook.py:447-448) and, like --disable-flashinfer-autotune
or a non-FlashInfer MoE backend, skips autotune (flashinfer_autotune.py:91); one rank per
--tp-size, in one process; the port stays closed until tuning and the save are done, then
/health answers 200 (http_server.py:721); SIGTERM or SIGINT ends it (no requests to drain).

$FI_CACHE_STANDIN_REPORT: a JSON file it writes what it saw to (one object per start, appended;
"profiled": the tactic timings FlashInfer took for a file, 0 when it had every key).
$FI_CACHE_STANDIN_EXIT=1: exit 0 once the arguments are read (the serve-overhead benchmark).
$FI_CACHE_STANDIN_HANG=1: never open the port (SGLang stuck in start-up, where node 0 installs no
SIGTERM handler: entrypoints/engine.py 0.5.23:1969-1982).
"""

from __future__ import annotations

import argparse
import http.server
import importlib.metadata as md
import json
import os
import signal
import sys
import threading
import time
import types
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests import sglang_layout  # noqa: E402

FLASHINFER_MOE = {
    "flashinfer_cutlass",
    "flashinfer_trtllm",
    "flashinfer_cutedsl",
    "flashinfer_mxfp4",
    "flashinfer_megamoe",
}
WATCHED = (
    "SGLANG_CACHE_DIR",
    "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE",
    "SGLANG_DG_CACHE_DIR",
    "SGLANG_CUTE_AOT_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "TILELANG_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
)


def real_environ(version: str) -> types.ModuleType:
    """SGLang `version`'s sglang/srt/environ.py, from its wheel, as `sglang.srt.environ`."""
    wheel = next(iter(sorted(sglang_layout.WHEELS.glob(f"sglang-{version}-*.whl"))), None)
    if wheel is None:
        sys.exit(f"stand-in sglang: no sglang {version} wheel in {sglang_layout.WHEELS}")
    with zipfile.ZipFile(wheel) as z:
        source = z.read("sglang/srt/environ.py").decode()
    for name in ("sglang", "sglang.srt"):
        sys.modules.setdefault(name, types.ModuleType(name))
    module = types.ModuleType("sglang.srt.environ")
    module.__file__ = f"{wheel}/sglang/srt/environ.py"
    sys.modules["sglang.srt.environ"] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def parse(argv: list[str], version: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang serve")
    if tuple(map(int, version.split(".")[:3])) >= (0, 5, 23):
        p.add_argument("model", nargs="?")  # cli/serve.py 0.5.23:62-66
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1)
    p.add_argument("--ep-size", "--expert-parallel-size", "--ep", dest="ep", type=int, default=1)
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    p.add_argument("--disable-flashinfer-autotune", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    args = p.parse_args(argv)
    args.model_path = args.model_path or getattr(args, "model", None)
    if not args.model_path:
        p.error("the following arguments are required: --model-path")
    return args


PROFILED = [0]  # tactic timings FlashInfer's autotuner took: 0 when the file had every key


EXPLICIT_SAVE = (0, 5, 21)  # SGLang's own context loads and saves by hand from here


def release_context(version: str, rank_file: Path, reuse: bool) -> Any:
    """SGLang `version`'s `flashinfer_autotune_context` from its wheel, over CPU stand-ins for
    the model runner, streams and runtime accessors; the key path is `rank_file`'s."""
    import __future__

    import ast
    import contextlib
    import datetime
    import hashlib
    import logging
    import uuid

    import flashinfer
    import torch

    if not hasattr(flashinfer, "autotune_v2"):  # FlashInfer 0.6.x: the v2 store does not exist
        flashinfer.autotune_v2 = lambda **kw: contextlib.nullcontext()  # type: ignore[attr-defined]
    taken = (
        "_autotune_tactic_sync_group",
        "_autotune_process_group",
        "flashinfer_autotune_context",
    )
    text = sglang_layout.sglang_module(version)
    body = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in taken]
    assert {n.name for n in body} == set(taken), f"sglang {version}: the context moved"
    ns = types.SimpleNamespace
    one_rank = ns(world_size=1, cpu_group=None)  # sync group None: no digest in one process
    # MegaMoE's own profiling context (0.5.22+) is not run: the accessors say CUTLASS.
    stream = ns(wait_stream=lambda other: None)
    torch.cuda.current_stream = lambda *a, **k: stream  # type: ignore[assignment]
    torch.get_device_module = lambda device=None: ns(stream=lambda s: contextlib.nullcontext())  # type: ignore[assignment]
    for name, attr in (
        ("sglang.srt.layers.logits_processor", "autotune_dummy_run_mode"),
        ("sglang.srt.layers.moe.flashinfer_megamoe_autotune", "megamoe_autotune_context"),
    ):
        module = types.ModuleType(name)
        setattr(module, attr, lambda *a, **k: contextlib.nullcontext())
        sys.modules[name] = module
    glb: dict[str, Any] = {
        "contextlib": contextlib,
        "datetime": datetime,
        "hashlib": hashlib,
        "uuid": uuid,
        "Path": Path,
        "torch": torch,
        "logger": logging.getLogger("sglang-standin"),
        "envs": ns(SGLANG_FLASHINFER_AUTOTUNE_CACHE=ns(get=lambda: reuse)),
        "get_parallel": lambda: ns(tp_group=one_rank),
        "get_exec": lambda: ns(moe=ns(moe_runner_backend="flashinfer_cutlass")),
        "flashinfer_autotune_cache_path": lambda mr: rank_file,
        "get_flashinfer_autotune_skip_ops": lambda mr: set(),
        "empty_context": contextlib.nullcontext,
    }
    flags = __future__.annotations.compiler_flag
    where = f"sglang-{version}:{sglang_layout.MODULE}"
    exec(compile(ast.Module(body=body, type_ignores=[]), where, "exec", flags), glb)
    runner = ns(device="cpu", forward_stream=stream, is_draft_worker=False, tp_group=one_rank)
    return glb["flashinfer_autotune_context"](runner, run_lm_head=False)


def tune(
    rank_file: Path, runs_file: Path, fused: bool, version: str, reuse: bool
) -> tuple[Path, int]:
    """FlashInfer's autotune around its real cutlass_fused_moe, entered as SGLang `version`
    does (`runs_file`: the runs/ copy, where the release's own context does not name it);
    returns the file it wrote and its entries."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "engines" / "flashinfer"))
    import cpu_tune_child  # the CPU kernel and device stand-ins
    import flashinfer
    from flashinfer.autotuner import autotuner as fi_at

    from fi_cache.engines.flashinfer import ops
    from fi_cache.engines.flashinfer.plan import MoeOp

    cpu_tune_child._install()
    fi_at.AutoTuner._instance = None  # one process per rank in SGLang: a fresh tuner each
    timed = fi_at.AutoTuner._profile_single_kernel

    def counted(*args: object, **kwargs: object) -> float:
        PROFILED[0] += 1
        return timed(*args, **kwargs)  # type: ignore[no-any-return, arg-type]

    fi_at.AutoTuner._profile_single_kernel = counted
    op = MoeOp("bf16", 256, 128, 8, 2, (1, 16), ("fused" if fused else "unfused",))
    mode = "fused" if fused else "unfused"
    explicit = tuple(map(int, version.split(".")[:3])) >= EXPLICIT_SAVE
    if explicit:
        runs = rank_file.parent / "runs"
        before = set(runs.iterdir()) if runs.is_dir() else set()
        context = release_context(version, rank_file, reuse)
    else:
        if not reuse:
            rank_file = runs_file
        context = flashinfer.autotune(True, cache=str(rank_file))
    with context:
        for call in ops.ADAPTERS["cutlass_fused_moe"].calls(op, torch.device("cpu"), mode):
            call.run()
    if explicit and not reuse:  # the release named its runs/ file itself
        [rank_file] = set(runs.iterdir()) - before
    return rank_file, sum(not k.startswith("_") for k in json.loads(rank_file.read_text()))


def serve_health(host: str, port: int) -> None:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer((host, port), Health)

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"The server is fired up and ready to roll! ({host}:{port})", flush=True)
    server.serve_forever()


def main() -> int:
    version = md.version("sglang")
    if sys.argv[1:2] != ["serve"]:
        sys.exit("stand-in sglang: only `sglang serve ARGS`")
    environ = real_environ(version)
    if hasattr(environ, "redirect_third_party_caches"):
        environ.redirect_third_party_caches()  # what `import sglang` does first (0.5.18+)
    envs = environ.envs
    args = parse(sys.argv[2:], version)
    if args.enable_deterministic_inference:
        envs.SGLANG_FLASHINFER_MOE_FUSED_FINALIZE.set("0")
    fused = bool(envs.SGLANG_FLASHINFER_MOE_FUSED_FINALIZE.get())
    if os.environ.get("FI_CACHE_STANDIN_EXIT"):
        return 0  # benchmarks/bench_serve_sglang.py: a start that costs the same either way
    tunes = not (
        args.enable_deterministic_inference
        or args.disable_flashinfer_autotune
        or args.moe_runner_backend not in FLASHINFER_MOE
    )
    report: dict[str, object] = {
        "pid": os.getpid(),
        "version": version,
        "env": {k: os.environ.get(k) for k in WATCHED},
        "fused": fused,
        "tuned": tunes,
        "files": [],
    }
    cache_dir = Path(envs.SGLANG_CACHE_DIR.get())
    for rank in range(args.tp if tunes else 0):
        fi_version = md.version("flashinfer-python")
        rank_file, runs_file = sglang_layout.sglang_paths(
            version,
            cache_dir,
            flashinfer=fi_version,
            model=args.model_path,
            tp=args.tp,
            ep=args.ep,
            tp_rank=rank,
            backend=args.moe_runner_backend,
        )
        reuse = bool(envs.SGLANG_FLASHINFER_AUTOTUNE_CACHE.get())
        target = rank_file if reuse else runs_file
        existed = target.exists()
        inode = target.stat().st_ino if existed else None
        PROFILED[0] = 0
        target, entries = tune(rank_file, runs_file, fused, version, reuse)
        rewritten = existed and target.stat().st_ino != inode  # FlashInfer saves by os.replace
        report["files"].append(
            {
                "path": str(target),
                "existed": existed,
                "entries": entries,  # type: ignore[attr-defined]
                "profiled": PROFILED[0],
                "rewritten": rewritten,
            }
        )
        print(f"[Autotuner]: saved {entries} configs to {target}", flush=True)
    # Triton writes into its cache dir while kernels compile: where it went is what users notice.
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    triton.mkdir(parents=True, exist_ok=True)
    (triton / "standin-kernel.txt").write_text("compiled\n")
    if path := os.environ.get("FI_CACHE_STANDIN_REPORT"):
        with open(path, "a") as f:
            f.write(json.dumps(report) + "\n")
    if os.environ.get("FI_CACHE_STANDIN_HANG"):
        while True:  # stuck in start-up: the port stays closed, default signal handlers
            time.sleep(1)
    serve_health(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
