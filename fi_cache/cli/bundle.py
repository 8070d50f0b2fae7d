"""export / import: ship namespaces between machines as verified bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import Refused

# --force on import and pull: past the one refusal they name (another environment's bundle);
# --allow-foreign says which.
FORCE_FOREIGN = click.option(
    "--force",
    "--allow-foreign",
    "force",
    is_flag=True,
    help="Import a bundle made for another environment (--allow-foreign: the same).",
)


def store_namespaces(store: Path) -> list[Path]:
    """Every namespace dir of the store that has a manifest."""
    from fi_cache.store.manifest import MANIFEST_NAME
    from fi_cache.store.namespace import NAMESPACES_DIR

    root = store / NAMESPACES_DIR
    return sorted(p.parent for p in root.glob(f"*/*/*/*/{MANIFEST_NAME}")) if root.is_dir() else []


def resolve_namespaces(store: Path, which: str | None) -> list[Path]:
    """None: the whole store; fused/unfused/here: this machine's; else a namespace dir."""
    from fi_cache import environment
    from fi_cache.store.namespace import FINALIZE_MODES, NAMESPACES_DIR, Namespace
    from fi_cache.store.paths import state_dir

    everything = store_namespaces(store)
    if which is None:
        return everything
    if which in ("fused", "unfused", "here"):
        fp = environment.detect(state_dir(store)).fingerprint
        modes = FINALIZE_MODES if which == "here" else (which,)
        wanted = {Namespace(fp, m).path(store) for m in modes}  # type: ignore[arg-type]
        return [p for p in everything if p in wanted]
    known = {p.resolve() for p in everything}
    for candidate in (Path(which), store / which, store / NAMESPACES_DIR / which):
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            continue  # no namespace: a loop leads nowhere
        if resolved in known:
            return [resolved]
    raise Refused(f"no namespace {which!r} in the store (see `fi-cache ls`)", store)


def echo_bundle(
    verb: str, bm: Any, where: str, bundle_size: int | None = None, list_namespaces: bool = False
) -> None:
    """The one line export, import, push and pull print about what they moved."""
    packed = f", bundle {render.human_size(bundle_size)}" if bundle_size is not None else ""
    click.echo(
        f"{verb} {len(bm.namespaces)} namespace(s), {len(bm.files)} files "
        f"({render.human_size(bm.size)}{packed}) {where}"
    )
    for n in bm.namespaces if list_namespaces else ():
        click.echo(f"  {n.path}")


def _summary(bm: Any) -> dict[str, Any]:
    return {"namespaces": [n.path for n in bm.namespaces], "files": len(bm.files), "size": bm.size}


def node_summary(node: Any) -> dict[str, Any]:
    return {"filled": [str(p) for p in node.filled], "refused": list(node.refused)}


def echo_node(node: Any) -> None:
    """What an import did for this node's own rank files (fleet/node.py)."""
    if node.filled:
        names = ", ".join(p.name for p in node.filled[:4])
        more = f" and {len(node.filled) - 4} more" if len(node.filled) > 4 else ""
        click.echo(
            f"kept this node's rank files the bundle lacks: {len(node.filled)} written as the "
            f"union of the bundle's ranks ({names}{more})"
        )
    for line in node.warnings():
        render.warn(line)


@click.command(
    "export",
    epilog=render.examples(
        "fi-cache export here -o h200.tar.gz",
        "fi-cache export -o whole-store.tar.gz",
    ),
)
@click.argument("namespace", required=False)
@options.namespace_option(show_default="every namespace of the store")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, readable=False),
    required=True,
    help="The bundle to write (tar.gz).",
)
def export_command(namespace: str | None, namespace_opt: str | None, output: Path) -> int:
    """Bundle NAMESPACE (a dir, or fused/unfused/here for this machine's; default: all).

    NAMESPACE may be given as --namespace too, as for push, pin and unpin."""
    from fi_cache.fleet import bundle
    from fi_cache.store import files

    ctx = options.context()
    which = options.one_namespace(namespace, namespace_opt)
    files.refuse_destination(output, "bundle file", parent_must_exist=True)  # as the user named it
    dirs = resolve_namespaces(ctx.store, which)
    bm = bundle.export(ctx.store, dirs, files.through_links(output))
    if ctx.json:
        render.emit_json({"bundle": str(output), **_summary(bm)})
    else:
        echo_bundle("exported", bm, f"to {output}")
    return 0


@click.command(
    "import",
    epilog=render.examples(
        "fi-cache import h200.tar.gz",
        "fi-cache --format json import h200.tar.gz",
    ),
)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=Path, readable=False))
@FORCE_FOREIGN
@options.dry_run()
def import_command(bundle_path: Path, force: bool, dry_run: bool) -> int:
    """Verify BUNDLE completely, then install its namespaces into the store.

    --dry-run checks the bundle as the import would (in a temp dir outside the store) and says
    which namespaces it would install or replace; the store is not touched, no lock taken."""
    from fi_cache import environment
    from fi_cache.fleet import bundle
    from fi_cache.store.paths import state_dir

    ctx = options.context()
    with bundle.open_bundle(bundle_path) as opened:  # bad input is refused before any probing
        here = environment.detect(state_dir(ctx.store)).fingerprint
        if dry_run:
            planned = bundle.plan_install(ctx.store, opened, here, force)
            echo_planned(
                opened.manifest, planned, f"from {bundle_path}", {"bundle": str(bundle_path)}
            )
            return 0
        installed = bundle.install_bundle(ctx.store, opened, here, force)
    bm = installed.manifest
    if ctx.json:
        node = node_summary(installed.node)
        render.emit_json(
            {"bundle": str(bundle_path), **_summary(bm), "node_ranks": node, "dry_run": False}
        )
    else:
        echo_bundle("imported", bm, f"from {bundle_path}", list_namespaces=True)
        echo_node(installed.node)
    return 0


def echo_planned(bm: Any, planned: Any, where: str, head: dict[str, Any]) -> None:
    """What import/pull --dry-run would install (one line each namespace), or its JSON."""
    if options.context().json:
        rows = [{"path": n.path, "replaces": n.replaces} for n in planned]
        render.emit_json(
            {**head, **_summary(bm), "node_ranks": None, "dry_run": True, "planned": rows}
        )
        return
    echo_bundle("would import", bm, where)
    for n in planned:
        how = "replacing the one there (it would go to .trash/)" if n.replaces else "new"
        click.echo(f"  {n.path}: {how}")


COMMANDS = [export_command, import_command]
