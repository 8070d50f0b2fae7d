"""A warm, for every serving engine: one per namespace at a time under its lock, reusing the one
it waited for; the file the engine will read seeded; the engine run until healthy and stopped;
the caches it wrote or changed found, parsed and recorded in the manifest."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from fi_cache.engines.api import LauncherT, Request, Run, ServedT, ServerEngine, WarmFailed
from fi_cache.engines.server import Server, free_port, port_in_use, wait_healthy
from fi_cache.errors import FiCacheError, Refused
from fi_cache.lifecycle import prepare, signals
from fi_cache.lifecycle.files import collect_files, snapshot, used_files
from fi_cache.lifecycle.ranks import align_ranks
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.seeding import Seeding, seeder
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store import pin as pins
from fi_cache.store.files import prune_empty, share_like_store
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord


@dataclass(frozen=True, kw_only=True)
class WarmOptions:
    timeout: float = 1800.0  # big MoE models tune for minutes
    port: int | None = None
    lock_timeout: float = 3600.0
    seed: bool = True
    again: bool = False  # start the engine even when a warm of these arguments is recorded


@dataclass(frozen=True)
class WarmResult:
    record: WarmRecord
    reused: bool  # another warm did the work while this one waited
    namespace_dir: Path
    files: list[CacheFileRecord] = field(default_factory=list)
    nothing_to_tune: str | None = None  # why this start saved nothing, and that this is fine
    already: bool = False  # warm already (recorded, its files there): nothing was started


def warm(
    engine: ServerEngine[ServedT, LauncherT],
    request: Request,
    options: WarmOptions,
    store: Path,
    report: Report,
) -> tuple[Run[ServedT, LauncherT], WarmResult]:
    """The warm command: resolve, bind, warm. Raises Refused, WarmFailed or FiCacheError."""
    target = prepare.resolve(engine, request, store, report)
    if why := engine.keeps_no_cache(target):
        raise Refused(f"{why}: nothing to warm")
    run = prepare.bind(engine, target, store, report)
    return run, warm_run(engine, run, options, store, report)


def warm_run(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    options: WarmOptions,
    store: Path,
    report: Report,
) -> WarmResult:
    """Warm `run`'s namespace (serve warms a cold one so). A failed warm's whole output is kept
    in the store (WarmFailed.saved_log) for doctor --log."""
    grace = signals.stop_grace()
    before = seeder(engine, run, store, report) if options.seed and engine.seeds else None
    signals.sigterm_as_interrupt()
    try:
        return _locked(engine, run, options, grace, before, store, report)
    except WarmFailed as exc:
        _keep_log(store, exc)
        raise


def _locked(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    options: WarmOptions,
    grace: float,
    before: Callable[[Path, Manifest], Seeding] | None,
    store: Path,
    report: Report,
) -> WarmResult:
    """Under the namespace lock: reuse a warm of these arguments that finished while this one
    waited, else start one and record it in the manifest."""
    ns_dir = run.ns.path(store)
    key = engine.warm_key(run.args, run.ns.finalize)
    asked = time.time()
    waited: list[bool] = []

    def on_wait(holder: locks.Holder | None) -> None:
        waited.append(True)
        report.waiting(holder)

    with locks.namespace_lock(ns_dir, "warm", options.lock_timeout, on_wait):
        m = manifests.load(ns_dir) or Manifest.new(run.ns)
        prior = m.last_warm(key, since=asked) if waited else None
        done = None if options.again else m.last_warm(key)
        warm_already = engine.is_warm(ns_dir, m, run.args, run.ns.finalize)
        if prior is None and done is not None and warm_already:
            result = WarmResult(done, True, ns_dir, done.files, already=True)
        elif prior is not None:
            result = WarmResult(prior, True, ns_dir, prior.files)
        else:
            if m.pin is not None:  # `fi-cache pin`: seeding and the engine's save would change it
                raise pins.refusal(ns_dir, f"a warm ({engine.display} saves its tuning there)")
            if waited:
                report.note(_overtaken(m.last_warm(since=asked)))
            seeding = before(ns_dir, m) if before else Seeding()
            record = _start(engine, run, ns_dir, key, options, grace, seeding, report)
            share_like_store([ns_dir / f.path for f in record.files], store)
            manifests.save(ns_dir, m.with_warm(record))
            quiet = run.nothing_to_tune if not record.files else None
            result = WarmResult(record, False, ns_dir, record.files, quiet)
    if not result.files and result.nothing_to_tune is None and engine.nothing_tuned:
        return replace(result, nothing_to_tune=engine.nothing_tuned)
    return result


def _overtaken(other: WarmRecord | None) -> str:
    """Why a warm that waited for the lock starts after all."""
    if other is not None:
        shown = " ".join(other.argv)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return f"the warm this one waited for was of other arguments ({shown}): warming these now"
    return "the warm this one waited for recorded nothing (it failed or was stopped): warming now"


def _start(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    ns_dir: Path,
    key: str,
    options: WarmOptions,
    grace: float,
    seeding: Seeding,
    report: Report,
) -> WarmRecord:
    """Start the engine (holding `ns_dir`'s lock, with a guard), seeding the files it will read
    meanwhile when those take seconds to know, wait for its /health, stop it, and make the warm
    record of the caches it used."""
    port = _port(options)
    fresh = not engine.cache_dir(ns_dir).exists()
    environ = engine.environment(run, ns_dir, os.environ, warm=True)
    cmd = engine.command(run, port)
    watch = engine.autotune_dir(ns_dir)
    started = time.time()
    before = snapshot(watch)
    report.note(f"starting {' '.join(cmd[1:])}")
    try:
        server = Server(cmd, environ, lock_dir=ns_dir, grace=grace, name=engine.display)
        seeding.start()
        ticking = seeding.ticking(report)  # the seeding thread's notes, said as they come
        _until_healthy(server, port, engine.display, options.timeout, grace, ticking)
        seeded = seeding.settle(report, server.named_files)
        wrote = {p.parent for p, stamp in snapshot(watch).items() if before.get(p) != stamp}
        # so the next start keeps and hits every rank's file; pipeline stages each their own
        align_ranks(watch, report, wrote, engine.tune_groups(run))
        used = used_files(watch, ns_dir, before, server.named_files, seeded)
        ours = {u for u in used if u.is_relative_to(ns_dir.resolve())}
        files = collect_files(watch, ns_dir, engine.display, ours, seeded)
        why = run.nothing_to_tune or engine.nothing_tuned
        if not files and why is None:
            raise WarmFailed(engine.empty_start, server.lines, list(server.log))
    except BaseException:
        seeding.cancel()
        if fresh:
            prune_empty(engine.cache_dir(ns_dir))  # a failed first start leaves no empty tree
        raise
    who = engine.identity(run)  # "nothing to tune" is the result's to say (warm's one line)
    return WarmRecord(
        started=started,
        seconds=round(time.time() - started, 3),
        vllm_version=who.vllm_version,
        argv=list(run.args.argv),
        argv_key=key,
        files=files,
        supports_finalize_env=who.supports_finalize_env,
        engine=engine.name,
        engine_version=who.engine_version,
    )


def _port(options: WarmOptions) -> int:
    """The warm-up server's port: --port (refused when in use), else a free one."""
    port = options.port or free_port()
    if options.port and port_in_use(port):
        raise Refused(f"port {port} is in use; pick another with --port or leave it out")
    return port


def _until_healthy(
    server: Server, port: int, name: str, timeout: float, grace: float, report: Report
) -> None:
    """Wait for the server's /health, then stop it; raises WarmFailed when it exits first or
    times out. Whatever happens (Ctrl-C, SIGTERM, errors) the server is not left behind."""
    try:
        state = wait_healthy(server, port, timeout, on_tick=report.tick)
        if state == "exited":
            code = server.stop(grace)
            raise WarmFailed(
                f"{name} exited with code {code} before it was healthy",
                server.lines,
                list(server.log),
            )
        if state == "timeout":
            server.stop(grace)
            raise WarmFailed(
                f"{name} was not healthy after {timeout:.0f}s (--timeout)",
                server.lines,
                list(server.log),
            )
        report.note(f"healthy: warm-up and the cache save are done; stopping {name}")
        server.stop(grace)
    except BaseException:
        server.stop(grace)
        raise


def _keep_log(store: Path, exc: WarmFailed) -> None:
    """Save a failed warm's whole output, and what a gemm profile-id crash or the engine's root
    cause in it says."""
    from fi_cache.doctor.logs import PROFILE_ID, parse_log
    from fi_cache.store.logs import save_failed_warm

    if not exc.log:
        return
    cause = parse_log(exc.log).root_cause
    if cause is not None and cause.text not in "\n".join(exc.lines):
        exc.root_cause = f"line {cause.line_no} of its output: {cause.text}"  # not in the tail
    with contextlib.suppress(FiCacheError, OSError):  # a read-only store: the tail is all
        exc.saved_log = save_failed_warm(store, exc.log)
        exc.crash = next((m.group(0) for ln in exc.log if (m := PROFILE_ID.search(ln))), None)
