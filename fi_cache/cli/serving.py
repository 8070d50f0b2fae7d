"""warm and serve: run vLLM on a namespace of its own, warmed before traffic arrives."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import render
from fi_cache.errors import FiCacheError, Refused

if TYPE_CHECKING:  # environment probing loads only when a command needs it: --help stays fast
    from fi_cache.environment import Environment
    from fi_cache.namespace import FinalizeMode, Namespace


def _ctx() -> Any:
    return click.get_current_context().obj


def _resolve(finalize: FinalizeMode) -> tuple[Namespace, Environment]:
    """(Namespace, Environment) of this machine for `finalize`."""
    from fi_cache import environment
    from fi_cache.namespace import Namespace
    from fi_cache.store import state_dir

    env = environment.detect(state_dir(_ctx().store))
    for note in env.notes:
        render.warn(note)
    return Namespace(env.fingerprint, finalize), env


def _check_finalize_support(env: Any, finalize: str, force: bool, what: str) -> None:
    """Refuse the unfused path on a vLLM that would silently ignore it."""
    from fi_cache.versions import VLLM_FINALIZE_ENV
    from fi_cache.vllm import ALTERNATIVES

    if finalize != "unfused":
        return
    info = env.vllm
    if info.supports_finalize_env is False:
        message = (
            f"vLLM {info.version} does not read {VLLM_FINALIZE_ENV} ({info.envs_path}): it would "
            f"{what} with fused (non-deterministic) finalize; {ALTERNATIVES}"
        )
        if not force:
            raise Refused(message + " (--force to go on anyway)")
        render.warn(message + " (going on: --force)")
    elif info.supports_finalize_env is None:
        render.warn(
            f"cannot inspect the vLLM package from here; make sure it supports {VLLM_FINALIZE_ENV}"
            ", or the unfused namespace gets fused tactics"
        )


class _Status:
    """Elapsed time and vLLM's last log line: one live line on a terminal, plain lines else."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last_plain = 0.0
        self.live = False

    def waiting(self, holder: Any) -> None:
        who = holder.describe() if holder else "another fi-cache process"
        self.note(f"waiting for {who}")

    def tick(self, elapsed: float, line: str) -> None:
        if self.quiet:
            return
        if self.tty:
            width = max(20, render.terminal_width_stderr() - 12)
            click.echo(f"\r\x1b[K[warm {elapsed:5.0f}s] {line[-width:]}", err=True, nl=False)
            self.live = True
        elif elapsed - self.last_plain >= 15:
            self.last_plain = elapsed
            click.echo(f"[warm {elapsed:.0f}s] {line}", err=True)

    def note(self, message: str) -> None:
        if self.live:
            click.echo(err=True)
            self.live = False
        if not self.quiet:
            click.echo(f"fi-cache: {message}", err=True)


def sigterm_as_interrupt() -> None:
    """SIGTERM (kubectl delete, systemd stop) stops a warm like Ctrl-C: vLLM is stopped too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _run_warm(
    ns: Any,
    env: Any,
    argv: tuple[str, ...],
    vllm_path: str | None,
    timeout: float,
    port: int | None,
    lock_timeout: float = 3600.0,
) -> Any:
    from fi_cache import vllm as vllm_mod
    from fi_cache import warm as warm_mod

    ctx = _ctx()
    args = vllm_mod.parse_serve_args(argv)
    vllm_mod.require_model(args)
    executable = vllm_mod.find_executable(vllm_path)
    status = _Status(ctx.quiet)
    progress = warm_mod.Progress(status.waiting, status.tick, status.note)
    try:  # seconds between SIGINT, SIGTERM and SIGKILL
        grace = max(0.0, float(os.environ.get("FI_CACHE_STOP_GRACE", "10")))
    except ValueError:
        raise Refused("FI_CACHE_STOP_GRACE must be a number of seconds") from None
    options = warm_mod.WarmOptions(timeout, port, lock_timeout, grace)
    sigterm_as_interrupt()
    try:
        return warm_mod.warm(ctx.store, ns, args, executable, env.vllm, options, progress)
    except warm_mod.WarmFailed as exc:
        status.note("warm failed")  # the reason is the last line, after vLLM's output
        if exc.lines:
            click.echo(f"--- last {len(exc.lines)} lines of vLLM's output ---", err=True)
            for line in exc.lines:
                click.echo(line, err=True)
        raise


_VLLM_ARGS = click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
_VLLM_OPT = click.option(
    "--vllm",
    "vllm_path",
    default=None,
    help="vLLM executable (default: $FI_CACHE_VLLM, else `vllm` on PATH).",
)


@click.command("warm")
@click.option(
    "--engine",
    type=click.Choice(["vllm", "flashinfer"]),
    default="vllm",
    show_default=True,
    help="vllm: run `vllm serve` until healthy; flashinfer: tune a --plan with FlashInfer itself.",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path),
    default=None,
    help="TOML plan of ops and shapes (--engine flashinfer; see `fi-cache plan`).",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Python with FlashInfer, for --engine flashinfer [default: $FI_CACHE_PYTHON, else ours].",
)
@click.option(
    "--finalize",
    type=click.Choice(["fused", "unfused"]),
    default=None,
    help="MoE finalize mode, hence the namespace [vllm: fused; flashinfer: the plan's modes].",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds to wait for vLLM's /health [1800], or for one mode's tuning [7200].",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port for the warm-up server (default: a free one).",
)
@click.option("--force", is_flag=True, help="Warm unfused even on a vLLM that ignores the mode.")
@click.option(
    "--lock-timeout",
    type=float,
    default=3600.0,
    show_default=True,
    help="Seconds to wait for another warm of the same namespace.",
)
@_VLLM_OPT
@_VLLM_ARGS
def warm_command(
    engine: str,
    plan_path: Path | None,
    python: str | None,
    finalize: str | None,
    timeout: float | None,
    port: int | None,
    force: bool,
    lock_timeout: float,
    vllm_path: str | None,
    vllm_args: tuple[str, ...],
) -> int:
    """Fill this machine's namespace: `vllm serve VLLM_ARGS` until healthy, or (--engine
    flashinfer --plan PLAN) FlashInfer's autotuner on the plan's ops, without vLLM or weights."""
    ctx = _ctx()
    if engine == "flashinfer":
        misplaced = [
            flag
            for flag, given in (("--port", port), ("--vllm", vllm_path), ("--force", force),
                                ("VLLM_SERVE_ARGS", vllm_args))
            if given
        ]  # fmt: skip
        if plan_path is None:
            raise Refused("--engine flashinfer needs --plan PLAN (write one with `fi-cache plan`)")
        if misplaced:
            raise Refused(f"{misplaced[0]} applies to --engine vllm only")
        from fi_cache.cli.tuning import warm_flashinfer

        limit = 7200.0 if timeout is None else timeout
        return warm_flashinfer(plan_path, finalize, python, limit, lock_timeout)
    if plan_path is not None or python is not None:
        raise Refused("--plan and --python apply to --engine flashinfer only")
    finalize = finalize or "fused"
    timeout = 1800.0 if timeout is None else timeout
    ns, env = _resolve("unfused" if finalize == "unfused" else "fused")
    _check_finalize_support(env, finalize, force, "tune")
    result = _run_warm(ns, env, vllm_args, vllm_path, timeout, port, lock_timeout)
    entries = sum(f.entries for f in result.files)
    doc = {
        "namespace": str(result.namespace_dir),
        "finalize": finalize,
        "reused": result.reused,
        "seconds": result.record.seconds,
        "vllm_version": result.record.vllm_version,
        "files": [
            {"path": str(result.namespace_dir / f.path), "entries": f.entries, "size": f.size}
            for f in result.files
        ],
    }
    if ctx.json:
        render.emit_json(doc)
    else:
        how = (
            "reused the warm another process just finished"
            if result.reused
            else (f"warmed in {result.record.seconds:.1f}s")
        )
        click.echo(f"{how}: {len(result.files)} cache file(s), {entries} entries")
        click.echo(f"namespace {result.namespace_dir}")
    return 0


@click.command("serve")
@click.option(
    "--deterministic",
    is_flag=True,
    help="Unfused (bit-stable) MoE finalize: its own namespace and "
    "VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0.",
)
@click.option(
    "--warm/--no-warm",
    "do_warm",
    default=True,
    show_default=True,
    help="Warm a cold namespace before serving.",
)
@click.option(
    "--force", is_flag=True, help="Serve despite pre-flight errors or an unsupported mode."
)
@click.option(
    "--timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds to wait for vLLM's /health while warming.",
)
@_VLLM_OPT
@_VLLM_ARGS
def serve_command(
    deterministic: bool,
    do_warm: bool,
    force: bool,
    timeout: float,
    vllm_path: str | None,
    vllm_args: tuple[str, ...],
) -> int:
    """Run `vllm serve VLLM_ARGS` on this machine's namespace, warmed first when cold."""
    from fi_cache import manifest as manifests
    from fi_cache import preflight, storage
    from fi_cache import vllm as vllm_mod
    from fi_cache import warm as warm_mod

    ctx = _ctx()
    finalize: FinalizeMode = "unfused" if deterministic else "fused"
    ns, env = _resolve(finalize)
    _check_finalize_support(env, finalize, force, "serve")
    args = vllm_mod.parse_serve_args(vllm_args)
    vllm_mod.require_model(args)
    executable = vllm_mod.find_executable(vllm_path)
    ns_dir = ns.path(ctx.store)
    try:
        m = manifests.load(ns_dir)
    except FiCacheError as exc:
        if not force:
            raise
        render.warn(f"{exc} (going on: --force)")
        m = None
    findings = preflight.check_namespace(
        ns, ns_dir, warm_mod.cache_dir(ns_dir), m, env.vllm.version
    )
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        render.warn(f"{f.severity} {f.check}: {f.path}: {f.message}\n    fix: {f.fix}")
    if errors and not force:
        raise FiCacheError(f"pre-flight found {len(errors)} error(s); fix them or pass --force")
    if not warm_mod.is_warm(ns_dir, m, args):
        if do_warm:
            _run_warm(ns, env, vllm_args, vllm_path, timeout, None)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        elif not ctx.quiet:
            render.warn("namespace is cold: vLLM tunes at start-up and saves into it")
    _touch(ns_dir)
    if ns_dir.is_dir():
        storage.hold_in_use(ns_dir)  # inherited by vLLM: prune leaves a served namespace alone
    launch_env = vllm_mod.launch_env(
        dict(os.environ), warm_mod.cache_dir(ns_dir), finalize, args.uses_ray
    )
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: vLLM takes over this process, so signals reach it directly and its exit code is ours.
    try:
        os.execve(executable, [executable, "serve", *vllm_args], launch_env)
    except OSError as exc:
        raise Refused(f"cannot run vLLM: {exc.strerror}", executable) from None


def _touch(ns_dir: Path) -> None:
    """Record last use; a read-only or busy store just skips it."""
    from fi_cache import manifest as manifests
    from fi_cache import storage

    try:
        with storage.namespace_lock(ns_dir, "serve", timeout=2):
            m = manifests.load(ns_dir)
            if m is not None:
                manifests.save(ns_dir, m.used(time.time()))
    except (FiCacheError, OSError):
        pass


COMMANDS = [warm_command, serve_command]
