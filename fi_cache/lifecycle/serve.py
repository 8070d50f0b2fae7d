"""A serve, for every serving engine: pre-flight checks on the namespace, a warm when it is cold,
its use recorded and marked, then the process handed to the engine (exec: its signals reach it
directly, its exit code is serve's)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from fi_cache.engines.api import LauncherT, Request, Run, ServedT, ServerEngine
from fi_cache.errors import FiCacheError, Refused
from fi_cache.lifecycle import prepare, signals
from fi_cache.lifecycle.report import Report
from fi_cache.store.manifest import Manifest

if TYPE_CHECKING:  # a warm namespace is served without loading the warm (server, seeding)
    from collections.abc import Callable

    from fi_cache.doctor.findings import Finding
    from fi_cache.doctor.inputs import Target
    from fi_cache.lifecycle.warm import WarmResult

    # (the config hash, asked for only when needed; the engine's dir; the target)
    TierCheck = Callable[[Callable[[], str | None], Path, Target], tuple[list[Finding], str | None]]


@dataclass(frozen=True, kw_only=True)
class Handover:
    """What serve hands the process to."""

    command: list[str]
    environ: dict[str, str]
    display: str  # the engine's name, for a failed exec
    finalize: str
    ns_dir: Path | None  # None: a release that keeps no cache runs as it is
    cache_dir: Path | None  # the engine's dir in the namespace
    warmed: WarmResult | None  # None: warm already (or --no-warm, or nothing to warm)
    # The store trusts flock: the namespace's in-use mark is held for the engine (a replay
    # takes it again: whether it was taken is no decision).
    in_use_by_flock: bool = False


@dataclass(frozen=True)
class ServeOptions:
    warm: bool = True  # warm a cold namespace first
    timeout: float = 1800.0  # for the warm's /health
    seed: bool = True
    complete_ranks: bool = True  # fill this node's missing rank files from the other ranks'
    pull: str | None = None  # the fleet's URL: import this machine's bundle before the checks
    lock_timeout: float = 3600.0  # for another warm of the namespace (serve --lock-timeout)
    # The tier this deployment's `vllm preload` daemon adopts from, judged for a config hash
    # (cli/serve.py passes tier/preflight.check: lifecycle does not reach the tier itself).
    tier_check: TierCheck | None = None


def serve(
    engine: ServerEngine[ServedT, LauncherT],
    request: Request,
    options: ServeOptions,
    store: Path,
    report: Report,
) -> Handover:
    """Everything serve does before it hands over. Raises Refused, WarmFailed or FiCacheError
    (pre-flight errors without --force)."""
    if options.pull:
        pull_first(options.pull, store, report)
    target = prepare.resolve(engine, request, store, report)
    if why := engine.keeps_no_cache(target):
        report.warn(f"{why}: serving it as it is")
        run = engine.bind(target)
        return Handover(
            command=engine.command(run),
            environ=dict(os.environ),
            display=engine.display,
            finalize=target.ns.finalize,
            ns_dir=None,
            cache_dir=None,
            warmed=None,
        )
    run = prepare.bind(engine, target, store, report)
    ns_dir = run.ns.path(store)
    m = preflight(engine, run, ns_dir, request.force, report)
    pinned = m is not None and m.pin is not None  # no warm, no rank fill: served read-only
    if m is not None and m.pin is not None:
        _check_pinned(engine, run, ns_dir, m)
        report.note("namespace pinned (`fi-cache pin`): served read-only")
    if options.complete_ranks and not pinned and not _unwritable(ns_dir):
        from fi_cache.lifecycle.ranks import complete_node

        complete_node(engine, run, ns_dir, store, report)
    if (problem := engine.read_only_problem(run)) and _unwritable(ns_dir):
        if not request.force:
            raise Refused(f"{problem} (or pass --force)", str(ns_dir))
        report.warn(f"{problem} (going on: --force)")
    warmed = None
    if not pinned and not engine.is_warm(ns_dir, m, run.args, run.ns.finalize):
        if why := engine.serve_without_warm(run):
            report.warn(why)
        elif options.warm:
            from fi_cache.lifecycle.warm import WarmOptions, warm_run

            warm = WarmOptions(
                timeout=options.timeout, lock_timeout=options.lock_timeout, seed=options.seed
            )
            warmed = warm_run(engine, run, warm, store, report)
            signals.sigterm_default()
            if warmed.nothing_to_tune:
                report.note(f"nothing to tune: {warmed.nothing_to_tune}")
        else:
            report.warn(f"namespace is cold: {engine.display} tunes at start-up and saves into it")
    if options.tier_check is not None:
        _check_tier(engine, run, ns_dir, store, options.tier_check, request.force, report)
    if not report.quiet:
        for line in engine.before_serving(run, ns_dir):
            report.warn(line)
    environ = engine.environment(run, ns_dir, os.environ, warm=False)
    flock = False
    if ns_dir.is_dir():
        from fi_cache.store import locks

        # Its last serve noted, and held while the engine (which inherits the fd) runs: prune
        # leaves a served namespace alone.
        flock, _fd = locks.hold_in_use(ns_dir)
    return Handover(
        command=engine.command(run),
        environ=environ,
        display=engine.display,
        finalize=run.ns.finalize,
        ns_dir=ns_dir,
        cache_dir=engine.cache_dir(ns_dir),
        warmed=warmed,
        in_use_by_flock=flock,
    )


def _check_tier(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    ns_dir: Path,
    store: Path,
    tier_check: TierCheck,
    force: bool,
    report: Report,
) -> None:
    """The tier's tables for the config hash fi-cache knows this start uses (its saved
    prediction, looked up only when a daemon uses a tier; unknown: nothing checked): errors (a
    crash) stop the start unless --force."""
    from fi_cache.doctor.inputs import Target

    v = engine.checked_against(run)
    target = Target(run.ns.fingerprint, v.vllm, v.supports_finalize, run.ns.finalize, v.sglang)
    config_hash = functools.partial(_config_hash, engine, run, ns_dir, store)
    findings, note = tier_check(config_hash, engine.cache_dir(ns_dir), target)
    if note:
        report.warn(note)
    for f in findings:
        report.finding(f)
    if (errors := sum(f.severity == "error" for f in findings)) and not force:
        raise FiCacheError(
            f"pre-flight found {errors} error(s) in the tier this deployment's daemons adopt "
            "from; remove the key (the fix says how) or pass --force"
        )


def _config_hash(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    ns_dir: Path,
    store: Path,
) -> str | None:
    """The hash dir of the per-rank files vLLM's saved prediction names (the tier's keys)."""
    from fi_cache.versions import TIER_CONFIG_HASH, VLLM_RANK_FILE

    try:
        known = engine.seed_targets_known(run, ns_dir, store)
    except (FiCacheError, OSError):
        return None
    names = {t.parent.name for t in (known[0] if known else []) if VLLM_RANK_FILE.match(t.name)}
    name = names.pop() if len(names) == 1 else ""
    return name if TIER_CONFIG_HASH.match(name) else None


def _check_pinned(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    ns_dir: Path,
    m: Manifest,
) -> None:
    """A pinned namespace (`fi-cache pin`) is served as it is, read-only: only where the start
    writes nothing. Not even --force changes that (unpin does)."""
    from fi_cache.store import pin as pins

    if engine.serve_without_warm(run):  # a start that certainly tunes nothing writes nothing
        return
    if problem := engine.read_only_problem(run):
        raise pins.refusal(ns_dir, f"this start ({problem})")
    if not engine.is_warm(ns_dir, m, run.args, run.ns.finalize):
        raise pins.refusal(
            ns_dir, f"this start ({engine.display} would tune these arguments and save)"
        )


def pull_first(url: str, store: Path, report: Report) -> None:
    """The fleet's bundle for this machine, imported before anything is checked: a pod whose
    store starts empty at every boot, a node whose files are older than the tuning node's.
    The import keeps this node's own rank files agreeing with the bundle's (fleet/node.py). A
    failed pull leaves the store as it was, and serve goes on with what this node has."""
    from fi_cache.fleet import transfer

    try:
        moved = transfer.pull(store, url)
    except FiCacheError as exc:
        report.warn(f"pull from {url} failed: {exc}; serving with what this node has")
        return
    bm = moved.manifest
    report.note(f"pulled {len(bm.namespaces)} namespace(s), {len(bm.files)} files from {moved.url}")
    if moved.node.filled:
        names = ", ".join(p.name for p in moved.node.filled)
        report.note(f"this node's rank files kept beside the bundle's: {names}")
    for line in moved.node.warnings():
        report.warn(line)


def hand_over(handover: Handover) -> NoReturn:
    """exec the engine in this process. Raises Refused when it cannot be run."""
    cmd = handover.command
    try:
        os.execve(cmd[0], cmd, handover.environ)
    except OSError as exc:
        raise Refused(f"cannot run {handover.display}: {exc.strerror}", cmd[0]) from None


def preflight(
    engine: ServerEngine[ServedT, LauncherT],
    run: Run[ServedT, LauncherT],
    ns_dir: Path,
    force: bool,
    report: Report,
) -> Manifest | None:
    """The namespace's manifest, after doctor's pre-flight checks on its caches: errors stop the
    start unless --force; every finding is reported."""
    from fi_cache.lifecycle.checks import namespace_findings
    from fi_cache.store import manifest as manifests

    try:
        m = manifests.load(ns_dir)
    except FiCacheError as exc:
        if not force:
            raise
        report.warn(f"{exc} (going on: --force)")
        m = None
    findings = namespace_findings(engine, run, ns_dir, m)
    for f in findings:
        report.finding(f)
    errors = [f for f in findings if f.severity == "error"]
    if errors and not force:
        raise FiCacheError(f"pre-flight found {len(errors)} error(s); fix them or pass --force")
    return m


def _unwritable(path: Path) -> str | None:
    """Why nothing can be written where the namespace is (or would be created)."""
    from fi_cache.store.files import unwritable_reason

    while not path.is_dir() and path != path.parent:
        path = path.parent
    return unwritable_reason(path)
