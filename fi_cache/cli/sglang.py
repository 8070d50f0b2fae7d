"""warm --engine sglang / serve --engine sglang: SGLang on this machine's namespace (the commands
are warm.py and serve.py; what SGLang runs with is engines/sglang/launch.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click

from fi_cache.cli import render
from fi_cache.errors import Refused

if TYPE_CHECKING:
    from fi_cache.engines.sglang.args import SglangArgs
    from fi_cache.engines.sglang.launch import Launcher
    from fi_cache.engines.warming import WarmResult
    from fi_cache.environment import Environment
    from fi_cache.store.namespace import FinalizeMode, Namespace


def _ctx() -> Any:
    return click.get_current_context().obj


@dataclass(frozen=True)
class SglangRun:
    """One SGLang start on a namespace, as decided before it starts."""

    ns: Namespace
    env: Environment
    args: SglangArgs
    launcher: Launcher
    version: str
    nothing_to_tune: str | None  # known up front: this start keeps no cache

    @property
    def keeps_cache(self) -> bool:
        """False for a release that keeps none (before 0.5.12): nothing to namespace."""
        from fi_cache.versions import SGLANG_PERSISTENT_CACHE, parse_version

        v = parse_version(self.version)
        return v is not None and v >= SGLANG_PERSISTENT_CACHE


def command_line(path: str | None, argv: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """(--sglang, SGLang's arguments) from a pasted `sglang serve ARGS` or `PYTHON -m
    sglang.launch_server ARGS` line: its launcher is the SGLang to run."""
    from fi_cache.cli.argv import pasted_launcher
    from fi_cache.engines.sglang.args import split_launcher
    from fi_cache.engines.sglang.launch import find_launcher

    return pasted_launcher(path, argv, split_launcher, find_launcher, "--sglang", "SGLang")


def prepare(
    sglang_path: str | None,
    argv: tuple[str, ...],
    asked: FinalizeMode | None,
    given: str,
    force: bool = False,
    warm: bool = False,
) -> SglangRun:
    """Find SGLang and its release, read its arguments, choose the finalize mode and the
    namespace; say what a user may not expect. Raises Refused, before anything is said or
    looked up when the arguments alone refuse it (`warm`: several nodes)."""
    from fi_cache import environment
    from fi_cache.engines.sglang import launch
    from fi_cache.engines.sglang.engine import ENGINE
    from fi_cache.store.namespace import Namespace
    from fi_cache.store.paths import state_dir

    ctx = _ctx()
    sglang_path, argv = command_line(sglang_path, argv)
    launcher = launch.find_launcher(sglang_path)
    args = launch.with_environment(ENGINE.read_args(argv), os.environ)
    if warm and args.nnodes > 1:
        raise Refused(
            f"SGLang with --nnodes {args.nnodes} starts only when every node does, and nodes "
            "other than rank 0 answer no /health: warm cannot run it; start `fi-cache serve "
            "--engine sglang` on every node (the first start tunes into the namespace)"
        )
    env = environment.detect(state_dir(ctx.store), python=launcher.python)
    # Only the launcher's own Python may say which SGLang it is, never fi-cache's fallback.
    mine = launcher.python is not None and os.path.abspath(env.python) == os.path.abspath(
        launcher.python
    )  # not realpath: a venv's python links to the base interpreter
    version = launch.require_version(env.sglang_version if mine else None, launcher)
    finalize, note = launch.choose_finalize(os.environ, asked, given, version, args, force)
    for line in (*env.notes, *([note] if note else []), *launch.warnings(version, args)):
        render.warn(line)  # silent under -q
    ns = Namespace(env.fingerprint, finalize)
    quiet_start = launch.nothing_to_tune(os.environ, version, args)
    return SglangRun(ns, env, args, launcher, version, quiet_start)


def say_what_moves(run: SglangRun) -> None:
    """Once, before SGLang starts: where its cache dir goes and what stays with the user."""
    from fi_cache.engines.sglang.engine import ENGINE
    from fi_cache.engines.sglang.layout import user_cache_dir
    from fi_cache.store.namespace import shared_when_undetected
    from fi_cache.versions import SGLANG_CACHE_DIR_ENV, SGLANG_DIRECT_CACHES, sglang_caches_moved

    ctx = _ctx()
    if ctx.quiet:
        return
    if shared := shared_when_undetected(run.ns):
        render.warn(shared)
    ours = ENGINE.cache_dir(run.ns.path(ctx.store))
    kept = [var for var, _ in sglang_caches_moved(run.version)]
    render.warn(
        f"{SGLANG_CACHE_DIR_ENV}={ours} for SGLang (no release moves only its autotune dir); "
        f"kept in {user_cache_dir(os.environ)}: {', '.join([*kept, *SGLANG_DIRECT_CACHES])}"
    )


def run_sglang_warm(run: SglangRun, timeout: float, port: int | None, lock_timeout: float) -> Any:
    """Warm `run`'s namespace with SGLang, progress on stderr (serve warms a cold one so)."""
    from fi_cache.cli.process import Status, keep_log, show_tail, sigterm_as_interrupt, stop_grace
    from fi_cache.engines import warming
    from fi_cache.engines.api import WarmFailed
    from fi_cache.engines.sglang import warm as warm_mod

    ctx = _ctx()
    status = Status(ctx.quiet)
    progress = warming.Progress(status.waiting, status.tick, status.note)
    options = warming.WarmOptions(
        timeout, port, lock_timeout, stop_grace(), run.nothing_to_tune
    )
    sigterm_as_interrupt()
    try:
        return warm_mod.warm(
            ctx.store, run.ns, run.args, run.launcher, run.version, options, progress
        )
    except WarmFailed as exc:
        status.note("warm failed")  # the reason is the last line, after SGLang's output
        show_tail(exc.lines, "SGLang's output")
        keep_log(ctx.store, exc.log, status.note, "SGLang")
        raise


def warm_sglang(
    sglang_path: str | None,
    argv: tuple[str, ...],
    finalize: FinalizeMode | None,
    timeout: float,
    port: int | None,
    lock_timeout: float,
    force: bool = False,
) -> int:
    """The warm command with --engine sglang."""
    ctx = _ctx()
    run = prepare(sglang_path, argv, finalize, f"--finalize {finalize}", force, warm=True)
    if not run.keeps_cache:
        from fi_cache.versions import SGLANG_PERSISTENT_CACHE

        raise Refused(
            f"SGLang {run.version} keeps no FlashInfer autotune cache (from "
            f"{SGLANG_PERSISTENT_CACHE}): nothing to warm"
        )
    say_what_moves(run)
    result: WarmResult = run_sglang_warm(run, timeout, port, lock_timeout)
    doc = _doc(run, result)
    if ctx.json:
        render.emit_json(doc)
        return 0
    if result.nothing_to_tune:
        click.echo(f"nothing to tune: {result.nothing_to_tune} (SGLang started and stopped)")
    else:
        how = (
            "reused the warm another process just finished"
            if result.reused
            else f"warmed in {result.record.seconds:.1f}s"
        )
        entries = sum(f.entries for f in result.files)
        click.echo(f"{how}: {len(result.files)} rank file(s), {entries} entries")
    click.echo(f"namespace {result.namespace_dir}")
    return 0


def _doc(run: SglangRun, result: WarmResult) -> dict[str, Any]:
    from fi_cache.engines.sglang.engine import ENGINE

    ns_dir = result.namespace_dir
    return {
        "namespace": str(ns_dir),
        "engine": "sglang",
        "finalize": run.ns.finalize,
        "reused": result.reused,
        "seconds": result.record.seconds,
        "sglang_version": run.version,
        "sglang_cache_dir": str(ENGINE.cache_dir(ns_dir)),
        "nothing_to_tune": result.nothing_to_tune,
        "files": [
            {"path": str(ns_dir / f.path), "entries": f.entries, "size": f.size}
            for f in result.files
        ],
    }


def serve_sglang(
    sglang_path: str | None,
    argv: tuple[str, ...],
    deterministic: bool,
    do_warm: bool,
    force: bool,
    timeout: float,
) -> NoReturn:
    """The serve command with --engine sglang: pre-flight, a warm when cold, then exec SGLang."""
    import signal

    from fi_cache.cli.serving import exec_engine, preflight_namespace, serve_doc, touch
    from fi_cache.engines.sglang import launch
    from fi_cache.engines.sglang.engine import ENGINE
    from fi_cache.store import locks

    ctx = _ctx()
    asked: FinalizeMode | None = "unfused" if deterministic else None
    run = prepare(sglang_path, argv, asked, "--deterministic", force)
    ns_dir = run.ns.path(ctx.store)
    cmd = run.launcher.command(run.args)
    if not run.keeps_cache:
        render.warn(f"SGLang {run.version} keeps no autotune cache: serving it as it is")
        plain = {"engine": "sglang", "namespace": None, "finalize": run.ns.finalize,
                 "cache_dir": None, "warm": None, "command": cmd}  # fmt: skip
        exec_engine(cmd, dict(os.environ), "SGLang", plain)
    say_what_moves(run)
    m = preflight_namespace(
        run.ns, ns_dir, ENGINE.autotune_dir(ns_dir), force, sglang_version=run.version
    )
    warmed = None
    if not ENGINE.is_warm(ns_dir, m, run.args, run.ns.finalize):
        if run.nothing_to_tune:
            render.warn(f"nothing to warm: {run.nothing_to_tune}; starting SGLang anyway")
        elif run.args.nnodes > 1:  # a warm would wait for the other nodes; rank >= 1: no /health
            render.warn(
                f"--nnodes {run.args.nnodes}: no warm first (every node must start together); "
                "SGLang tunes at this start and saves into the namespace"
            )
        elif do_warm:
            warmed = run_sglang_warm(run, timeout, None, 3600.0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:
            render.warn("namespace is cold: SGLang tunes at start-up and saves into it")
    touch(ns_dir)
    _say_shared(str(ENGINE.cache_dir(ns_dir)), run.args.moe_backend)
    env = launch.namespace_env(ENGINE.cache_dir(ns_dir), os.environ, run.ns.finalize, run.version)
    if ns_dir.is_dir():
        locks.hold_in_use(ns_dir)  # inherited by SGLang: prune leaves a served namespace alone
    doc = None
    if ctx.json:
        doc = {"engine": "sglang", **serve_doc(ns_dir, ENGINE.cache_dir(ns_dir), run.ns.finalize,
                                               warmed, cmd)}  # fmt: skip
    exec_engine(cmd, env, "SGLang", doc)


def _say_shared(cache_dir: str, backend: str | None) -> None:
    """A server already running on this namespace's SGLang dir and GPUs this one may use, when
    one of them runs MegaMoE (live.sharing)."""
    from fi_cache.engines.sglang import live

    if _ctx().quiet:
        return
    for e in live.sharing(live.running(), cache_dir, live.devices(os.environ), backend):
        render.warn(
            f"SGLang pid {e.pid} already serves from {cache_dir} on GPUs {e.gpus}: with "
            "flashinfer_megamoe SGLang says engines sharing GPUs must use separate "
            "SGLANG_CACHE_DIRs (`fi-cache doctor --sglang-version V` explains; give this one "
            "other GPUs)"
        )
