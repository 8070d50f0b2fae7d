"""Warm a namespace: run `vllm serve` on it until healthy, stop it, check and record the caches.

One warm per namespace at a time (its lock); a warm that had to wait reuses the result of the
one it waited for when that one warmed the same vLLM arguments.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fi_cache.caches.inventory import scan
from fi_cache.engines.api import WarmFailed
from fi_cache.engines.vllm import launch
from fi_cache.engines.vllm.args import ServeArgs
from fi_cache.engines.vllm.engine import ENGINE
from fi_cache.environment import Environment, VllmInfo
from fi_cache.errors import Refused
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store.files import ensure_dir, share_like_store
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace
from fi_cache.versions import VLLM_PERSISTENT_CACHE, parse_version


@dataclass
class Progress:
    """How the caller hears about a warm (the CLI renders; tests record)."""

    waiting: Callable[[locks.Holder | None], None] = lambda holder: None
    tick: Callable[[float, str], None] = lambda elapsed, line: None
    note: Callable[[str], None] = lambda message: None


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


@dataclass(frozen=True)
class WarmOptions:
    timeout: float = 1800.0  # big MoE models tune for minutes
    port: int | None = None
    lock_timeout: float = 3600.0
    grace: float = 10.0  # seconds between SIGINT, SIGTERM and SIGKILL
    nothing_to_tune: str | None = None  # known up front: a start that saves nothing is still ok
    # Called under the namespace lock just before vLLM starts (seeding): returns the entries it
    # put into each file, by path relative to the namespace.
    before_start: Callable[[Path, Manifest], dict[str, int]] | None = None


@dataclass(frozen=True)
class WarmResult:
    record: WarmRecord
    reused: bool  # another warm did the work while this one waited
    namespace_dir: Path
    files: list[CacheFileRecord] = field(default_factory=list)
    nothing_to_tune: str | None = None  # why this start saved nothing, and that this is fine


Snapshot = dict[Path, tuple[int, int]]


def snapshot(root: Path) -> Snapshot:
    """(mtime_ns, size) of every file under `root`: what a start changed shows against it."""
    out: Snapshot = {}
    if root.is_dir():
        for p in root.rglob("*"):
            with contextlib.suppress(OSError):
                st = p.stat()
                if p.is_file():
                    out[p] = (st.st_mtime_ns, st.st_size)
    return out


def collect_files(
    ns_dir: Path,
    used: set[Path] | None = None,
    seeded: dict[str, int] | None = None,
) -> list[CacheFileRecord]:
    """The caches this start used (`used`: files it wrote, changed or named in its log; None:
    every cache in the namespace), each parsed (a corrupt one raises WarmFailed). A v2 store
    counts as used when any file inside it is."""
    root = ENGINE.cache_dir(ns_dir)
    if not root.is_dir():
        return []
    inv = scan([root], explicit=False)
    if inv.problems:
        p = inv.problems[0]
        raise WarmFailed(f"vLLM wrote a cache fi-cache cannot read: {p.path}: {p.message}", [])
    seeded = seeded or {}
    out = []
    for c in inv.caches:
        here = c.path.resolve()
        if used is not None and not any(u == here or here in u.parents for u in used):
            continue
        rel = str(c.path.relative_to(ns_dir))
        out.append(CacheFileRecord(rel, len(c.file.entries), c.size, seeded.get(rel, 0)))
    return out


def _used(root: Path, before: Snapshot, named: set[str], seeded: dict[str, int]) -> set[Path]:
    after = snapshot(root)
    changed = {p for p, stamp in after.items() if before.get(p) != stamp}
    said = {Path(n) for n in named}
    return {p.resolve() for p in changed | said} | {(root.parent / s).resolve() for s in seeded}


def warm(
    store: Path,
    ns: Namespace,
    args: ServeArgs,
    launcher: launch.Launcher,
    info: VllmInfo,
    options: WarmOptions = WarmOptions(),
    progress: Progress | None = None,
) -> WarmResult:
    """Warm `ns` with `vllm serve ARGS`. Raises WarmFailed, Refused or FiCacheError."""
    progress = progress or Progress()
    ns_dir = ns.path(store)
    asked = time.time()
    waited: list[bool] = []

    def on_wait(holder: locks.Holder | None) -> None:
        waited.append(True)
        progress.waiting(holder)

    with locks.namespace_lock(ns_dir, "warm", options.lock_timeout, on_wait):
        m = manifests.load(ns_dir) or Manifest.new(ns)
        prior = m.last_warm(args.key, since=asked) if waited else None
        if prior is not None:
            return WarmResult(prior, True, ns_dir, prior.files)
        seeded = options.before_start(ns_dir, m) if options.before_start else {}
        record = _run(ns_dir, ns, args, launcher, info, options, progress, seeded)
        share_like_store([ns_dir / f.path for f in record.files], store)
        manifests.save(ns_dir, m.with_warm(record))
        quiet = options.nothing_to_tune if not record.files else None
        return WarmResult(record, False, ns_dir, record.files, quiet)


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
    port = options.port or launch.free_port()
    if options.port and launch.port_in_use(port):
        raise Refused(f"port {port} is in use; pick another with --port or leave it out")
    root = ENGINE.cache_dir(ns_dir)
    ensure_dir(root)
    env = launch.launch_env(
        dict(os.environ), root, ns.finalize, args.uses_ray, info.supports_finalize_env
    )
    # Warming never needs outside traffic: listen on loopback, on our port (last flag wins).
    cmd = launcher.command([*args.argv, "--host", "127.0.0.1", "--port", str(port)])
    started = time.time()
    before = snapshot(root)
    progress.note(f"starting {' '.join(cmd[1:])}")
    server = launch.Server(cmd, env, lock_dir=ns_dir, grace=options.grace)
    try:
        state = launch.wait_healthy(server, port, options.timeout, on_tick=progress.tick)
        if state == "exited":
            code = server.stop(options.grace)
            raise WarmFailed(
                f"vLLM exited with code {code} before it was healthy",
                server.lines,
                list(server.log),
            )
        if state == "timeout":
            server.stop(options.grace)
            raise WarmFailed(
                f"vLLM was not healthy after {options.timeout:.0f}s (--timeout)",
                server.lines,
                list(server.log),
            )
        progress.note("healthy: warm-up and the cache save are done; stopping vLLM")
        server.stop(options.grace)
    except BaseException:
        server.stop(options.grace)  # Ctrl-C, SIGTERM, errors: never leave vLLM behind
        raise
    seeded = seeded or {}
    used = _used(root, before, server.named_files, seeded)
    files = collect_files(ns_dir, {u for u in used if u.is_relative_to(ns_dir.resolve())}, seeded)
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
        started=started,
        seconds=round(time.time() - started, 3),
        vllm_version=info.version,
        argv=list(args.argv),
        argv_key=args.key,
        files=files,
        supports_finalize_env=info.supports_finalize_env,
    )
