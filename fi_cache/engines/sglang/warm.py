"""Warm a namespace with SGLang: `sglang serve` on it until /health answers 200 (every scheduler
is ready only after FlashInfer autotuning and the save: http_server.py 0.5.23:721-799, engine.py
:2013-2041), stop it, check and record the rank files (the lock, the reuse of a warm waited for
and the recording are engines/warming.py's)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from fi_cache.engines.sglang import launch
from fi_cache.engines.sglang.args import SglangArgs
from fi_cache.engines.sglang.engine import ENGINE
from fi_cache.engines.warming import (
    Progress,
    WarmOptions,
    WarmResult,
    collect_files,
    locked_warm,
    run_until_healthy,
    warm_port,
)
from fi_cache.store.files import prune_empty
from fi_cache.store.manifest import WarmRecord
from fi_cache.store.namespace import Namespace
from fi_cache.versions import SGLANG_FINALIZE_FROM, parse_version

# SGLang's own gate decides, from the model and GPU too (flashinfer_autotune.py 0.5.23:91-157):
# a start that tuned nothing is a start with nothing to tune, not a failed warm.
NOTHING_TUNED = (
    "SGLang became healthy and wrote no autotune file: it tunes only with a FlashInfer MoE "
    "backend (e.g. --moe-runner-backend flashinfer_cutlass; the default, auto, often picks "
    "another) or FlashInfer FP4/FP8 GEMMs, on SM90+ GPUs"
)


def warm(
    store: Path,
    ns: Namespace,
    args: SglangArgs,
    launcher: launch.Launcher,
    version: str,
    options: WarmOptions | None = None,
    progress: Progress | None = None,
) -> WarmResult:
    """Warm `ns` with `sglang serve ARGS` (SGLang `version`). Raises WarmFailed (it exited, timed
    out or wrote a corrupt file), Refused or FiCacheError."""
    progress = progress or Progress()
    opts = options or WarmOptions()

    def run(ns_dir: Path, seeded: dict[str, int]) -> WarmRecord:
        return _run(ns_dir, ns, args, launcher, version, opts, progress)

    result = locked_warm(store, ns, args.key, run, opts, progress)
    if not result.files and result.nothing_to_tune is None:
        return replace(result, nothing_to_tune=NOTHING_TUNED)
    return result


def _run(
    ns_dir: Path,
    ns: Namespace,
    args: SglangArgs,
    launcher: launch.Launcher,
    version: str,
    options: WarmOptions,
    progress: Progress,
) -> WarmRecord:
    port = warm_port(options)
    cache_dir = ENGINE.cache_dir(ns_dir)
    fresh = not cache_dir.exists()
    env = launch.namespace_env(cache_dir, os.environ, ns.finalize, version)
    # Warming never needs outside traffic: loopback, our port (argparse: the last flag wins).
    cmd = launcher.command(args, ["--host", "127.0.0.1", "--port", str(port)])
    root = ENGINE.autotune_dir(ns_dir)
    try:
        ran = run_until_healthy(ns_dir, root, cmd, env, port, "SGLang", options, progress)
    except BaseException:
        if fresh:
            prune_empty(cache_dir)  # a first start that failed leaves no empty tree behind
        raise
    files = collect_files(root, ns_dir, "SGLang", ran.used)
    if not files:
        progress.note(f"nothing to tune: {options.nothing_to_tune or NOTHING_TUNED}")
    v = parse_version(version)
    return WarmRecord(
        started=ran.started,
        seconds=round(time.time() - ran.started, 3),
        vllm_version=None,
        argv=list(args.argv),
        argv_key=args.key,
        files=files,
        supports_finalize_env=v is not None and v >= SGLANG_FINALIZE_FROM,
        engine="sglang",
        engine_version=version,
    )
