"""What every server engine's warm shares (vLLM's, SGLang's): one warm per namespace at a time
under its lock, reusing the one it waited for; the server run until healthy and stopped; the
caches it wrote or changed found, parsed and recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fi_cache.caches.inventory import scan
from fi_cache.engines.api import WarmFailed
from fi_cache.engines.server import Server, free_port, port_in_use, wait_healthy
from fi_cache.errors import Refused
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store.files import share_like_store
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace


@dataclass
class Progress:
    """How the caller hears about a warm (the CLI renders; tests record)."""

    waiting: Callable[[locks.Holder | None], None] = lambda holder: None
    tick: Callable[[float, str], None] = lambda elapsed, line: None
    note: Callable[[str], None] = lambda message: None


@dataclass(frozen=True)
class WarmOptions:
    timeout: float = 1800.0  # big MoE models tune for minutes
    port: int | None = None
    lock_timeout: float = 3600.0
    grace: float = 10.0  # seconds between SIGINT, SIGTERM and SIGKILL
    nothing_to_tune: str | None = None  # known up front: a start that saves nothing is still ok
    # Called under the namespace lock just before the engine starts (seeding): returns the
    # entries it put into each file, by path relative to the namespace.
    before_start: Callable[[Path, Manifest], dict[str, int]] | None = None


@dataclass(frozen=True)
class WarmResult:
    record: WarmRecord
    reused: bool  # another warm did the work while this one waited
    namespace_dir: Path
    files: list[CacheFileRecord] = field(default_factory=list)
    nothing_to_tune: str | None = None  # why this start saved nothing, and that this is fine


Run = Callable[[Path, dict[str, int]], WarmRecord]  # (namespace dir, seeded) -> the warm done


def locked_warm(
    store: Path,
    ns: Namespace,
    key: str,
    run: Run,
    options: WarmOptions,
    progress: Progress,
) -> WarmResult:
    """Under the namespace lock: reuse a warm of `key` that finished while this one waited, else
    `run` one and record it in the manifest."""
    ns_dir = ns.path(store)
    asked = time.time()
    waited: list[bool] = []

    def on_wait(holder: locks.Holder | None) -> None:
        waited.append(True)
        progress.waiting(holder)

    with locks.namespace_lock(ns_dir, "warm", options.lock_timeout, on_wait):
        m = manifests.load(ns_dir) or Manifest.new(ns)
        prior = m.last_warm(key, since=asked) if waited else None
        if prior is not None:
            return WarmResult(prior, True, ns_dir, prior.files)
        seeded = options.before_start(ns_dir, m) if options.before_start else {}
        record = run(ns_dir, seeded)
        share_like_store([ns_dir / f.path for f in record.files], store)
        manifests.save(ns_dir, m.with_warm(record))
        quiet = options.nothing_to_tune if not record.files else None
        return WarmResult(record, False, ns_dir, record.files, quiet)


def until_healthy(
    server: Server, port: int, name: str, options: WarmOptions, progress: Progress
) -> None:
    """Wait for the server's /health, then stop it; raises WarmFailed when it exits first or
    times out. Whatever happens (Ctrl-C, SIGTERM, errors) the server is not left behind."""
    try:
        state = wait_healthy(server, port, options.timeout, on_tick=progress.tick)
        if state == "exited":
            code = server.stop(options.grace)
            raise WarmFailed(
                f"{name} exited with code {code} before it was healthy",
                server.lines,
                list(server.log),
            )
        if state == "timeout":
            server.stop(options.grace)
            raise WarmFailed(
                f"{name} was not healthy after {options.timeout:.0f}s (--timeout)",
                server.lines,
                list(server.log),
            )
        progress.note(f"healthy: warm-up and the cache save are done; stopping {name}")
        server.stop(options.grace)
    except BaseException:
        server.stop(options.grace)
        raise


def warm_port(options: WarmOptions) -> int:
    """The warm-up server's port: --port (refused when in use), else a free one."""
    port = options.port or free_port()
    if options.port and port_in_use(port):
        raise Refused(f"port {port} is in use; pick another with --port or leave it out")
    return port


@dataclass(frozen=True)
class Ran:
    """A server started on a namespace, healthy, and stopped."""

    started: float  # time.time() at its start
    used: set[Path]  # the files under the watched dir it wrote, changed or named in its log
    server: Server  # for its log lines


def run_until_healthy(
    ns_dir: Path,
    watch: Path,
    cmd: list[str],
    env: dict[str, str],
    port: int,
    name: str,
    options: WarmOptions,
    progress: Progress,
    seeded: dict[str, int] | None = None,
) -> Ran:
    """Start `cmd` (holding `ns_dir`'s lock, with a guard), wait for its /health on `port`,
    stop it; raises WarmFailed as until_healthy does. `watch`: where its caches land."""
    started = time.time()
    before = snapshot(watch)
    progress.note(f"starting {' '.join(cmd[1:])}")
    server = Server(cmd, env, lock_dir=ns_dir, grace=options.grace, name=name)
    until_healthy(server, port, name, options, progress)
    return Ran(started, used_files(watch, before, server.named_files, seeded or {}), server)


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


def used_files(root: Path, before: Snapshot, named: set[str], seeded: dict[str, int]) -> set[Path]:
    """The files under `root` a start wrote or changed (against `before`), or named in its log,
    and those seeded for it (relative to the namespace, root's parent)."""
    after = snapshot(root)
    changed = {p for p, stamp in after.items() if before.get(p) != stamp}
    said = {Path(n) for n in named}
    return {p.resolve() for p in changed | said} | {(root.parent / s).resolve() for s in seeded}


def collect_files(
    root: Path,
    ns_dir: Path,
    who: str,
    used: set[Path] | None = None,
    seeded: dict[str, int] | None = None,
) -> list[CacheFileRecord]:
    """The caches under `root` this start used (`used`: files it wrote, changed or named in its
    log; None: all of them), each parsed (a corrupt one raises WarmFailed, naming `who` wrote
    it). A v2 store counts as used when any file inside it is; SGLang's write-only runs/ copies
    never count (no start reads them)."""
    if not root.is_dir():
        return []
    inv = scan([root], explicit=False)
    if inv.problems:
        p = inv.problems[0]
        raise WarmFailed(f"{who} wrote a cache fi-cache cannot read: {p.path}: {p.message}", [])
    seeded = seeded or {}
    out = []
    for c in inv.caches:
        here = c.path.resolve()
        if c.found.run is not None:
            continue
        if used is not None and not any(u == here or here in u.parents for u in used):
            continue
        rel = str(c.path.relative_to(ns_dir))
        out.append(CacheFileRecord(rel, len(c.file.entries), c.size, seeded.get(rel, 0)))
    return out
