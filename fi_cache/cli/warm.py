"""warm: fill this machine's namespace before traffic arrives, with vLLM or SGLang (the server
run until healthy) or, with --engine flashinfer, FlashInfer's own autotuner (warm_flashinfer.py).
The warm itself is fi_cache/lifecycle/'s; this module parses and renders."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from fi_cache.cli import options, render
from fi_cache.cli.argv import VllmCommand
from fi_cache.engines import NAMES as ENGINE_NAMES
from fi_cache.errors import Refused

if TYPE_CHECKING:  # the engines and the lifecycle load only when a command runs: --help stays fast
    from fi_cache.engines.api import Request, Run
    from fi_cache.lifecycle.warm import WarmOptions, WarmResult
    from fi_cache.store.namespace import FinalizeMode


def run_warm(engine: str, request: Request, how: WarmOptions) -> tuple[Run[Any, Any], WarmResult]:
    """A warm of a serving engine, its progress and failure on stderr."""
    from fi_cache.cli.process import reporter, say_failed_warm
    from fi_cache.engines import serving
    from fi_cache.engines.api import WarmFailed
    from fi_cache.lifecycle.warm import warm

    ctx = options.context()
    adapter = serving(engine)
    report, status = reporter(ctx.quiet)
    try:
        return warm(adapter, request, how, ctx.store, report)
    except WarmFailed as exc:
        say_failed_warm(exc, adapter.display, status)
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
@options.finalize(
    show_default="vllm: fused; sglang: the release's default; flashinfer: the plan's modes"
)
@options.timeout(None, show_default="vllm, sglang: 1800; flashinfer: 7200")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port for the warm-up server (default: a free one).",
)
@click.option(
    "--force", is_flag=True, help="Warm unfused even on a vLLM (or SGLang) that ignores the mode."
)
@options.lock_timeout()
@click.option(
    "--repeat",
    type=click.IntRange(1, 50),
    default=1,
    show_default=True,
    help="--engine flashinfer: time every tactic this many rounds and keep per bucket the one "
    "that wins robustly, else FlashInfer's default (docs/tuning.md): two fresh warms agree.",
)
@click.option(
    "--again",
    is_flag=True,
    help="Start the engine even when a warm of these arguments is recorded and its files are "
    "there (by default nothing starts).",
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
    repeat: int,
    again: bool,
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
    ctx = options.context()
    if sglang_path is not None and engine != "sglang":
        raise Refused("--sglang applies to --engine sglang only")
    if engine == "sglang" and (plan_path, python, vllm_path) != (None, None, None):
        raise Refused("--plan, --python and --vllm do not apply to --engine sglang")
    if engine == "flashinfer":
        misplaced = [
            flag
            for flag, given in (
                ("--port", port),
                ("--vllm", vllm_path),
                ("--force", force),
                ("VLLM_SERVE_ARGS", vllm_args),
            )
            if given
        ]
        if plan_path is None:
            raise Refused("--engine flashinfer needs --plan PLAN (write one with `fi-cache plan`)")
        # a recorded warm is never skipped and nothing is seeded: those would be ignored
        options.refuse_ignored("to --engine flashinfer", "again", "seed")
        if misplaced:
            got = f" (got {' '.join(vllm_args)})" if misplaced[0] == "VLLM_SERVE_ARGS" else ""
            raise Refused(f"{misplaced[0]} applies to --engine vllm only{got}")
        from fi_cache.cli.warm_flashinfer import warm_flashinfer

        limit = 7200.0 if timeout is None else timeout
        return warm_flashinfer(plan_path, finalize, python, limit, lock_timeout, repeat)
    if plan_path is not None or python is not None:
        raise Refused("--plan and --python apply to --engine flashinfer only")
    if repeat != 1:
        raise Refused("--repeat applies to --engine flashinfer only")
    from fi_cache.engines.api import Request
    from fi_cache.lifecycle.warm import WarmOptions

    asked = cast("FinalizeMode | None", finalize)  # click.Choice: fused, unfused or not given
    path = sglang_path if engine == "sglang" else vllm_path
    request = Request(
        path=path,
        argv=vllm_args,
        asked=asked,
        given=f"--finalize {finalize}",
        implied="--finalize unfused",
        force=force,
        warm=True,
    )
    warm_options = WarmOptions(
        timeout=1800.0 if timeout is None else timeout,
        port=port,
        lock_timeout=lock_timeout,
        seed=seed,
        again=again,
    )
    run, result = run_warm(engine, request, warm_options)
    if ctx.json:
        render.emit_json(_doc(engine, run, result))
        return 0
    from fi_cache.engines import serving

    who = serving(engine).display
    if result.already:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(result.record.started))
        click.echo(
            f"already warm: a warm of these arguments ({when}) is recorded and its files are "
            f"there; {who} was not started (--again to start it anyway)"
        )
    elif result.nothing_to_tune:
        click.echo(f"nothing to tune: {result.nothing_to_tune} ({who} started and stopped)")
    else:
        how = (
            "reused the warm another process just finished"
            if result.reused
            else f"warmed in {result.record.seconds:.1f}s"
        )
        entries = sum(f.entries for f in result.files)
        seeded = sum(f.seeded for f in result.files)
        from_seed = f" ({seeded} seeded from earlier files)" if seeded else ""
        kind = "rank file(s)" if engine == "sglang" else "cache file(s)"
        click.echo(f"{how}: {len(result.files)} {kind}, {entries} entries{from_seed}")
    click.echo(f"namespace {result.namespace_dir}")
    return 0


def _doc(engine: str, run: Run[Any, Any], result: WarmResult) -> dict[str, Any]:
    """What `warm --format json` prints (docs/cli.md)."""
    ns_dir = result.namespace_dir
    files = [
        {"path": str(ns_dir / f.path), "entries": f.entries, "size": f.size, "seeded": f.seeded}
        for f in result.files
    ]
    common = {
        "reused": result.reused,
        "already": result.already,
        "seconds": result.record.seconds,
    }
    if engine != "sglang":
        return {
            "namespace": str(ns_dir),
            "finalize": run.ns.finalize,
            **common,
            "vllm_version": result.record.vllm_version,
            "nothing_to_tune": result.nothing_to_tune,
            "files": files,
        }
    from fi_cache.engines import serving

    return {
        "namespace": str(ns_dir),
        "engine": "sglang",
        "finalize": run.ns.finalize,
        **common,
        "sglang_version": run.target.version,
        "sglang_cache_dir": str(serving("sglang").cache_dir(ns_dir)),
        "nothing_to_tune": result.nothing_to_tune,
        "files": files,
    }


COMMANDS = [warm_command]
