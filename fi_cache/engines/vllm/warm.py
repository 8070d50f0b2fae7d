"""Warm a namespace: run `vllm serve` on it until healthy, stop it, check and record the caches
(the lock, the reuse of a warm waited for and the recording are engines/warming.py's)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fi_cache.engines.api import WarmFailed
from fi_cache.engines.vllm import launch
from fi_cache.engines.vllm.args import ServeArgs
from fi_cache.engines.vllm.engine import ENGINE
from fi_cache.engines.warming import (
    Progress,
    WarmOptions,
    WarmResult,
    locked_warm,
    run_until_healthy,
    warm_port,
)
from fi_cache.engines.warming import collect_files as collect_files_under
from fi_cache.environment import Environment, VllmInfo
from fi_cache.store.files import ensure_dir
from fi_cache.store.manifest import CacheFileRecord, WarmRecord
from fi_cache.store.namespace import Namespace
from fi_cache.versions import VLLM_PERSISTENT_CACHE, parse_version


def nothing_to_tune(env: Environment, args: ServeArgs) -> str | None:
    """Why this vLLM start will tune and save nothing, when that is known before it starts; None
    when it should tune. vLLM tunes only with FlashInfer installed and device 0 at SM90+
    (kernel_warmup.py 0.32:265-267: has_flashinfer() and has_device_capability(90)), autotune on,
    and keeps a file only from 0.25."""
    version = parse_version(env.vllm.version)
    if args.autotune_off:
        return "FlashInfer autotune is off in the vLLM arguments"
    if version is not None and version < VLLM_PERSISTENT_CACHE:
        return f"vLLM {version} keeps no autotune cache (from {VLLM_PERSISTENT_CACHE})"
    if env.fingerprint.flashinfer_version is None:
        return f"no FlashInfer installed with this vLLM ({env.python})"
    if not env.gpus:
        return "no NVIDIA GPU visible: vLLM tunes FlashInfer kernels on SM90+ GPUs only"
    major = env.gpus[0].compute_cap.partition(".")[0]
    if major.isdigit() and int(major) < 9:
        return f"{env.gpus[0].name} is SM{env.gpus[0].compute_cap}: vLLM tunes on SM90+ only"
    return None


def collect_files(
    ns_dir: Path,
    used: set[Path] | None = None,
    seeded: dict[str, int] | None = None,
) -> list[CacheFileRecord]:
    """The vLLM caches this start used (warming.collect_files over the namespace's vllm/)."""
    return collect_files_under(ENGINE.cache_dir(ns_dir), ns_dir, "vLLM", used, seeded)


def warm(
    store: Path,
    ns: Namespace,
    args: ServeArgs,
    launcher: launch.Launcher,
    info: VllmInfo,
    options: WarmOptions | None = None,
    progress: Progress | None = None,
) -> WarmResult:
    """Warm `ns` with `vllm serve ARGS`. Raises WarmFailed, Refused or FiCacheError."""
    progress = progress or Progress()
    opts = options or WarmOptions()

    def run(ns_dir: Path, seeded: dict[str, int]) -> WarmRecord:
        return _run(ns_dir, ns, args, launcher, info, opts, progress, seeded)

    return locked_warm(store, ns, args.key, run, opts, progress)


def _run(
    ns_dir: Path,
    ns: Namespace,
    args: ServeArgs,
    launcher: launch.Launcher,
    info: VllmInfo,
    options: WarmOptions,
    progress: Progress,
    seeded: dict[str, int] | None = None,
) -> WarmRecord:
    port = warm_port(options)
    root = ENGINE.cache_dir(ns_dir)
    ensure_dir(root)
    env = launch.launch_env(
        dict(os.environ), root, ns.finalize, args.uses_ray, info.supports_finalize_env
    )
    # Warming never needs outside traffic: listen on loopback, on our port (last flag wins).
    cmd = launcher.command([*args.argv, "--host", "127.0.0.1", "--port", str(port)])
    seeded = seeded or {}
    ran = run_until_healthy(ns_dir, root, cmd, env, port, "vLLM", options, progress, seeded)
    server = ran.server
    ours = {u for u in ran.used if u.is_relative_to(ns_dir.resolve())}
    files = collect_files(ns_dir, ours, seeded)
    if not files and options.nothing_to_tune:
        progress.note(f"nothing to tune: {options.nothing_to_tune}")
    elif not files:
        raise WarmFailed(
            "vLLM became healthy but neither wrote nor read an autotune cache in the namespace "
            "(FlashInfer autotune off: -O0, "
            "--no-enable-flashinfer-autotune or, on 0.33, --disable-flashinfer-autotune? a model "
            "without FlashInfer kernels? vLLM < 0.25?)",
            server.lines,
            list(server.log),
        )
    return WarmRecord(
        started=ran.started,
        seconds=round(time.time() - ran.started, 3),
        vllm_version=info.version,
        argv=list(args.argv),
        argv_key=args.key,
        files=files,
        supports_finalize_env=info.supports_finalize_env,
    )
