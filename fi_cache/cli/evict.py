"""evict: drop chosen entries from v1 caches (fi_cache/maintenance/evict.py), so the next start
re-tunes only those."""

from __future__ import annotations

from pathlib import Path

import click

from fi_cache.cli import options, render


@click.command(
    "evict",
    epilog=render.examples(
        "fi-cache evict autotune_configs.json --op gemm2 --tactic 104 --dry-run",
        "fi-cache evict HASH_DIR --op fused_moe --bucket 8192",
        "fi-cache --format json evict autotune_configs.json --runner MoERunner --bucket 1",
    ),
)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False))
@click.option("--op", default=None, help="Ops whose name contains this (gemm2, fused_moe, ...).")
@click.option("--bucket", type=int, default=None, help="The tuned token count (first dimension).")
@click.option("--runner", default=None, help="Entries of this runner (the key's runner name).")
@click.option("--tactic", type=int, default=None, help="Entries that chose this tactic id.")
@options.dry_run()
def evict_command(
    paths: tuple[Path, ...],
    op: str | None,
    bucket: int | None,
    runner: str | None,
    tactic: int | None,
    dry_run: bool,
) -> int:
    """Remove the entries that match every option given from the v1 caches under PATHS.

    Each file is locked and rewritten atomically with `_generation` recomputed; FlashInfer then
    re-tunes only what went. Give a hash dir to treat every rank of a deployment alike.
    """
    from fi_cache.maintenance.evict import Selector, apply, plan
    from fi_cache.tier.keys import split_args

    if tier_args := split_args(paths)[0]:  # mooncake://KEY: remove whole tables from the tier
        from fi_cache.cli import tier

        given = (op, bucket, runner, tactic) != (None, None, None, None)
        return tier.evict(tier_args, dry_run, given)
    store = options.context().store
    selector = Selector(op, bucket, runner, tactic)
    plans = plan(paths, selector, store) if dry_run else apply(paths, selector, store)
    if options.context().json:
        render.emit_json(
            {
                "dry_run": dry_run,
                "files": [
                    {
                        "path": str(p.path),
                        "evicted": list(p.evicted),
                        "kept": p.kept,
                        "namespace": str(p.namespace) if p.namespace else None,
                        "recorded": p.recorded,
                    }
                    for p in plans
                ],
            }
        )
        return 0
    verb = "would evict" if dry_run else "evicted"
    total = sum(len(p.evicted) for p in plans)
    for p in plans:
        if p.evicted:
            click.echo(f"{render.display_path(p.path)}: {verb} {len(p.evicted)}, kept {p.kept}")
            for key in p.evicted[:5]:
                click.echo(f"  {render.printable(key)}")
            if len(p.evicted) > 5:
                click.echo(f"  … {len(p.evicted) - 5} more (--format json lists them all)")
    if total == 0:
        click.echo(f"no entry matched in {len(plans)} file(s): nothing written")
    for ns in sorted({p.namespace for p in plans if p.recorded and p.namespace}):
        render.warn(f"recorded in {render.display_path(ns / 'manifest.json')}")
    return 0


COMMANDS = [evict_command]
