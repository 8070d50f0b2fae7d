"""Maintenance commands: prune (plan first, then apply)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM, Refused

if TYPE_CHECKING:
    from fi_cache.cli import Context
    from fi_cache.maintenance.prune import Here, Outcome, Plan


def _interactive() -> bool:
    """May we ask? (Only a person at a terminal can answer.)"""
    return sys.stdin.isatty()


@click.command(
    "prune",
    epilog=render.examples(
        "fi-cache prune --older-than 30d --dry-run",
        "fi-cache prune --max-size 20GB --yes",
        "fi-cache prune --foreign",
    ),
)
@click.option(
    "--older-than",
    metavar="AGE",
    default=None,
    help="Namespaces unused for AGE (30d, 12h, 90m, 3600s, 2w): last use in the manifest, "
    "else the newest file time.",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    default=None,
    help="Evict least recently used namespaces until the rest fit in SIZE (20GB, 500MB, 1.5GiB).",
)
@click.option(
    "--foreign",
    is_flag=True,
    help="Namespaces of a FlashInfer version not installed here or of a GPU not present here.",
)
@options.dry_run()
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting.")
def prune_command(
    older_than: str | None, max_size: str | None, foreign: bool, dry_run: bool, yes: bool
) -> int:
    """Delete namespaces of the store; temp files of killed writers (older than 10 minutes) always.

    Namespaces whose lock is held (a warm running) are never touched.
    """
    from fi_cache.maintenance import prune

    obj = options.context()
    criteria = prune.Selection(
        older_than=prune.parse_duration(older_than) if older_than is not None else None,
        max_size=prune.parse_size(max_size) if max_size is not None else None,
        foreign=foreign,
    )
    here = _here(obj.store) if foreign else None
    plan = prune.plan_store(obj.store, criteria, here)
    cannot = None if plan.empty else prune.cannot_delete(obj.store)
    if plan.empty or dry_run:
        _report(plan, None, obj)
        if cannot and not obj.json:
            render.warn(f"{obj.store}: cannot delete any of this: {cannot}")
        return 0
    if cannot:  # one line, before asking: every deletion would fail the same way
        raise Refused(f"cannot delete: {cannot} (--dry-run shows what would go)", obj.store)
    shown = False
    if not yes:
        what = f"{_what(plan)} ({render.human_size(plan.bytes)})"
        if not _interactive():
            raise Refused(
                f"would delete {what} and cannot ask here: pass --yes to delete without asking, "
                "or --dry-run to see the plan"
            )
        if not obj.json:
            _render_plan(plan, obj.store)
            shown = True
        if not click.confirm(f"Delete {what}?", default=False, err=True):
            click.echo("nothing deleted", err=True)
            return EXIT_PROBLEM
    outcome = prune.apply(plan, obj.store)
    _report(plan, outcome, obj, shown)
    return EXIT_PROBLEM if outcome.failed else 0


def _here(store: Path) -> Here:
    from fi_cache import environment
    from fi_cache.maintenance import prune
    from fi_cache.store.paths import state_dir

    return prune.Here.of(environment.detect(state_dir(store)))  # plan() refuses a blank one


def _what(plan: Plan) -> str:
    parts = []
    if plan.namespaces:
        parts.append(_count(len(plan.namespaces), "namespace"))
    staging = sum(t.staging for t in plan.tmp)
    if len(plan.tmp) > staging:
        parts.append(_count(len(plan.tmp) - staging, "temp file"))
    if staging:
        parts.append(_count(staging, "staging dir"))
    if plan.trash:
        parts.append(_count(len(plan.trash), "trash entry", "trash entries"))
    return " and ".join(parts)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


# --- output ---------------------------------------------------------------------------------------


def _report(plan: Plan, outcome: Outcome | None, obj: Context, shown: bool = False) -> None:
    if obj.json:
        render.emit_json(_document(plan, outcome))
        return
    if not shown and not (outcome is not None and obj.quiet):
        _render_plan(plan, obj.store)
    if outcome is not None:
        _render_outcome(outcome, obj.store, obj.quiet)


def _document(plan: Plan, outcome: Outcome | None) -> dict[str, Any]:
    skipped = [
        {"path": str(ns.dir), "holder": ns.holder.describe() if ns.holder else None}
        for ns, _ in plan.skipped_locked
    ]
    if outcome is not None:  # locked between the plan and its turn
        skipped += [
            {"path": str(s.ns.dir), "holder": s.holder.describe() if s.holder else None}
            for s in outcome.skipped
            if s.locked
        ]
    doc: dict[str, Any] = {
        "plan": [
            {
                "path": str(ns.dir),
                "size": ns.size,
                "last_used": render.iso_time(ns.last_used),
                "reasons": reasons,
            }
            for ns, reasons in plan.namespaces
        ],
        "tmp": [str(t.path) for t in plan.tmp],
        "trash": [str(t.path) for t in plan.trash],
        "bytes": plan.bytes,
        "skipped_locked": skipped,
        "skipped_pinned": [
            {"path": str(ns.dir), "reasons": reasons} for ns, reasons in plan.skipped_pinned
        ],
        "applied": outcome is not None,
    }
    if outcome is not None:
        doc["removed"] = [str(ns.dir) for ns in outcome.removed]
        doc["freed"] = outcome.freed
        doc["skipped"] = [{"path": str(s.ns.dir), "why": s.why} for s in outcome.skipped]
        doc["failed"] = [{"path": str(p), "message": m} for p, m in outcome.failed]
    return doc


def _render_plan(plan: Plan, store: Path) -> None:
    from fi_cache.maintenance import prune

    if plan.empty:
        if not plan.selection.any:
            click.echo("no selector given (--older-than, --max-size, --foreign): temp files only")
        click.echo("nothing to prune")
        _render_locked(plan, store)
        return
    if not plan.selection.any:
        click.echo("no selector given (--older-than, --max-size, --foreign): temp files only")
    rows = [
        [
            ns.relpath(store),
            render.short_date(ns.last_used),
            render.human_size(ns.size),
            "; ".join(reasons),
        ]
        for ns, reasons in plan.namespaces
    ]
    if rows:
        width = render.terminal_width()
        click.echo(render.table(["NAMESPACE", "LAST USED", "SIZE", "REASON"], rows, (2,), width))
    now = time.time()
    for t in plan.tmp:
        age = prune.describe_age(now - t.mtime)
        click.echo(f"{t.what} {render.display_path(t.path)}  ({age} old)")
    for t in plan.trash:
        click.echo(f"trash of an interrupted prune or import {render.display_path(t.path)}")
    _render_locked(plan, store)
    click.echo(f"{_what(plan)}, {render.human_size(plan.bytes)} to free")
    if plan.selection.max_size is not None and plan.kept_bytes > plan.selection.max_size:
        render.warn(
            f"the store stays over --max-size ({render.human_size(plan.kept_bytes)} kept): "
            "locked and pinned namespaces cannot be pruned"
        )


def _render_locked(plan: Plan, store: Path) -> None:
    for ns, reasons in plan.skipped_locked:
        who = ns.holder.describe() if ns.holder else "another process"
        render.warn(f"skipped {ns.relpath(store)} ({'; '.join(reasons)}): locked for {who}")
    for ns, reasons in plan.skipped_pinned:
        render.warn(f"skipped {ns.relpath(store)} ({'; '.join(reasons)}): pinned (fi-cache unpin)")


def _render_outcome(outcome: Outcome, store: Path, quiet: bool) -> None:
    for path, message in outcome.failed:
        render.error(f"could not remove {render.display_path(path)}: {message}")
    if not quiet:
        for s in outcome.skipped:
            render.warn(f"skipped {s.ns.relpath(store)}: {s.why}")
        left = len(outcome.removed_tmp) + len(outcome.emptied_trash)
        extra = f" and {left} leftover file(s)" if left else ""
        click.echo(
            f"removed {_count(len(outcome.removed), 'namespace')}{extra}, "
            f"freed {render.human_size(outcome.freed)}"
        )


COMMANDS = [prune_command]
