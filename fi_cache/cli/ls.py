"""ls: every cache in the store and under the given paths, one row each."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import Refused

if TYPE_CHECKING:  # `fi-cache --help` loads every command module: keep them light
    from fi_cache.caches.discover import ScanProblem
    from fi_cache.caches.inventory import Cache, Inventory

_PATHS = click.argument("paths", nargs=-1, type=click.Path(path_type=Path, readable=False))


def _store_roots(store: Path) -> list[Path]:
    """The store, and when they exist FlashInfer's own v2 root (where vLLM 0.33 with one rank
    and no override dir keeps its cache), vLLM's default cache root (every other vLLM without
    an override dir; doctor reads it too) and SGLang's autotune dir ($SGLANG_CACHE_DIR)."""
    from fi_cache.caches.discover import flashinfer_default_root
    from fi_cache.engines.sglang.layout import autotune_root as sglang_autotune_root
    from fi_cache.engines.vllm.layout import vllm_cache_root
    from fi_cache.model import v2
    from fi_cache.store.namespace import NAMESPACES_DIR
    from fi_cache.versions import VLLM_CACHE_SUBDIR

    roots = [
        store / NAMESPACES_DIR,
        flashinfer_default_root(os.environ) / v2.SCHEMA_DIR,
        Path(vllm_cache_root(os.environ)) / VLLM_CACHE_SUBDIR,
        sglang_autotune_root(os.environ),
    ]
    return [r for r in roots if r.is_dir()]


def _scan(paths: tuple[Path, ...], include_store: bool) -> Inventory:
    from fi_cache.caches.inventory import Inventory, scan

    store = options.context().store
    inv = scan(_store_roots(store), explicit=False) if include_store else Inventory()
    extra = scan(paths)
    seen = {c.path.resolve() for c in inv.caches}  # a PATH inside the store: list it once
    inv.caches.extend(c for c in extra.caches if c.path.resolve() not in seen)
    inv.problems.extend(extra.problems)
    inv.empty.extend(extra.empty)
    return inv


def summary(cache: Cache, store: Path) -> dict[str, Any]:
    """One `ls` row as the contract's JSON (plus `layout`, `rank`, `namespace`)."""
    from fi_cache.store.namespace import FINALIZE_MODES, namespace_parts

    cf = cache.file
    ns = namespace_parts(cache.path, store)
    arch = cache.found.arch or (ns["arch"] if ns and ns["arch"] != "unknown" else None)
    finalize = cache.finalize()
    if finalize == "unknown" and ns and ns["finalize"] in FINALIZE_MODES:
        finalize = ns["finalize"]  # keys cannot say (<= 0.6.17); the namespace can
    return {
        "path": str(cache.path),
        "format": cache.found.format,
        "flashinfer_version": cache.flashinfer_version,
        "gpu": cache.fingerprint.gpu,  # a string or null, whatever the file holds
        "arch": arch,
        "entries": len(cf.entries),
        "size": cache.size,
        "ops": cf.ops(),
        "finalize": finalize,
        "modified": render.iso_time(cache.modified),
        "layout": cache.found.layout,
        "rank": list(cache.found.rank) if cache.found.rank else None,
        "namespace": ns["dir"] if ns else None,
        # SGLang: the deployment hash dir, the megamoe GPU, the runs/ stamp (write-only copies)
        "key_dir": cache.found.key_dir,
        "gpu_uuid": cache.found.gpu_uuid,
        "run": cache.found.run,
        # a side file, not the engine's own tune: FlashInfer's dump, vLLM 0.32+'s sparse MLA
        "role": cache.role,
    }


def _pinned(namespaces: set[str]) -> set[str]:
    """The namespace dirs among `namespaces` that `fi-cache pin` pinned."""
    if not namespaces:
        return set()
    from fi_cache.store.pin import pinned

    return {ns for ns in namespaces if pinned(Path(ns)) is not None}


def _problem_json(p: ScanProblem) -> dict[str, str]:
    return {"path": str(p.path), "check": p.check, "message": p.message}


@click.command(
    "ls",
    epilog=render.examples(
        "fi-cache ls",
        "fi-cache ls -l ~/.cache/vllm/flashinfer_autotune_cache",
        "fi-cache ls --paths --no-store /shared/caches",
    ),
)
@_PATHS
@click.option(
    "--no-store",
    is_flag=True,
    help="Only the given paths: not the store, FlashInfer's root or vLLM's default cache dir.",
)
@click.option("-l", "--long", "long_", is_flag=True, help="Add size, modified time and ops.")
@click.option("--paths", "paths_only", is_flag=True, help="Print only paths, one per line.")
def ls_command(paths: tuple[Path, ...], no_store: bool, long_: bool, paths_only: bool) -> int:
    """List caches in the store, FlashInfer's v2 root, vLLM's default cache dir
    ($VLLM_CACHE_ROOT/flashinfer_autotune_cache) and PATHS (files, vLLM roots, v2 stores)."""
    from fi_cache.tier.keys import split_args

    if paths_only:  # one path a line has no room for -l's columns, and JSON has every field
        if long_:
            raise Refused("--paths and -l/--long exclude each other: --paths prints only paths")
        options.refuse_under_json("paths_only", "caches[].path are the paths")
    if tier_args := split_args(paths)[0]:  # mooncake://KEY: vLLM 0.34's fleet tier
        from fi_cache.cli import tier

        return tier.ls(tier_args, long_, paths_only)
    ctx = options.context()
    inv = _scan(paths, include_store=not no_store)
    rows = [summary(c, ctx.store) for c in inv.caches]
    pinned = _pinned({r["namespace"] for r in rows if r["namespace"]})
    for r in rows:
        r["pinned"] = r["namespace"] in pinned
    code = render.report_scan_problems(inv)
    if ctx.json:
        render.emit_json({"caches": rows, "problems": [_problem_json(p) for p in inv.problems]})
        return code
    if paths_only:
        for r in rows:
            click.echo(r["path"])
        return code
    if not rows:
        if not ctx.quiet and not inv.problems and not inv.empty:
            render.warn(f"no caches in the store ({ctx.store}); pass paths to look elsewhere")
        return code
    # Columns before PATH fit 80 characters; -l adds size, time and ops. PATH is whole (never cut
    # to the terminal: it is what gets pasted). Store caches come first, one group per namespace.
    headers = [*render.CACHE_HEADERS, *(["SIZE", "MODIFIED", "PATH"] if long_ else ["PATH"])]
    groups: dict[str | None, list[list[str]]] = {}
    for r in sorted(rows, key=lambda r: (r["namespace"] is None, r["namespace"] or "", r["path"])):
        row = render.cache_cells(r)
        if long_:
            row += [render.human_size(r["size"]), r["modified"][:16].replace("T", " ")]
        groups.setdefault(r["namespace"], []).append([*row, render.display_path(r["path"])])
    right = (3, 5) if long_ else (3,)
    for i, (ns_dir, table_rows) in enumerate(groups.items()):
        if ns_dir is not None or len(groups) > 1:
            title = f"namespace {render.display_path(Path(ns_dir))}" if ns_dir else "other caches"
            title += "  (pinned: no start may change it)" if ns_dir in pinned else ""
            click.echo(("\n" if i else "") + title)
        click.echo(render.table(headers, table_rows, right=right))
    if long_:
        click.echo()
        for r in rows:
            click.echo(f"{render.display_path(Path(r['path']))}: {', '.join(r['ops']) or '-'}")
    _say_roles(rows)
    return code


def _say_roles(rows: list[dict[str, Any]]) -> None:
    """One line under the table for each side file: what it is, and who reads it."""
    from fi_cache.caches.discover import ROLE_NOTES

    side = [r for r in rows if r["role"]]
    if side:
        click.echo()
    for r in side:
        click.echo(f"{render.display_path(Path(r['path']))}: {ROLE_NOTES[r['role']]}")


COMMANDS = [ls_command]
