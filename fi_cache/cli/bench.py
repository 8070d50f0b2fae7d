"""bench: re-time a cache's entries on this GPU against FlashInfer's default tactic
(fi_cache/engines/flashinfer/bench_run.py), and, with --apply, evict the ones slower than it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.cli.options import context
from fi_cache.errors import EXIT_PROBLEM, EXIT_REFUSED, Refused

if TYPE_CHECKING:
    from fi_cache.engines.flashinfer.bench_run import BenchRun
    from fi_cache.maintenance.slower import Eviction
    from fi_cache.tuning.report import EntryResult


@click.command(
    "bench",
    epilog=render.examples(
        "fi-cache bench ~/.cache/fi-cache/namespaces/0.6.18/90a/nvidia-h200/fused-*/flashinfer/"
        "autotune_configs.json",
        "fi-cache bench autotune_configs.json --plan qwen3.toml --op gemm2 --budget-ms 500",
        "fi-cache bench autotune_configs.json --plan plan.toml --apply",
    ),
)
@click.argument("cache", type=click.Path(path_type=Path, readable=False))
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path),
    default=None,
    help="TOML plan whose calls reach the entries [default: the plan of the warm that wrote "
    "CACHE, from its namespace's manifest].",
)
@click.option(
    "--op",
    "ops",
    multiple=True,
    help="Only entries whose op contains this (gemm2, bf16_gemm, ...); repeatable.",
)
@click.option(
    "--budget-ms",
    type=click.FloatRange(min=0),
    default=2000.0,
    show_default=True,
    help="Time per entry after which no more rounds start (3 rounds always run).",
)
@click.option(
    "--rounds",
    type=click.IntRange(3, 100),
    default=5,
    show_default=True,
    help="Samples per candidate (FlashInfer's profiler each time).",
)
@click.option(
    "--alternatives",
    type=click.IntRange(0, 64),
    default=3,
    show_default=True,
    help="Other tactics of the cached runner timed too, nearest ids first.",
)
@options.finalize(show_default="CACHE's namespace, else fused")
@click.option(
    "--python",
    "python",
    default=None,
    help="Python with FlashInfer [default: $FI_CACHE_PYTHON, else ours].",
)
@options.timeout(3600.0)
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Evict the entries slower than the default (evict's locks and manifest record), so "
    "FlashInfer runs its default.",
)
def bench_command(
    cache: Path,
    plan_path: Path | None,
    ops: tuple[str, ...],
    budget_ms: float,
    rounds: int,
    alternatives: int,
    finalize: str | None,
    python: str | None,
    timeout: float,
    apply_: bool,
) -> int:
    """Re-time CACHE's entries on this GPU against FlashInfer's default tactic.

    Every entry a plan's calls reach: the cached tactic, the default (runner 0, tactic -1, what
    FlashInfer runs on a miss) and the nearest other tactics, timed by FlashInfer's own profiler
    in interleaved rounds. Each entry is faster than the default, within noise, or slower (by how
    much); the summary weights the effect by the calls that look each entry up. Writes nothing
    unless --apply. Exit 1 when an entry is slower than the default and stays.
    """
    from fi_cache import environment
    from fi_cache.cli.warm_flashinfer import _TuneStatus
    from fi_cache.engines import get
    from fi_cache.engines.flashinfer import bench_run
    from fi_cache.engines.flashinfer.warm import TuneOptions, TuneProgress
    from fi_cache.lifecycle import signals
    from fi_cache.maintenance import slower
    from fi_cache.store.paths import state_dir

    ctx = context()
    bench_run.read_cache(cache)  # refused before anything starts
    recorded, ns_mode = bench_run.recorded_plan(cache, ctx.store)
    plan_path = plan_path or recorded
    if plan_path is None:
        raise Refused("give --plan PLAN: the shapes to call (no warm recorded one)", cache)
    engine = get("flashinfer")
    plan = engine.read_args([str(plan_path)]).plan
    mode = finalize or (ns_mode if ns_mode in ("fused", "unfused") else "fused")
    env = environment.detect(state_dir(ctx.store), exact=False)
    tune = TuneOptions(engine.find_executable(python), timeout, 3600.0, signals.stop_grace())
    options = bench_run.BenchOptions(tune, rounds, budget_ms, alternatives)
    status = _TuneStatus(ctx.quiet, verb="bench")
    progress = TuneProgress(status.waiting, status.call, status.note)
    run = bench_run.run_bench(ctx.store, cache, plan, mode, ops, env, options, progress)  # type: ignore[arg-type]
    status.note("timed")
    planned = slower.plan_evictions(bench_run.read_cache(cache), run.results)
    if apply_:
        slower.apply_evictions(cache, planned, ctx.store)
    stays = [e for e in planned if not (apply_ and e.keys and not e.why_not)]
    if ctx.json:
        render.emit_json(_doc(run, planned, apply_))
    else:
        _show(run, planned, apply_)
    if not any(r.verdict is not None for r in run.results):
        return EXIT_REFUSED  # nothing could be timed here
    return EXIT_PROBLEM if stays else 0


COMMANDS = [bench_command]


def _ms(r: EntryResult) -> str:
    if r.cached is None or r.default is None:
        return "-"
    return f"{r.cached.median * 1000:.1f} / {r.default.median * 1000:.1f}"


def _verdict(r: EntryResult) -> str:
    if r.verdict is None:
        return f"skipped: {r.why}"
    v = r.verdict
    text = {
        "slower": f"SLOWER than default by {v.change:.0%}",
        "faster": f"faster than default by {-v.change:.0%}",
        "noise": f"within noise ({v.change:+.1%})",
        "untimed": f"untimed: {v.why}",
    }[v.kind]
    if r.better is not None:
        text += f"; tactic {r.better.tactic} is faster ({r.better.median * 1000:.1f} us)"
    return text


def _show(run: BenchRun, planned: list[Eviction], applied: bool) -> None:
    from fi_cache.tuning.report import summary

    click.echo(
        f"{render.display_path(run.cache)} on {run.device} (FlashInfer "
        f"{run.flashinfer_version}), plan {run.plan}, {run.mode} finalize"
    )
    rows = [
        [
            r.op,
            "-" if r.bucket is None else str(r.bucket),
            r.runner,
            str(r.tactic),
            str(r.served),
            _ms(r),
            _verdict(r),
        ]
        for r in run.results
    ]
    headers = ["op", "bucket", "runner", "tactic", "served", "us cached/default", "verdict"]
    click.echo(render.table(headers, rows, right=(1, 3, 4), width=render.terminal_width()))
    for note in run.notes:
        render.warn(note)
    s = summary(run.results)
    parts = [
        f"{s.counts.get(k, 0)} {k}"
        for k in ("faster", "noise", "slower", "untimed", "skipped")
        if s.counts.get(k)
    ]
    click.echo(
        f"{s.entries} entries: "
        + ", ".join(parts)
        + f" ({s.share('slower'):.0%} slower than default)"
    )
    if s.effect is not None:
        how = "weighted by the plan's calls" if s.weighted else "each timed entry once"
        click.echo(f"expected effect of the cache against the default: {s.effect:+.1%} ({how})")
    for e in planned:
        what = f"{e.result.op} bucket {e.result.bucket} tactic {e.result.tactic}"
        if e.why_not:
            click.echo(f"kept {what}: {e.why_not}")
        elif applied:
            click.echo(f"evicted {what}: FlashInfer runs its default there now")
    if planned and not applied:
        click.echo("evict them (FlashInfer then runs its default): add --apply")
    elif applied and any(not e.why_not for e in planned):
        click.echo("keep this table as checked: fi-cache pin NAMESPACE")


def _doc(run: BenchRun, planned: list[Eviction], applied: bool) -> dict[str, Any]:
    from fi_cache.tuning.report import summary

    def cand(c: Any) -> dict[str, Any] | None:
        if c is None:
            return None
        samples = [s if s < float("inf") else None for s in c.samples]
        return {
            "runner": c.runner,
            "tactic": c.tactic,
            "median_ms": c.median if c.ok else None,
            "samples_ms": samples,
        }

    s = summary(run.results)
    return {
        "cache": str(run.cache),
        "device": run.device,
        "flashinfer_version": run.flashinfer_version,
        "plan": run.plan,
        "finalize": run.mode,
        "seconds": run.seconds,
        "entries": [
            {
                "key": r.key,
                "op": r.op,
                "bucket": r.bucket,
                "runner": r.runner,
                "tactic": r.tactic,
                "verdict": r.kind,
                "served": r.served,
                "change": r.verdict.change if r.verdict else None,
                "why": r.why or (r.verdict.why if r.verdict else ""),
                "cached": cand(r.cached),
                "default": cand(r.default),
                "better": cand(r.better),
            }
            for r in run.results
        ],
        "summary": {
            "entries": s.entries,
            "counts": s.counts,
            "slower_share": s.share("slower"),
            "effect": s.effect,
            "weighted": s.weighted,
        },
        "notes": run.notes,
        "evict": [
            {
                "key": e.result.key,
                "applied": applied and not e.why_not and bool(e.keys),
                "why_not": e.why_not,
            }
            for e in planned
        ],
    }
