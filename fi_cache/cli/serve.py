"""serve: pre-flight checks, a warm when the namespace is cold, then `exec vllm serve` on it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import render
from fi_cache.cli.argv import VllmCommand
from fi_cache.cli.warm import (
    SEED_OPT,
    VLLM_ARGS,
    VLLM_OPT,
    check_finalize_support,
    finalize_mode,
    resolve,
    run_vllm_warm,
    say_what_it_means,
    vllm_command_line,
)
from fi_cache.errors import FiCacheError, Refused

if TYPE_CHECKING:
    from fi_cache.store.namespace import FinalizeMode


def _ctx() -> Any:
    return click.get_current_context().obj


@click.command(
    "serve",
    cls=VllmCommand,
    epilog=render.examples(
        "fi-cache serve Qwen/Qwen3-30B-A3B --port 8000",
        "fi-cache serve --deterministic Qwen/Qwen3-30B-A3B -tp 2",
        "fi-cache serve --no-seed -- --model Qwen/Qwen3-8B --max-model-len 8192",
    ),
)
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
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="Seconds to wait for vLLM's /health while warming.",
)
@SEED_OPT
@VLLM_OPT
@VLLM_ARGS
def serve_command(
    deterministic: bool,
    do_warm: bool,
    force: bool,
    timeout: float,
    seed: bool,
    vllm_path: str | None,
    vllm_args: tuple[str, ...],
) -> int:
    """Run `vllm serve VLLM_SERVE_ARGS` on this machine's namespace, warmed first when cold.

    fi-cache's options come first; from the first word that is not one of them (or `--`) on,
    everything is vLLM's, as on a `vllm serve` line (a pasted `vllm serve ...` or `python -m
    vllm.entrypoints.openai.api_server ...` line runs that vLLM). With
    VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 set, serve runs as with --deterministic.
    """
    from fi_cache.doctor import preflight
    from fi_cache.engines import get
    from fi_cache.engines.vllm import launch
    from fi_cache.store import locks
    from fi_cache.store import manifest as manifests

    ctx = _ctx()
    vllm_path, vllm_args = vllm_command_line(vllm_path, vllm_args)
    asked: FinalizeMode | None = "unfused" if deterministic else None
    finalize = finalize_mode(asked, "--deterministic", "--deterministic")
    ns, env = resolve(finalize, vllm_path)
    check_finalize_support(env, finalize, force, "serve")
    say_what_it_means(ns)
    engine = get("vllm")
    args = engine.read_args(vllm_args)
    launcher = launch.find_launcher(vllm_path)
    ns_dir = ns.path(ctx.store)
    try:
        m = manifests.load(ns_dir)
    except FiCacheError as exc:
        if not force:
            raise
        render.warn(f"{exc} (going on: --force)")
        m = None
    findings = preflight.check_namespace(
        ns, ns_dir, engine.cache_dir(ns_dir), m, env.vllm.version, env.vllm.supports_finalize_env
    )
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        say = render.error if f.severity == "error" else render.warn  # -q keeps the errors
        say(f"{f.severity} {f.check}: {f.path}: {f.message}\n    fix: {f.fix}")
    if errors and not force:
        raise FiCacheError(f"pre-flight found {len(errors)} error(s); fix them or pass --force")
    if _unwritable(ns_dir):
        from fi_cache.engines.vllm.layout import read_only_problem

        if (problem := read_only_problem(env.vllm.version, args)) and not force:
            raise Refused(f"{problem} (or pass --force)", str(ns_dir))
        if problem:
            render.warn(f"{problem} (going on: --force)")
    warmed = None
    if not engine.is_warm(ns_dir, m, args, finalize):
        if do_warm:
            warmed = run_vllm_warm(ns, env, vllm_args, vllm_path, timeout, None, seed=seed)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        elif not ctx.quiet:
            render.warn("namespace is cold: vLLM tunes at start-up and saves into it")
    _touch(ns_dir)
    if ns_dir.is_dir():
        locks.hold_in_use(ns_dir)  # inherited by vLLM: prune leaves a served namespace alone
    launch_env = launch.launch_env(
        dict(os.environ), engine.cache_dir(ns_dir), finalize, args.uses_ray,
        env.vllm.supports_finalize_env,
    )  # fmt: skip
    cmd = launcher.command(vllm_args)
    if ctx.json:
        # One document on stdout, before vLLM takes over: its log then goes to stderr (fd 1 is
        # pointed at fd 2), so `serve --format json | jq` reads only what fi-cache said.
        render.emit_json(_serve_doc(ns_dir, engine.cache_dir(ns_dir), finalize, warmed, cmd))
        sys.stdout.flush()
        os.dup2(2, 1)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: vLLM takes over this process, so signals reach it directly and its exit code is ours.
    try:
        os.execve(cmd[0], cmd, launch_env)
    except OSError as exc:
        raise Refused(f"cannot run vLLM: {exc.strerror}", launcher.executable) from None


def _serve_doc(
    ns_dir: Path, cache_dir: Path, finalize: str, warmed: Any, cmd: list[str]
) -> dict[str, Any]:
    """What `serve --format json` prints before it runs vLLM."""
    warm = None
    if warmed is not None:
        warm = {
            "reused": warmed.reused,
            "seconds": warmed.record.seconds,
            "files": [
                {"path": str(warmed.namespace_dir / f.path), "entries": f.entries, "size": f.size}
                for f in warmed.files
            ],
        }
    return {
        "namespace": str(ns_dir),
        "finalize": finalize,
        "cache_dir": str(cache_dir),
        "warm": warm,  # null: the namespace was warm already (or --no-warm)
        "command": cmd,
    }


def _unwritable(path: Path) -> str | None:
    """Why nothing can be written where the namespace is (or would be created)."""
    from fi_cache.store.files import unwritable_reason

    while not path.is_dir() and path != path.parent:
        path = path.parent
    return unwritable_reason(path)


def _touch(ns_dir: Path) -> None:
    """Record last use; a read-only or busy store just skips it."""
    from fi_cache.store import locks
    from fi_cache.store import manifest as manifests

    try:
        with locks.namespace_lock(ns_dir, "serve", timeout=2):
            m = manifests.load(ns_dir)
            if m is not None:
                manifests.save(ns_dir, m.used(time.time()))
    except (FiCacheError, OSError):
        pass


COMMANDS = [serve_command]
