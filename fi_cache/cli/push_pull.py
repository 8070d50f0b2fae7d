"""push / pull: move this machine's bundle to and from object storage (any fsspec URL)."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import click

from fi_cache.cli import options, render
from fi_cache.cli.bundle import FORCE_FOREIGN
from fi_cache.errors import Refused

_SHOW_FROM = 1024 * 1024  # smaller transfers finish before a progress line could help
_REDRAW_S = 0.1


class LiveProgress:
    """`(done, total)` callback: one live line on a terminal's stderr, nothing anywhere else."""

    def __init__(self, label: str, quiet: bool, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.started = time.monotonic()
        self.drawn = 0.0
        self.live = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < _SHOW_FROM:
            return
        now = time.monotonic()
        if done < total and now - self.drawn < _REDRAW_S:
            return
        self.drawn = now
        rate = done / max(now - self.started, 1e-6)
        line = (
            f"{self.label} {render.human_size(done)} / {render.human_size(total)} "
            f"({100 * done // max(total, 1)}%, {render.human_size(int(rate))}/s)"
        )
        click.echo(f"\r\x1b[K{line}", file=self.stream, nl=False)
        self.live = True

    def finish(self) -> None:
        if self.live:
            click.echo(file=self.stream)
            self.live = False


def _summary(moved: Any) -> dict[str, Any]:
    bm = moved.manifest
    return {
        "url": moved.url,
        "key": moved.key,
        "bundle_size": moved.size,
        "sha256": moved.sha256,
        "namespaces": [n.path for n in bm.namespaces],
        "files": len(bm.files),
        "size": bm.size,
    }


@click.command(
    "push",
    epilog=render.examples(
        "fi-cache push s3://my-bucket/fi-cache",
        "fi-cache push file:///shared/fi-cache --namespace unfused",
    ),
)
@click.argument("url")
@options.namespace_option(show_default="here")
@click.option(
    "--allow-unknown",
    "--force",
    "allow_unknown",
    is_flag=True,
    help="Push an environment whose FlashInfer version, arch or GPU was not detected (its "
    "key reads unknown: every machine whose detection fails alike pulls it); --force: the same.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="mooncake:// only: publish over a key that holds another table (vLLM never would).",
)
def push_command(url: str, namespace_opt: str | None, allow_unknown: bool, replace: bool) -> int:
    """Upload this machine's namespaces as a bundle to URL (s3://, gs://, file://, a path, ...).

    The bundle lands at URL/<flashinfer>/<arch>/<gpu>/<fingerprint>.tar.gz with a .json sidecar
    (size, sha256), so machines of every kind share one bucket and `pull` finds its own.
    """
    from fi_cache.cli.bundle import echo_bundle, resolve_namespaces
    from fi_cache.fleet import transfer
    from fi_cache.tier.keys import is_tier_arg

    which = namespace_opt or "here"
    if is_tier_arg(url):  # mooncake://KEY: vLLM 0.34's fleet tier, under vLLM's own keys
        from fi_cache.cli import tier

        return tier.push(url, which, replace)
    if replace:
        raise Refused("--replace is for mooncake:// keys (a bundle URL is never overwritten)")
    ctx = options.context()
    dirs = resolve_namespaces(ctx.store, which)
    progress = LiveProgress("push", ctx.quiet)
    try:
        moved = transfer.push(ctx.store, url, dirs, progress, allow_unknown)
    finally:
        progress.finish()
    if ctx.json:
        render.emit_json(_summary(moved))
    else:
        echo_bundle("pushed", moved.manifest, f"to {moved.url}", bundle_size=moved.size)
    return 0


@click.command(
    "pull",
    epilog=render.examples(
        "fi-cache pull s3://my-bucket/fi-cache",
        "fi-cache --format json pull gs://my-bucket/fi-cache",
    ),
)
@click.argument("url")
@FORCE_FOREIGN
@click.option(
    "--key",
    default=None,
    metavar="KEY",
    help="Pull this bundle (<flashinfer>/<arch>/<gpu>/<hash>.tar.gz) instead of this machine's.",
)
@options.finalize(show_default="mooncake:// only: the tables' own mode, else fused")
@options.dry_run()
def pull_command(
    url: str, force: bool, key: str | None, finalize: str | None, dry_run: bool
) -> int:
    """Download this machine's bundle from URL, check its sha256, verify and import it.

    Refuses (exit 2) when URL holds no bundle for this machine's environment, naming the key
    it looked for and the bundles that are there. --dry-run downloads it to a temp dir outside
    the store and checks it as the import would; nothing is imported, no lock taken.
    """
    from fi_cache.cli.bundle import echo_bundle, echo_node, echo_planned, node_summary
    from fi_cache.fleet import transfer
    from fi_cache.tier.keys import is_tier_arg

    if is_tier_arg(url):  # mooncake://KEY: adopt the tier's tables where they fit this machine
        if force or key:
            raise Refused("--force and --key are for bundles; the tier's tables must fit")
        if dry_run:
            raise Refused("--dry-run is for bundle URLs (mooncake:// pull has none yet)")
        from fi_cache.cli import tier

        return tier.pull(url, finalize)
    if finalize:
        raise Refused("--finalize is for mooncake:// keys (a bundle holds both namespaces)")
    ctx = options.context()
    progress = LiveProgress("pull", ctx.quiet)
    try:
        moved = transfer.pull(
            ctx.store, url, force=force, progress=progress, key=key, dry_run=dry_run
        )
    finally:
        progress.finish()
    if moved.planned is not None:
        echo_planned(moved.manifest, moved.planned, f"from {moved.url}", _summary(moved))
        return 0
    if ctx.json:
        render.emit_json(
            {**_summary(moved), "node_ranks": node_summary(moved.node), "dry_run": False}
        )
    else:
        echo_bundle("pulled", moved.manifest, f"from {moved.url}", list_namespaces=True)
        echo_node(moved.node)
    return 0


COMMANDS = [push_command, pull_command]
