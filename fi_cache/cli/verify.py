"""verify: integrity of cache files (JSON, keys, `_generation`, value shapes); exit 1 if corrupt."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM

if TYPE_CHECKING:  # `fi-cache --help` loads every command module: keep them light
    from fi_cache.caches.inventory import Cache
    from fi_cache.model import v1


@click.command(
    "verify",
    epilog=render.examples(
        "fi-cache verify",
        "fi-cache verify ~/.cache/vllm/flashinfer_autotune_cache",
        "fi-cache --format json verify autotune_configs.json",
    ),
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, readable=False))
def verify_command(paths: tuple[Path, ...]) -> int:
    """Check integrity: valid JSON, every key parses, `_generation` matches, value shapes.
    Without PATHS, every cache in the store."""
    from fi_cache.caches.inventory import scan
    from fi_cache.store.namespace import NAMESPACES_DIR
    from fi_cache.tier.keys import split_args

    if tier_args := split_args(paths)[0]:  # mooncake://KEY: vLLM 0.34's fleet tier
        from fi_cache.cli import tier

        return tier.verify(tier_args)
    ctx = options.context()
    if paths:
        inv = scan(paths)
    else:
        root = ctx.store / NAMESPACES_DIR
        inv = scan([root] if root.is_dir() else [], explicit=False)
        if not inv.caches and not inv.problems and not ctx.quiet and not ctx.json:
            render.warn(f"no caches in the store ({ctx.store}); pass paths to check others")
            return 0
    results: list[dict[str, Any]] = []
    code = render.report_scan_problems(inv)
    for cache in inv.caches:
        defects = list(cache.defects())
        results.append(
            {
                "path": str(cache.path),
                "format": cache.found.format,
                "ok": not defects,
                "entries": len(cache.file.entries),
                "generation": _generation_state(cache, defects),
                "problems": [{"check": d.check, "message": d.message} for d in defects],
            }
        )
        for d in defects:
            render.error(f"{cache.path}: {d.message}")
        if defects:
            code = max(code, EXIT_PROBLEM)
    for p in inv.problems:
        results.append(
            {
                "path": str(p.path),
                "format": None,
                "ok": False,
                "entries": None,
                "generation": None,
                "problems": [{"check": p.check, "message": p.message}],
            }
        )
    if ctx.json:
        render.emit_json({"results": results, "ok": code == 0})
    else:  # -q silences notes and warnings; these are the results
        for r in results:
            if r["ok"]:
                gen = {"ok": ", _generation ok", "absent": ""}.get(r["generation"], "")
                click.echo(
                    f"ok    {render.display_path(Path(r['path']))} ({r['entries']} entries{gen})"
                )
        bad = sum(1 for r in results if not r["ok"])
        click.echo(f"{len(results) - bad} ok, {bad} with problems", err=bad > 0)
    return code


def _generation_state(cache: Cache, defects: list[v1.Defect]) -> str | None:
    from fi_cache.versions import GENERATION_KEY

    if cache.found.format != "v1":
        return None
    if GENERATION_KEY not in cache.file.reserved:
        return "absent"
    return "mismatch" if any(d.check == "generation-mismatch" for d in defects) else "ok"


COMMANDS = [verify_command]
