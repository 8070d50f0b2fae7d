"""serve: pre-flight checks, a warm when the namespace is cold, then `exec vllm serve` (or `sglang
serve`) on it. What serve does is fi_cache/lifecycle/serve.py's; this module parses and renders."""

from __future__ import annotations

import marshal
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from fi_cache.cli import options, render
from fi_cache.cli.argv import VllmCommand
from fi_cache.cli.warm import SEED_OPT, SGLANG_OPT, VLLM_ARGS, VLLM_OPT
from fi_cache.errors import Refused
from fi_cache.lifecycle import serve_memo
from fi_cache.lifecycle.serve_memo import record as memo_record

if TYPE_CHECKING:
    from collections.abc import Callable

    from fi_cache.doctor.findings import Finding
    from fi_cache.lifecycle.serve import Handover
    from fi_cache.store.namespace import FinalizeMode


@click.command(
    "serve",
    cls=VllmCommand,
    epilog=render.examples(
        "fi-cache serve Qwen/Qwen3-30B-A3B --port 8000",
        "fi-cache serve --finalize unfused Qwen/Qwen3-30B-A3B -tp 2",
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
@options.finalize(show_default="vllm: fused; sglang: the release's default")
@click.option(
    "--deterministic",
    is_flag=True,
    help="Alias of --finalize unfused: its own namespace and "
    "VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0, or on vLLM releases with FlashInfer >= 0.7.4 "
    "fi-cache's vLLM plugin (torch deterministic algorithms in vLLM's processes) "
    "(SGLang: SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=0).",
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
@options.timeout(1800.0)
@options.lock_timeout()
@click.option(
    "--pull",
    "pull_url",
    metavar="URL",
    envvar="FI_CACHE_PULL",
    default=None,
    help="First import this machine's bundle from URL, as `fi-cache pull URL` (env "
    "FI_CACHE_PULL): a pod whose store starts empty serves the fleet's tuning; a failed pull "
    "is a warning.",
)
@SEED_OPT
@VLLM_OPT
@SGLANG_OPT
@VLLM_ARGS
def serve_command(
    engine: str,
    finalize: str | None,
    deterministic: bool,
    do_warm: bool,
    force: bool,
    timeout: float,
    lock_timeout: float,
    pull_url: str | None,
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
    VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 set, serve runs as with --finalize unfused
    (--deterministic).
    """
    from fi_cache.cli.process import reporter, say_failed_warm
    from fi_cache.engines import serving
    from fi_cache.engines.api import Request, WarmFailed
    from fi_cache.lifecycle.serve import ServeOptions, hand_over, serve

    ctx = options.context()
    if (memo := memo_record.recording()) is not None:
        memo.capture()
    if not do_warm:  # nothing is warmed: a warm's options would be ignored
        options.refuse_ignored("with --no-warm", "timeout", "lock_timeout", "seed")
    if deterministic and finalize == "fused":
        raise Refused("--deterministic means --finalize unfused: give one of them")
    if engine == "sglang" and vllm_path is not None:
        raise Refused("--vllm applies to --engine vllm only (SGLang's is --sglang)")
    if engine == "vllm" and sglang_path is not None:
        raise Refused("--sglang applies to --engine sglang only")
    adapter = serving(engine)
    asked = cast("FinalizeMode | None", "unfused" if deterministic else finalize)
    given = "--deterministic" if deterministic or finalize is None else f"--finalize {finalize}"
    path = sglang_path if engine == "sglang" else vllm_path
    request = Request(
        path=path, argv=vllm_args, asked=asked, given=given, implied="--deterministic", force=force
    )
    report, status = reporter(ctx.quiet)
    findings: list[object] = []
    report.finding = _counted(report.finding, findings)  # a finding is said afresh each time
    try:
        how = ServeOptions(
            warm=do_warm, timeout=timeout, seed=seed, pull=pull_url, lock_timeout=lock_timeout
        )
        if engine == "vllm":  # only vLLM's preload daemon adopts from a tier
            from fi_cache.tier import preflight as tier_preflight

            how = replace(how, tier_check=tier_preflight.check)
        handover = serve(adapter, request, how, ctx.store, report)
    except WarmFailed as exc:
        say_failed_warm(exc, adapter.display, status)
        raise
    if ctx.json:
        # One document on stdout, before the engine takes over: its log then goes to stderr (fd
        # 1 is pointed at fd 2), so `serve --format json | jq` reads only what fi-cache said.
        render.emit_json(_doc(engine, handover))
        sys.stdout.flush()
        os.dup2(2, 1)
    sys.stdout.flush()
    sys.stderr.flush()
    if memo is not None:
        _keep(memo, engine, handover, ctx.store, ctx.json, findings, pull_url)
    hand_over(handover)


def _counted(say: Callable[[Finding], None], seen: list[object]) -> Callable[[Finding], None]:
    def finding(f: Finding) -> None:
        seen.append(f)
        say(f)

    return finding


def _keep(
    memo: memo_record.Recorder,
    engine: str,
    h: Handover,
    store: Path,
    json: bool,
    findings: list[object],
    pull_url: str | None,
) -> None:
    """The memo of this serve, when it may be replayed (lifecycle/serve_memo/); a store where
    none can be written only costs the full serve again."""
    from fi_cache.errors import FiCacheError
    from fi_cache.store import files

    why = None
    if findings:
        why = "the pre-flight found something (said afresh each time)"
    elif pull_url is not None:
        why = "--pull imports first"
    elif h.ns_dir is None:
        why = f"{h.display} keeps no cache here"
    elif h.warmed is not None:
        why = "this serve warmed the namespace"
    elif os.path.realpath(memo.store) != os.path.realpath(store):
        why = "--store is given where the memo does not read it"
    else:
        doc, why = memo_record.document(
            memo,
            engine,
            h.display,
            h.command,
            h.environ,
            str(h.ns_dir),
            h.in_use_by_flock,
            stdout_to_stderr=json,
        )
        if doc is not None:
            where = Path(serve_memo.memo_dir(memo.store))
            try:
                name = memo.key + serve_memo.MEMO_SUFFIX
                files.write_private(where, name, marshal.dumps(doc))
                files.keep_newest(where, serve_memo.KEPT_MEMOS, serve_memo.MEMO_SUFFIX)
            except (FiCacheError, OSError) as exc:
                why = f"cannot write it: {exc}"
    if serve_memo.explains(memo.environ):
        render.warn(f"serve memo: {'kept' if why is None else f'not kept: {why}'}")


def _doc(engine: str, h: Handover) -> dict[str, Any]:
    """What `serve --format json` prints before it runs the engine (docs/cli.md)."""
    warm = None
    if (w := h.warmed) is not None:
        warm = {
            "reused": w.reused,
            "seconds": w.record.seconds,
            "files": [
                {"path": str(w.namespace_dir / f.path), "entries": f.entries, "size": f.size}
                for f in w.files
            ],
        }
    doc = {
        "namespace": None if h.ns_dir is None else str(h.ns_dir),
        "finalize": h.finalize,
        "cache_dir": None if h.cache_dir is None else str(h.cache_dir),
        "warm": warm,  # null: the namespace was warm already (or --no-warm)
        "command": h.command,
    }
    return doc if engine == "vllm" else {"engine": engine, **doc}


COMMANDS = [serve_command]
