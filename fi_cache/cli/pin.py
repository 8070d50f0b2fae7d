"""pin / unpin: a known-good namespace that no start may change (fi_cache/store/pin.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import Refused

_NAMESPACE = click.argument("namespace", required=False)


def _namespaces(positional: str | None, option: str | None) -> list[Path]:
    from fi_cache.cli.bundle import resolve_namespaces

    which = options.one_namespace(positional, option)
    if which is None:
        raise Refused("give NAMESPACE (here, fused, unfused or a namespace dir; or --namespace)")
    store = options.context().store
    found = resolve_namespaces(store, which)
    if not found:
        raise Refused(f"no namespace {which!r} of this machine in the store (see `fi-cache ls`)")
    return found


def _row(ns: Path, m: Any, changed: bool) -> dict[str, Any]:
    pin = m.pin
    return {
        "path": str(ns),
        "pinned": pin is not None,
        "changed": changed,
        "since": render.iso_time(pin.at) if pin else None,
        "files": len(pin.sha256) if pin else None,
    }


def _emit(rows: list[dict[str, Any]], dry_run: bool) -> None:
    if options.context().json:
        render.emit_json({"namespaces": rows, "dry_run": dry_run})


@click.command(
    "pin",
    epilog=render.examples(
        "fi-cache pin here",
        "fi-cache pin namespaces/0.6.18/90a/nvidia-h200/fused-0123456789ab",
        "fi-cache --format json pin unfused",
    ),
)
@_NAMESPACE
@options.namespace_option()
@options.dry_run()
def pin_command(namespace: str | None, namespace_opt: str | None, dry_run: bool) -> int:
    """Pin NAMESPACE (a namespace dir, or fused/unfused/here for this machine's): no start may
    change it.

    Its cache files and dirs lose their write bits. warm, evict, merge -o, align and import
    refuse it and prune skips it; serve runs it only where a fully warm start writes nothing
    (vLLM 0.32+, SGLang before 0.5.21) and refuses it where the engine rewrites its file at
    every start (vLLM 0.25-0.31, SGLang 0.5.21+). `fi-cache unpin` undoes it.
    """
    from fi_cache.store import pin

    rows = []
    for ns in _namespaces(namespace, namespace_opt):
        if dry_run:  # no lock, nothing written: the plan only
            m, paths = pin.plan_pin(ns)
            row = {**_row(ns, m, not m.pin), "files": sum((ns / r).is_file() for r in paths)}
        else:
            m, done = pin.pin(ns)
            row = _row(ns, m, done)
        rows.append(row)
        if not options.context().json:
            shown = render.display_path(ns)
            if row["changed"]:
                did = "would pin" if dry_run else "pinned"
                made = "be made" if dry_run else "made"
                click.echo(f"{did} {shown}: {row['files']} file(s) {made} read-only")
            else:
                click.echo(f"{shown}: pinned already, since {row['since']}")
    _emit(rows, dry_run)
    return 0


@click.command(
    "unpin",
    epilog=render.examples("fi-cache unpin here", "fi-cache --format json unpin fused"),
)
@_NAMESPACE
@options.namespace_option()
@options.dry_run()
def unpin_command(namespace: str | None, namespace_opt: str | None, dry_run: bool) -> int:
    """Unpin NAMESPACE: its files and dirs get their modes back; starts may change it again."""
    from fi_cache.store import pin

    rows = []
    for ns in _namespaces(namespace, namespace_opt):
        if dry_run:  # no lock, nothing written: the plan only
            m, _paths, skipped = pin.plan_unpin(ns)
            done = m.pin is not None
        else:
            m, done, skipped = pin.unpin(ns)
        for line in skipped:  # a tampered record: the path is never touched
            render.warn(line)
        rows.append(_row(ns, m, done))
        if not options.context().json:
            shown = render.display_path(ns)
            did = "would unpin" if dry_run else "unpinned"
            click.echo(f"{did} {shown}" if done else f"{shown}: not pinned")
    _emit(rows, dry_run)
    return 0


COMMANDS = [pin_command, unpin_command]
