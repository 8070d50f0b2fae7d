"""`fi-cache merge SRC... -o OUT`: join v1 files from one environment (vLLM 0.33 per-rank files)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from fi_cache.cli import options, render

if TYPE_CHECKING:  # the merge module loads only when merge runs: --help stays fast
    from fi_cache.maintenance.merge import Conflict, MergeReport, Prefer

# = fi_cache.maintenance.merge.PREFER_CHOICES (a test keeps them equal)
PREFER_CHOICES = ("first", "last")
_SHOWN = 5  # conflict lines printed; --format json has them all


def _conflict_json(c: Conflict) -> dict[str, Any]:
    return {
        "key": c.key,
        "kept": c.kept,
        "dropped": c.dropped,
        "kept_from": c.kept_from,
        "dropped_from": c.dropped_from,
    }


def report_json(report: MergeReport) -> dict[str, Any]:
    """The contract's JSON for one merge."""
    from fi_cache.maintenance.merge import finalize_conflicts

    return {
        "dry_run": report.dry_run,
        "output": str(report.output),
        "sources": report.sources,
        "entries": report.result.entries,
        "new": report.new,
        "conflicts": [_conflict_json(c) for c in report.result.conflicts],
        "generation": report.generation,
        "gemm2_finalize_conflicts": finalize_conflicts(report.result.conflicts).gemm2,
    }


def finalize_warning(report: MergeReport) -> str | None:
    """What GEMM2 conflicts on keys without a finalize mode mean, or None when there are none."""
    from fi_cache.maintenance.merge import finalize_conflicts
    from fi_cache.versions import FLASHINFER_FINALIZE_IN_KEY

    fc = finalize_conflicts(report.result.conflicts)
    if not fc.gemm2:
        return None
    what = (
        "GEMM1 entries agree and GEMM2 entries do not: the sign of files tuned in different "
        "MoE finalize modes (fused and unfused)"
        if not fc.gemm1
        else "if the files were tuned in different MoE finalize modes (fused and unfused), "
        "this is why"
    )
    return (
        f"{_count(fc.gemm2, 'conflict is a MoE GEMM2 entry', 'conflicts are MoE GEMM2 entries')} "
        f"whose keys (FlashInfer < {FLASHINFER_FINALIZE_IN_KEY}) cannot say their finalize "
        f"mode; {what}. Merged, one mode runs the other's tactic ids (`Invalid gemm2 profile "
        "id` at start-up, or another kernel): keep each mode in a cache of its own (fi-cache "
        "serve, and fi-cache serve --deterministic for unfused)"
    )


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _conflict_line(c: Conflict) -> str:
    return render.printable(  # a key's control characters go out as text, never to the terminal
        f"conflict {c.key}: kept {_compact(c.kept)} from {c.kept_from}, "
        f"dropped {_compact(c.dropped)} from {c.dropped_from}"
    )


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _summary(report: MergeReport, prefer: str) -> str:
    out = render.display_path(report.output)
    conflicts = len(report.result.conflicts)
    verb = "would merge" if report.dry_run else "merged"
    return (
        f"{verb} {_count(report.sources, 'file', 'files')} into {out}: "
        f"{_count(report.result.entries, 'entry', 'entries')} ({report.new} new), "
        f"{_count(conflicts, 'conflict', 'conflicts')} kept from {prefer}"
    )


@click.command(
    "merge",
    epilog=render.examples(
        "fi-cache merge autotune_configs_dp0_rank*.json -o autotune_configs.json",
        "fi-cache merge old.json new.json -o merged.json --prefer last",
        "fi-cache merge a.json b.json -o merged.json --dry-run",
    ),
)
@click.argument(
    "sources",
    metavar="SRC...",
    nargs=-1,
    required=True,
    type=click.Path(path_type=Path, readable=False),
)
@click.option(
    "-o",
    "--output",
    metavar="OUT",
    type=click.Path(path_type=Path, readable=False),
    required=True,
    help="File to write; when it exists, its entries are kept and merged first.",
)
@click.option(
    "--prefer",
    type=click.Choice(PREFER_CHOICES),
    default="first",
    show_default=True,
    help="Which file's tactic wins when two disagree (an existing OUT comes first).",
)
@click.option(
    "--allow-mixed-finalize",
    is_flag=True,
    help="Merge MoE GEMM2 entries that disagree in FlashInfer <= 0.6.17 keys (no finalize "
    "mode in them) anyway: only for files tuned in one finalize mode.",
)
@options.dry_run()
def merge_command(
    sources: tuple[Path, ...],
    output: Path,
    prefer: str,
    allow_mixed_finalize: bool,
    dry_run: bool,
) -> int:
    """Union of v1 cache files with equal _metadata into OUT; conflicts are reported.

    Files of FlashInfer <= 0.6.17 tuned in different MoE finalize modes (fused and unfused)
    are refused (exit 1): their keys cannot say the mode, and the union crashes or runs other
    kernels; --allow-mixed-finalize merges them anyway.
    """
    ctx = options.context()
    from fi_cache.maintenance.merge import merge_into
    from fi_cache.store.files import refuse_destination, through_links

    refuse_destination(output, "cache file", parent_must_exist=True)  # named as given
    # an OUT that is a link: its target is read first and written (the link stays)
    gc.disable()  # ~1M acyclic objects from two 200,000-entry files: its passes free nothing
    try:
        report = merge_into(
            list(sources),
            through_links(output),
            cast("Prefer", prefer),
            store=ctx.store,
            allow_mixed_finalize=allow_mixed_finalize,
            dry_run=dry_run,
        )
    finally:
        gc.enable()
    if ctx.json:
        render.emit_json(report_json(report))
        return 0
    # Conflicts are printed even with -q: each one is a tactic that was thrown away; the first
    # _SHOWN only (two 200,000-entry files: 88,754), as evict lists its keys.
    conflicts = report.result.conflicts
    lines = [_conflict_line(c) for c in conflicts[:_SHOWN]]
    if len(conflicts) > _SHOWN:
        lines.append(f"  … {len(conflicts) - _SHOWN} more (--format json lists them all)")
    if lines:
        click.echo("\n".join(lines))
    if (why := finalize_warning(report)) is not None:
        render.warn(why)
    if not ctx.quiet:
        click.echo(_summary(report, prefer))
    return 0


COMMANDS = [merge_command]
