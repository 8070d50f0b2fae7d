"""Warm a namespace: run `vllm serve` on it until healthy, stop it, check and record the caches.

One warm per namespace at a time (its lock); a warm that had to wait reuses the result of the
one it waited for when that one warmed the same vLLM arguments.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fi_cache import manifest as manifests
from fi_cache import storage
from fi_cache import vllm as vllm_mod
from fi_cache.environment import VllmInfo
from fi_cache.errors import FiCacheError, Refused
from fi_cache.inventory import scan
from fi_cache.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.namespace import Namespace

CACHE_SUBDIR = "vllm"  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR inside a namespace


class WarmFailed(FiCacheError):
    """vLLM exited early, timed out, or wrote no cache; `lines` are its last log lines."""

    def __init__(self, message: str, lines: list[str]) -> None:
        super().__init__(message)
        self.lines = lines


@dataclass
class Progress:
    """How the caller hears about a warm (the CLI renders; tests record)."""

    waiting: Callable[[storage.Holder | None], None] = lambda holder: None
    tick: Callable[[float, str], None] = lambda elapsed, line: None
    note: Callable[[str], None] = lambda message: None


@dataclass(frozen=True)
class WarmOptions:
    timeout: float = 1800.0  # big MoE models tune for minutes
    port: int | None = None
    lock_timeout: float = 3600.0
    grace: float = 10.0  # seconds between SIGINT, SIGTERM and SIGKILL


@dataclass(frozen=True)
class WarmResult:
    record: WarmRecord
    reused: bool  # another warm did the work while this one waited
    namespace_dir: Path
    files: list[CacheFileRecord] = field(default_factory=list)


def cache_dir(ns_dir: Path) -> Path:
    return ns_dir / CACHE_SUBDIR


def collect_files(ns_dir: Path) -> list[CacheFileRecord]:
    """The caches vLLM left in the namespace, each parsed (a corrupt one raises WarmFailed)."""
    root = cache_dir(ns_dir)
    if not root.is_dir():
        return []
    inv = scan([root], explicit=False)
    if inv.problems:
        p = inv.problems[0]
        raise WarmFailed(f"vLLM wrote a cache fi-cache cannot read: {p.path}: {p.message}", [])
    return [
        CacheFileRecord(str(c.path.relative_to(ns_dir)), len(c.file.entries), c.size)
        for c in inv.caches
    ]


def is_warm(ns_dir: Path, m: Manifest | None, args: vllm_mod.ServeArgs) -> bool:
    """A successful warm of these arguments is recorded and its files are still there."""
    last = m.last_warm(args.key) if m else None
    return last is not None and all((ns_dir / f.path).is_file() for f in last.files)


def warm(
    store: Path,
    ns: Namespace,
    args: vllm_mod.ServeArgs,
    executable: str,
    info: VllmInfo,
    options: WarmOptions = WarmOptions(),
    progress: Progress | None = None,
) -> WarmResult:
    """Warm `ns` with `vllm serve ARGS`. Raises WarmFailed, Refused or FiCacheError."""
    progress = progress or Progress()
    ns_dir = ns.path(store)
    asked = time.time()
    waited: list[bool] = []

    def on_wait(holder: storage.Holder | None) -> None:
        waited.append(True)
        progress.waiting(holder)

    with storage.namespace_lock(ns_dir, "warm", options.lock_timeout, on_wait):
        m = manifests.load(ns_dir) or Manifest.new(ns)
        prior = m.last_warm(args.key, since=asked) if waited else None
        if prior is not None:
            return WarmResult(prior, True, ns_dir, prior.files)
        record = _run(ns_dir, ns, args, executable, info, options, progress)
        storage.share_like_store([ns_dir / f.path for f in record.files], store)
        manifests.save(ns_dir, m.with_warm(record))
        return WarmResult(record, False, ns_dir, record.files)


def _run(
    ns_dir: Path,
    ns: Namespace,
    args: vllm_mod.ServeArgs,
    executable: str,
    info: VllmInfo,
    options: WarmOptions,
    progress: Progress,
) -> WarmRecord:
    port = options.port or vllm_mod.free_port()
    if options.port and vllm_mod.port_in_use(port):
        raise Refused(f"port {port} is in use; pick another with --port or leave it out")
    root = cache_dir(ns_dir)
    root.mkdir(parents=True, exist_ok=True)
    env = vllm_mod.launch_env(dict(os.environ), root, ns.finalize, args.uses_ray)
    # Warming never needs outside traffic: listen on loopback, on our port (last flag wins).
    cmd = [executable, "serve", *args.argv, "--host", "127.0.0.1", "--port", str(port)]
    started = time.time()
    progress.note(f"starting {' '.join(cmd[1:])}")
    server = vllm_mod.Server(cmd, env)
    try:
        state = vllm_mod.wait_healthy(server, port, options.timeout, on_tick=progress.tick)
        if state == "exited":
            code = server.stop(options.grace)
            raise WarmFailed(
                f"vLLM exited with code {code} before it was healthy", list(server.lines)
            )
        if state == "timeout":
            server.stop(options.grace)
            raise WarmFailed(
                f"vLLM was not healthy after {options.timeout:.0f}s (--timeout)", list(server.lines)
            )
        progress.note("healthy: warm-up and the cache save are done; stopping vLLM")
        server.stop(options.grace)
    except BaseException:
        server.stop(options.grace)  # Ctrl-C, SIGTERM, errors: never leave vLLM behind
        raise
    files = collect_files(ns_dir)
    if not files:
        raise WarmFailed(
            "vLLM became healthy but wrote no autotune cache (FlashInfer autotune off: -O0 or "
            "--disable-flashinfer-autotune? a model without FlashInfer kernels? vLLM < 0.25?)",
            list(server.lines),
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
