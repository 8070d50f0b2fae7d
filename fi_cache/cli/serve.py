"""serve: pre-flight checks, a warm when the namespace is cold, then `exec vllm serve` on it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import render
from fi_cache.cli.argv import VllmCommand
from fi_cache.cli.serving import exec_engine, preflight_namespace, serve_doc, touch
from fi_cache.cli.warm import (
    SEED_OPT,
    SGLANG_OPT,
    VLLM_ARGS,
    VLLM_OPT,
    check_finalize_support,
    finalize_mode,
    resolve,
    run_vllm_warm,
    say_what_it_means,
    vllm_command_line,
)
from fi_cache.errors import Refused

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
        "fi-cache serve --engine sglang --model-path Qwen/Qwen3-30B-A3B --tp-size 2",
    ),
)
@click.option(
    "--engine",
    type=click.Choice(["vllm", "sglang"]),
    default="vllm",
    show_default=True,
    help="The server to run: `vllm serve` or `sglang serve` (SGLang 0.5.12+ keeps a cache).",
)
@click.option(
    "--deterministic",
    is_flag=True,
    help="Unfused (bit-stable) MoE finalize: its own namespace and "
    "VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 (SGLang: SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=0).",
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
    help="Seconds to wait for the engine's /health while warming.",
)
@SEED_OPT
@VLLM_OPT
@SGLANG_OPT
@VLLM_ARGS
def serve_command(
    engine: str,
    deterministic: bool,
    do_warm: bool,
    force: bool,
    timeout: float,
    seed: bool,
    vllm_path: str | None,
    sglang_path: str | None,
    vllm_args: tuple[str, ...],
) -> int:
    """Run `vllm serve VLLM_SERVE_ARGS` (--engine sglang: `sglang serve SGLANG_ARGS`) on this
    machine's namespace, warmed first when cold.

    fi-cache's options come first; from the first word that is not one of them (or `--`) on,
    everything is vLLM's, as on a `vllm serve` line (a pasted `vllm serve ...` or `python -m
    vllm.entrypoints.openai.api_server ...` line runs that vLLM). With
    VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 set, serve runs as with --deterministic.
    """
    from fi_cache.engines import get
    from fi_cache.engines.vllm import launch
    from fi_cache.store import locks

    ctx = _ctx()
    if engine == "sglang":
        if vllm_path is not None:
            raise Refused("--vllm applies to --engine vllm only (SGLang's is --sglang)")
        from fi_cache.cli.sglang import serve_sglang

        serve_sglang(sglang_path, vllm_args, deterministic, do_warm, force, timeout)
    if sglang_path is not None:
        raise Refused("--sglang applies to --engine sglang only")
    vllm_path, vllm_args = vllm_command_line(vllm_path, vllm_args)
    asked: FinalizeMode | None = "unfused" if deterministic else None
    finalize = finalize_mode(asked, "--deterministic", "--deterministic")
    ns, env = resolve(finalize, vllm_path)
    check_finalize_support(env, finalize, force, "serve")
    say_what_it_means(ns)
    vllm = get("vllm")
    args = vllm.read_args(vllm_args)
    launcher = launch.find_launcher(vllm_path)
    ns_dir = ns.path(ctx.store)
    m = preflight_namespace(
        ns, ns_dir, vllm.cache_dir(ns_dir), force, env.vllm.version,
        env.vllm.supports_finalize_env,
    )  # fmt: skip
    if _unwritable(ns_dir):
        from fi_cache.engines.vllm.layout import read_only_problem

        if (problem := read_only_problem(env.vllm.version, args)) and not force:
            raise Refused(f"{problem} (or pass --force)", str(ns_dir))
        if problem:
            render.warn(f"{problem} (going on: --force)")
    warmed = None
    if not vllm.is_warm(ns_dir, m, args, finalize):
        if do_warm:
            warmed = run_vllm_warm(ns, env, vllm_args, vllm_path, timeout, None, seed=seed)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:
            render.warn("namespace is cold: vLLM tunes at start-up and saves into it")
    touch(ns_dir)
    if ns_dir.is_dir():
        locks.hold_in_use(ns_dir)  # inherited by vLLM: prune leaves a served namespace alone
    launch_env = launch.launch_env(
        dict(os.environ), vllm.cache_dir(ns_dir), finalize, args.uses_ray,
        env.vllm.supports_finalize_env,
    )  # fmt: skip
    cmd = launcher.command(vllm_args)
    doc = None
    if ctx.json:
        doc = serve_doc(ns_dir, vllm.cache_dir(ns_dir), finalize, warmed, cmd)
    return exec_engine(cmd, launch_env, "vLLM", doc)


def _unwritable(path: Path) -> str | None:
    """Why nothing can be written where the namespace is (or would be created)."""
    from fi_cache.store.files import unwritable_reason

    while not path.is_dir() and path != path.parent:
        path = path.parent
    return unwritable_reason(path)


COMMANDS = [serve_command]
