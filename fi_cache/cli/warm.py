"""warm: fill this machine's namespace before traffic arrives, with vLLM (`vllm serve` until
healthy) or, with --engine flashinfer, FlashInfer's own autotuner (warm_flashinfer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from fi_cache.cli import render
from fi_cache.cli.argv import VllmCommand
from fi_cache.cli.process import Status, keep_log, show_tail, sigterm_as_interrupt, stop_grace
from fi_cache.cli.seeding import seeder
from fi_cache.engines import NAMES as ENGINE_NAMES
from fi_cache.errors import Refused

if TYPE_CHECKING:  # environment probing loads only when a command needs it: --help stays fast
    from fi_cache.environment import Environment
    from fi_cache.store.namespace import FinalizeMode, Namespace


def _ctx() -> Any:
    return click.get_current_context().obj


def resolve(finalize: FinalizeMode, vllm_path: str | None) -> tuple[Namespace, Environment]:
    """(Namespace, Environment) of this machine for `finalize`, from the packages of the
    interpreter that runs the vLLM fi-cache launches."""
    from fi_cache import environment
    from fi_cache.engines.vllm.launch import vllm_python
    from fi_cache.store.namespace import Namespace
    from fi_cache.store.paths import state_dir

    env = environment.detect(state_dir(_ctx().store), python=vllm_python(vllm_path))
    for note in env.notes:
        render.warn(note)
    return Namespace(env.fingerprint, finalize), env


def finalize_mode(asked: FinalizeMode | None, given: str, implied: str) -> FinalizeMode:
    """The mode the command line asks for (`given`: how), else the user's
    VLLM_FLASHINFER_MOE_FUSED_FINALIZE, said on stderr (`implied`: the flag it stands for)."""
    import os

    from fi_cache.engines.vllm.launch import user_finalize

    mode, note = user_finalize(os.environ, asked, given, implied)
    if note:  # render.warn is silent under -q
        render.warn(note)
    return mode


def say_what_it_means(ns: Namespace) -> None:
    """Before vLLM starts, what a user may not expect: a namespace named by undetected fields
    (shared with every machine whose detection fails alike), and their own
    VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR giving way to the namespace's."""
    import os

    from fi_cache.engines import get
    from fi_cache.store.namespace import shared_when_undetected
    from fi_cache.versions import VLLM_CACHE_DIR_ENV

    ctx = _ctx()
    if ctx.quiet:
        return
    if shared := shared_when_undetected(ns):
        render.warn(shared)
    ours = str(get("vllm").cache_dir(ns.path(ctx.store)))
    theirs = os.environ.get(VLLM_CACHE_DIR_ENV)
    if theirs and os.path.abspath(os.path.expanduser(theirs)) != ours:
        render.warn(f"{VLLM_CACHE_DIR_ENV}={theirs} in the environment: vLLM gets {ours} instead")


def vllm_command_line(
    vllm_path: str | None, argv: tuple[str, ...]
) -> tuple[str | None, tuple[str, ...]]:
    """(--vllm, vLLM's arguments) from a pasted `vllm serve ARGS` or `PYTHON -m
    vllm.entrypoints.openai.api_server ARGS` line: its launcher is the vLLM to run."""
    from fi_cache.cli.argv import pasted_launcher
    from fi_cache.engines.vllm.args import split_launcher
    from fi_cache.engines.vllm.launch import find_launcher

    return pasted_launcher(vllm_path, argv, split_launcher, find_launcher, "--vllm", "vLLM")


def _said(what: str) -> bool:
    """True when this command said `what` already (serve warms, then serves: say it once)."""
    meta = click.get_current_context().find_root().meta
    said = bool(meta.get(f"fi-cache.said.{what}"))
    meta[f"fi-cache.said.{what}"] = True
    return said


def check_finalize_support(env: Any, finalize: str, force: bool, what: str) -> None:
    """Refuse the unfused path on a vLLM that would silently ignore it."""
    from fi_cache.engines.vllm.launch import ALTERNATIVES
    from fi_cache.versions import VLLM_FINALIZE_ENV

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
    elif info.supports_finalize_env is None and not _said("uninspected"):
        render.warn(
            f"cannot inspect the vLLM package from here; make sure it supports {VLLM_FINALIZE_ENV}"
            ", or the unfused namespace gets fused tactics"
        )


def run_vllm_warm(
    ns: Namespace,
    env: Environment,
    argv: tuple[str, ...],
    vllm_path: str | None,
    timeout: float,
    port: int | None,
    lock_timeout: float = 3600.0,
    seed: bool = True,
) -> Any:
    """Warm `ns` with `vllm serve ARGV`, progress on stderr (serve warms a cold namespace so)."""
    from fi_cache.engines import get, warming
    from fi_cache.engines.api import WarmFailed
    from fi_cache.engines.vllm import launch
    from fi_cache.engines.vllm import warm as warm_mod

    ctx = _ctx()
    engine = get("vllm")
    args = engine.read_args(argv)
    launcher = launch.find_launcher(vllm_path)
    status = Status(ctx.quiet)
    progress = warming.Progress(status.waiting, status.tick, status.note)
    quiet_start = warm_mod.nothing_to_tune(env, args)
    before = seeder(ctx.store, ns, env, argv, args, status.note) if seed else None
    options = warming.WarmOptions(
        timeout, port, lock_timeout, stop_grace(), quiet_start, before_start=before
    )
    sigterm_as_interrupt()
    try:
        return warm_mod.warm(ctx.store, ns, args, launcher, env.vllm, options, progress)
    except WarmFailed as exc:
        status.note("warm failed")  # the reason is the last line, after vLLM's output
        show_tail(exc.lines, "vLLM's output")
        keep_log(ctx.store, exc.log, status.note)
        raise


VLLM_ARGS = click.argument(
    "vllm_args", nargs=-1, type=click.UNPROCESSED, metavar="[--] VLLM_SERVE_ARGS..."
)
VLLM_OPT = click.option(
    "--vllm",
    "vllm_path",
    default=None,
    help="vLLM to run: its executable, or a Python (runs -m vllm.entrypoints.openai.api_server) "
    "(default: $FI_CACHE_VLLM, else `vllm` on PATH).",
)


SGLANG_OPT = click.option(
    "--sglang",
    "sglang_path",
    default=None,
    help="SGLang to run (--engine sglang): its executable, or a Python (runs -m "
    "sglang.launch_server) (default: $FI_CACHE_SGLANG, else `sglang` on PATH).",
)


SEED_OPT = click.option(
    "--seed/--no-seed",
    "seed",
    default=True,
    show_default=True,
    help="Fill the file vLLM will read from this namespace's earlier files for the same model.",
)


@click.command(
    "warm",
    cls=VllmCommand,
    epilog=render.examples(
        "fi-cache warm Qwen/Qwen3-30B-A3B -tp 2",
        "fi-cache warm --engine flashinfer --plan plan.toml",
        "fi-cache warm --engine sglang --model-path Qwen/Qwen3-30B-A3B --tp-size 2",
    ),
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_NAMES),
    default="vllm",
    show_default=True,
    help="vllm / sglang: run `vllm serve` / `sglang serve` until healthy; flashinfer: tune a "
    "--plan with FlashInfer itself.",
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
    help="MoE finalize mode, hence the namespace [vllm: fused; sglang: the release's default; "
    "flashinfer: the plan's modes].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to wait for vLLM's or SGLang's /health [1800], or for one mode's tuning [7200].",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port for the warm-up server (default: a free one).",
)
@click.option(
    "--force", is_flag=True, help="Warm unfused even on a vLLM (or SGLang) that ignores the mode."
)
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Seconds to wait for another warm of the same namespace.",
)
@SEED_OPT
@VLLM_OPT
@SGLANG_OPT
@VLLM_ARGS
def warm_command(
    engine: str,
    plan_path: Path | None,
    python: str | None,
    finalize: str | None,
    timeout: float | None,
    port: int | None,
    force: bool,
    lock_timeout: float,
    seed: bool,
    vllm_path: str | None,
    sglang_path: str | None,
    vllm_args: tuple[str, ...],
) -> int:
    """Fill this machine's namespace: `vllm serve VLLM_SERVE_ARGS` until healthy, or (--engine
    sglang) `sglang serve SGLANG_ARGS`, or (--engine flashinfer --plan PLAN) FlashInfer's
    autotuner on the plan's ops, without a serving engine or weights.

    fi-cache's options come first; from the first word that is not one of them (or `--`) on,
    everything is vLLM's, as on a `vllm serve` line (a pasted `vllm serve ...` or `python -m
    vllm.entrypoints.openai.api_server ...` line runs that vLLM). With
    VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 set, --engine vllm warms unfused.
    """
    ctx = _ctx()
    if sglang_path is not None and engine != "sglang":
        raise Refused("--sglang applies to --engine sglang only")
    if engine == "sglang":
        if plan_path is not None or python is not None or vllm_path is not None:
            raise Refused("--plan, --python and --vllm do not apply to --engine sglang")
        from fi_cache.cli.sglang import warm_sglang

        mode = cast("FinalizeMode | None", finalize)
        limit = 1800.0 if timeout is None else timeout
        return warm_sglang(sglang_path, vllm_args, mode, limit, port, lock_timeout, force)
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
            got = f" (got {' '.join(vllm_args)})" if misplaced[0] == "VLLM_SERVE_ARGS" else ""
            raise Refused(f"{misplaced[0]} applies to --engine vllm only{got}")
        from fi_cache.cli.warm_flashinfer import warm_flashinfer

        limit = 7200.0 if timeout is None else timeout
        return warm_flashinfer(plan_path, finalize, python, limit, lock_timeout)
    if plan_path is not None or python is not None:
        raise Refused("--plan and --python apply to --engine flashinfer only")
    vllm_path, vllm_args = vllm_command_line(vllm_path, vllm_args)
    asked = cast("FinalizeMode | None", finalize)  # click.Choice: fused, unfused or not given
    finalize = finalize_mode(asked, f"--finalize {finalize}", "--finalize unfused")
    timeout = 1800.0 if timeout is None else timeout
    ns, env = resolve(finalize, vllm_path)
    check_finalize_support(env, finalize, force, "tune")
    say_what_it_means(ns)
    result = run_vllm_warm(ns, env, vllm_args, vllm_path, timeout, port, lock_timeout, seed)
    entries = sum(f.entries for f in result.files)
    doc = {
        "namespace": str(result.namespace_dir),
        "finalize": finalize,
        "reused": result.reused,
        "seconds": result.record.seconds,
        "vllm_version": result.record.vllm_version,
        "nothing_to_tune": result.nothing_to_tune,
        "files": [
            {
                "path": str(result.namespace_dir / f.path), "entries": f.entries, "size": f.size,
                "seeded": f.seeded,
            }
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
        if result.nothing_to_tune:
            click.echo(f"nothing to tune: {result.nothing_to_tune} (vLLM started and stopped)")
        else:
            seeded = sum(f.seeded for f in result.files)
            from_seed = f" ({seeded} seeded from earlier files)" if seeded else ""
            click.echo(f"{how}: {len(result.files)} cache file(s), {entries} entries{from_seed}")
        click.echo(f"namespace {result.namespace_dir}")
    return 0


COMMANDS = [warm_command]
