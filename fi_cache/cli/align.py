"""`fi-cache align PATH...`: make a deployment's rank files agree the way its engine requires."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render

if TYPE_CHECKING:
    from fi_cache.maintenance.align import GroupPlan

_SHOWN = 20  # choices printed per group; --format json has them all


def _engine(gp: GroupPlan) -> str:
    return "vLLM" if gp.deployment.engine == "vllm" else "SGLang"


def group_json(gp: GroupPlan) -> dict[str, Any]:
    dep = gp.deployment
    return {
        "engine": dep.engine,
        "key": dep.key,
        "copies": [str(c) for c in dep.copies],
        "ranks": list(gp.ranks),
        "aligned": gp.aligned is not None,
        "problem": gp.problem,
        "entries": gp.entries,
        "writes": [{"path": str(p), "created": created} for p, created in gp.writes],
        "chosen": [_choice(c) for c in gp.chosen],
        "note": dep.note,
    }


def _choice(c: Any) -> dict[str, Any]:
    return {
        "key": c.key,
        "kept": c.kept,
        "kept_from": c.kept_from,
        "dropped": c.dropped,
        "dropped_from": c.dropped_from,
    }


def _choice_of(value: Any) -> Any:
    """Runner and tactic; anything else as it is (align refuses values verify rejects)."""
    return value[:2] if isinstance(value, list) else value


def _lines(gp: GroupPlan, dry_run: bool) -> list[str]:
    from fi_cache.ranks.deployment import rank_name

    dep = gp.deployment
    copies = dep.copies
    where = f"{len(copies)} copies" if len(copies) > 1 else render.display_path(copies[0])
    head = f"{_engine(gp)} deployment {dep.key[:16]} ({len(gp.ranks)} ranks, {where})"
    if gp.aligned is None:
        return [f"{head}: not aligned: {gp.problem}"]
    if not gp.writes:
        return [f"{head}: already aligned ({gp.entries} entries on every rank)"]
    created = sum(1 for _, c in gp.writes if c)
    verb = "would write" if dry_run else "wrote"
    out = [
        f"{head}: {verb} {len(gp.writes)} files ({created} created), {gp.entries} entries on "
        f"every rank; {len(gp.chosen)} {'key' if len(gp.chosen) == 1 else 'keys'} the ranks "
        "answered differently kept the lowest rank's"
    ]
    for c in gp.chosen[:_SHOWN]:
        kept, dropped = json.dumps(_choice_of(c.kept)), json.dumps(_choice_of(c.dropped))
        out.append(
            f"  chose {kept} from {rank_name(c.kept_from)} over {dropped} from "
            f"{rank_name(c.dropped_from)}: {c.key}"
        )
    if len(gp.chosen) > _SHOWN:
        out.append(f"  … and {len(gp.chosen) - _SHOWN} more (--format json lists them all)")
    return out


@click.command(
    "align",
    epilog=render.examples(
        "fi-cache align ~/.cache/vllm/flashinfer_autotune_cache/0.6.18/90a/<hash>",
        "fi-cache align /mnt/node0/<hash> /mnt/node1/<hash> --dry-run",
        "fi-cache align $SGLANG_CACHE_DIR/flashinfer/autotune/0.7.2/sm90/<key>",
    ),
)
@click.argument(
    "paths",
    metavar="PATH...",
    nargs=-1,
    required=True,
    type=click.Path(path_type=Path, readable=False),
)
@options.dry_run()
def align_command(paths: tuple[Path, ...], dry_run: bool) -> int:
    """Give every rank of a deployment the same file: the union of its ranks' entries.

    vLLM 0.32+ loads its cache only when every rank's file has equal _metadata and entry count,
    else every rank re-tunes; SGLang 0.5.19+ deletes all of them when its TP ranks' files
    differ. PATHs are hash dirs (several: one per node's copy; an empty one is filled). A rank
    that lacks its own MoE entries, ranks from another environment, and a rank file that
    cannot be read or that `fi-cache verify` rejects are refused (exit 1) and left as they are.
    Every file is staged before any is replaced: a full disk replaces none.
    """
    ctx = options.context()
    from fi_cache.maintenance.align import apply, plan

    if not dry_run:
        from fi_cache.store.pin import refuse_if_pinned

        for path in paths:  # early and lock-free; apply checks again under the namespace lock
            refuse_if_pinned(path, ctx.store, "align")
    plans = plan(list(paths)) if dry_run else apply(list(paths), store=ctx.store)
    failed = any(gp.aligned is None for gp in plans)
    if ctx.json:
        render.emit_json({"dry_run": dry_run, "groups": [group_json(gp) for gp in plans]})
        return 1 if failed else 0
    for note in dict.fromkeys(gp.deployment.note for gp in plans if gp.deployment.note):
        render.warn(note)  # a stray rank number: no missing rank inferred from it
    for gp in plans:
        lines = _lines(gp, dry_run)
        if gp.aligned is None:
            render.error(lines[0])
        else:
            for line in lines:
                click.echo(render.printable(line))
    return 1 if failed else 0


COMMANDS = [align_command]
