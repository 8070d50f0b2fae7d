"""coverage: which (op, bucket) pairs a plan or a start's log looks up a cache has tuned, and why
not (fi_cache/doctor/coverage.py); --min-coverage makes it a CI gate before start-up."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM, Refused

if TYPE_CHECKING:
    from fi_cache.caches.inventory import Cache
    from fi_cache.doctor.coverage import Coverage, Pair

_SHOWN = 12  # missing pairs listed per op; --format json has them all


def _cache(path: Path) -> Cache:
    """The one cache at `path` (v1 or a v2 store; a dir holding the engine's file and side
    files: the engine's)."""
    from fi_cache.caches.inventory import scan
    from fi_cache.cli.show import one_of

    inv = scan([path])
    if inv.problems:
        raise inv.problems[0].error()
    caches = [c for c in inv.caches if not c.found.run]
    if not caches:
        raise Refused("no autotune cache here", path)
    return caches[0] if len(caches) == 1 else one_of(caches, path)


def _percent(text: str | None) -> float | None:
    if text is None:
        return None
    raw = text.strip().removesuffix("%")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise Refused(f"--min-coverage {text!r}: give a percentage from 0 to 100 (95, 99.5%)")
    return value


def _modes(cache: Cache, asked: str | None, store: Path) -> tuple[str, ...]:
    """The finalize modes the MoE lookups run: --finalize, else the cache's own (its keys, or
    the store namespace it is in), else both."""
    from fi_cache.store.namespace import FINALIZE_MODES, namespace_parts

    if asked:
        return (asked,)
    if (mode := cache.finalize()) in FINALIZE_MODES:
        return (str(mode),)
    ns = namespace_parts(cache.path, store)
    if ns and ns["finalize"] in FINALIZE_MODES:
        return (ns["finalize"],)
    return FINALIZE_MODES


def _pair_json(p: Pair) -> dict[str, Any]:
    w = p.want
    return {
        "label": w.label,
        "op": w.op,
        "bucket": w.bucket,
        "mode": w.mode,
        "tuned": p.tuned,
        "fell_back": w.fell_back,
        "reason": p.reason,
        "source": w.source,
        "found": [{"runner": r, "tactic": t} for r, t in p.found],
    }


@click.command(
    "coverage",
    epilog=render.examples(
        "fi-cache coverage NS/flashinfer/autotune_configs.json --plan plan.toml",
        "fi-cache coverage HASH_DIR --plan plan.toml --finalize unfused --min-coverage 100",
        "fi-cache --format json coverage autotune_configs.json --log vllm-start.log",
    ),
)
@click.argument("cache_path", metavar="CACHE", type=click.Path(path_type=Path, readable=False))
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path, readable=False),
    help="A tuning plan: every (op, bucket) a warm of it fills.",
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path, readable=False),
    help="A start's log: the calls that fell back to tactic -1.",
)
@options.finalize(show_default="the cache's own")
@click.option(
    "--min-coverage",
    "min_coverage",
    default=None,
    metavar="P",
    help="With --plan: exit 1 when under P percent of the pairs are tuned.",
)
def coverage_command(
    cache_path: Path,
    plan_path: Path | None,
    log_path: Path | None,
    finalize: str | None,
    min_coverage: str | None,
) -> int:
    """Say which (op, bucket) pairs of a plan or a start's log CACHE has tuned, and why not.

    With --plan, each op of the plan at every bucket its tuning fills; with --log, the calls the
    log shows falling back to FlashInfer's tactic -1 (exit 1 when there is any). Reasons: the
    other finalize mode only, another dtype, the bucket or the shape never warmed, the op never
    tuned.
    """
    from fi_cache.doctor import coverage as cov

    if (plan_path is None) == (log_path is None):
        raise Refused("give one target: --plan PLAN or --log LOG")
    threshold = _percent(min_coverage)
    if threshold is not None and log_path is not None:
        raise Refused("--min-coverage needs --plan: a log shows only the calls that fell back")
    ctx = options.context()
    fell_back = 0
    if plan_path is not None:
        from fi_cache.engines import get

        plan = get("flashinfer").read_args([str(plan_path)]).plan
        cache = _cache(cache_path)
        modes = _modes(cache, finalize, ctx.store)
        wants = cov.from_plan(plan, modes)
    else:
        from fi_cache.doctor.logs import read_log

        assert log_path is not None
        facts = read_log(log_path)
        fell_back = len(facts.fallbacks)
        cache = _cache(cache_path)
        modes = (finalize,) if finalize else ()
        wants = cov.from_log(facts.fallbacks)
    result = cov.judge(cache.file, wants)
    percent = round(100 * result.ratio, 1)
    failed = (threshold is not None and percent < threshold) or fell_back > 0
    if ctx.json:
        render.emit_json(
            {
                "cache": str(cache.path),
                "plan": str(plan_path) if plan_path else None,
                "log": str(log_path) if log_path else None,
                "modes": list(modes),
                "tuned": result.tuned,
                "pairs": len(result.pairs),
                "coverage": percent,
                "min_coverage": threshold,
                "fell_back": fell_back,
                "ok": not failed,
                "entries": [_pair_json(p) for p in result.pairs],
            }
        )
        return EXIT_PROBLEM if failed else 0
    _say(result, cache, plan_path, log_path, percent, threshold)
    if fell_back > len(result.pairs) and not ctx.quiet:
        render.warn(
            f"{fell_back} fallback line(s) in all; those without input shapes (an older "
            "FlashInfer) cannot be looked up"
        )
    return EXIT_PROBLEM if failed else 0


def _say(
    result: Coverage,
    cache: Cache,
    plan_path: Path | None,
    log_path: Path | None,
    percent: float,
    threshold: float | None,
) -> None:
    where = render.display_path(cache.path)
    if log_path is not None:
        if not result.pairs:
            click.echo(f"no call fell back to tactic -1 in {render.display_path(log_path)}")
            return
        click.echo(
            f"{len(result.pairs)} (op, bucket) pair(s) in {render.display_path(log_path)} fell "
            f"back to tactic -1; against {where}:"
        )
    else:
        assert plan_path is not None
        click.echo(
            f"coverage {percent}%: {result.tuned} of {len(result.pairs)} (op, bucket) pairs of "
            f"{render.display_path(plan_path)} tuned in {where}"
        )
    groups: dict[tuple[str, str, str | None], list[Pair]] = {}
    for p in result.pairs:
        groups.setdefault((p.want.label, p.want.op, p.want.mode), []).append(p)
    for (label, op, mode), pairs in groups.items():
        tuned = sum(p.tuned for p in pairs)
        shown_mode = f" ({mode})" if mode else ""
        name = label if label == op else f"{label} · {op}"
        click.echo(
            render.printable(f"\n{name}{shown_mode}: {tuned} of {len(pairs)} tuned", lines=True)
        )
        missing = [p for p in pairs if not p.tuned]
        by_reason: dict[str, list[int]] = {}
        for p in missing:
            by_reason.setdefault(p.reason or "not tuned", []).append(p.want.bucket)
        for reason, buckets in list(by_reason.items())[:_SHOWN]:
            click.echo(render.printable(f"  bucket {', '.join(map(str, buckets))}: {reason}"))
        notes = {p.reason for p in pairs if p.tuned and p.reason}
        for note in notes:
            click.echo(render.printable(f"  note: {note}"))
    if threshold is not None and percent < threshold:
        render.error(f"coverage {percent}% is under --min-coverage {threshold:g}%")


COMMANDS = [coverage_command]
