"""diff: two caches' tuning decisions side by side (fi_cache/model/diff.py); exit 1 when they
differ, so a CI job can gate on it."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM, Refused

if TYPE_CHECKING:
    from fi_cache.caches.inventory import Cache
    from fi_cache.model.diff import CacheDiff, EntryDiff, Side

_SHOWN = 40  # entries printed per op; --format json has them all


def _one(path: Path) -> Cache:
    """The one v1 cache at `path`: a file, or a dir that holds exactly one (a hash dir)."""
    from fi_cache.caches.inventory import scan

    inv = scan([path])
    if inv.problems:
        raise inv.problems[0].error()
    caches = [c for c in inv.caches if c.found.format == "v1" and not c.found.run]
    if not caches:
        what = "only a v2 store (diff reads v1 files)" if inv.caches else "no autotune cache"
        raise Refused(f"{what} here", path)
    if len(caches) > 1:
        from fi_cache.cli.show import one_of

        return one_of(caches, path)
    return caches[0]


def _side_json(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {"runner": side.runner, "tactic": side.tactic, "family": side.family}


def _entry_json(e: EntryDiff) -> dict[str, Any]:
    return {
        "change": e.change,
        "op": e.op,
        "runner": e.runner,
        "bucket": e.bucket,
        "a": _side_json(e.a),
        "b": _side_json(e.b),
        "raw_key": e.raw_key,
    }


def summary_line(d: CacheDiff, a: str, b: str) -> str:
    if not d.differs:
        return f"same: {d.same} entries, equal _metadata ({a}, {b})"
    parts = [
        f"{d.count('only-a')} only in A",
        f"{d.count('only-b')} only in B",
        f"{d.count('changed')} with another runner or tactic",
        f"{d.same} the same",
    ]
    if d.metadata:
        parts.append(f"_metadata differs in {', '.join(d.metadata)}")
    return "differ: " + "; ".join(parts)


def _tactic(side: Side | None) -> str:
    if side is None:
        return "-"
    family = f" ({side.family})" if side.family else ""
    return f"{side.tactic}{family}"


@click.command(
    "diff",
    epilog=render.examples(
        "fi-cache diff run1/autotune_configs.json run2/autotune_configs.json",
        "fi-cache diff H/autotune_configs_dp0_rank0.json H/autotune_configs_dp0_rank1.json",
        "fi-cache --format json diff a.json b.json --op fused_moe",
    ),
)
@click.argument("a", metavar="A", type=click.Path(path_type=Path, readable=False))
@click.argument("b", metavar="B", type=click.Path(path_type=Path, readable=False))
@click.option("--op", "op_filter", default=None, help="Only ops whose name contains this.")
def diff_command(a: Path, b: Path, op_filter: str | None) -> int:
    """Compare two caches: keys only in one, keys with another runner or tactic, _metadata.

    A and B are v1 files (vLLM's, SGLang's rank files, FlashInfer's own) or dirs holding one.
    Exit 0 when they agree, 1 when they differ, 2 when one cannot be read.
    """
    from fi_cache.model.diff import diff

    # Two 200,000-entry files make ~1M acyclic objects: the collector's passes over them cost
    # ~0.9 s and free nothing (refcounts do).
    gc.disable()
    try:
        return _diff(a, b, op_filter, diff)
    finally:
        gc.enable()


def _diff(a: Path, b: Path, op_filter: str | None, diff: Callable[..., CacheDiff]) -> int:
    ca, cb = _one(a), _one(b)
    d = diff(ca.file, cb.file)
    entries = [e for e in d.entries if op_filter is None or op_filter in (e.op or "")]
    code = EXIT_PROBLEM if d.differs else 0
    if options.context().json:
        render.emit_json(
            {
                "a": str(ca.path),
                "b": str(cb.path),
                "a_role": ca.role,
                "b_role": cb.role,
                "differs": d.differs,
                "same": d.same,
                "only_a": d.count("only-a"),
                "only_b": d.count("only-b"),
                "changed": d.count("changed"),
                "metadata": {f: {"a": x, "b": y} for f, (x, y) in d.metadata.items()},
                "entries": render.Rows(entries, _entry_json),
            }
        )
        return code
    click.echo(summary_line(d, render.display_path(ca.path), render.display_path(cb.path)))
    for side, cache in (("A", ca), ("B", cb)):
        if cache.role is not None:
            from fi_cache.caches.discover import ROLE_NOTES

            click.echo(f"  {side} is {ROLE_NOTES[cache.role]}")
    for field, (x, y) in d.metadata.items():
        click.echo(render.printable(f"  _metadata {field}: A {x!r}, B {y!r}"))
    groups: dict[tuple[str, str], list[EntryDiff]] = {}
    for e in entries:
        groups.setdefault((e.op or "(unparsable key)", e.runner or "?"), []).append(e)
    if any("|" in (s.family or "") for e in entries for s in (e.a, e.b) if s):
        click.echo(
            "  (family: fused's|unfused's config for that id: keys before FlashInfer "
            "0.6.18rc2 do not say the mode)"
        )
    for (op, runner), group in groups.items():
        click.echo(render.printable(f"\n{op} · {runner}  ({len(group)} differ)", lines=True))
        rows = [[e.bucket, e.change, _tactic(e.a), _tactic(e.b)] for e in group[:_SHOWN]]
        click.echo(
            render.table(
                ["BUCKET", "CHANGE", "A", "B"],
                render.printable_rows(rows),
                width=render.terminal_width(),
            )
        )
        if len(group) > _SHOWN:
            click.echo(f"  … {len(group) - _SHOWN} more (--format json lists them all)")
    return code


COMMANDS = [diff_command]
