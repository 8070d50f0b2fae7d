"""`mooncake://KEY` arguments of ls, show, verify, doctor and evict: vLLM 0.34's fleet tier
(fi_cache/tier/), read through one Mooncake client per command. The commands route here at
their top; a command takes keys or paths, not both."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM, EXIT_REFUSED, Refused

if TYPE_CHECKING:
    from fi_cache.caches.inventory import Cache
    from fi_cache.doctor.findings import Finding
    from fi_cache.doctor.inputs import Target
    from fi_cache.tier.keys import TierArg
    from fi_cache.tier.mooncake import TierClient
    from fi_cache.tier.read import TierInventory


@contextmanager
def _client() -> Iterator[TierClient]:
    from fi_cache.tier.mooncake import TierClient
    from fi_cache.tier.read import max_value_bytes

    environ = dict(os.environ)
    with TierClient.connect(environ, max_value_bytes(environ)) as client:
        yield client


def _read(args: list[TierArg]) -> TierInventory:
    from fi_cache.tier.read import max_value_bytes, read

    with _client() as client:
        return read(client, args, max_value_bytes(dict(os.environ)))


def _report(inv: TierInventory) -> int:
    """Each unreadable key and each argument with no table under it, one line each."""
    code = 0
    for p in inv.problems:
        render.error(f"mooncake://{p.path}: {p.message}")
        code = max(code, p.exit_code)
    for text in inv.empty:
        render.error(f"{text}: no table under this key (vLLM's daemon has published none)")
        code = EXIT_REFUSED
    return code


def url(cache: Cache) -> str:
    return f"mooncake://{cache.path}"


def _row(cache: Cache) -> dict[str, Any]:
    """One `ls` row, the contract's fields (cli/ls.py's summary) for a key: no namespace, no
    modified time (Mooncake keeps none), layout "mooncake"."""
    return {
        "path": url(cache),
        "format": "v1",
        "flashinfer_version": cache.flashinfer_version,
        "gpu": cache.fingerprint.gpu,
        "arch": cache.fingerprint.arch,
        "entries": len(cache.file.entries),
        "size": cache.size,
        "ops": cache.file.ops(),
        "finalize": cache.finalize(),
        "modified": None,
        "layout": "mooncake",
        "rank": list(cache.found.rank or ()),
        "namespace": None,
        "key_dir": None,
        "gpu_uuid": None,
        "run": None,
        "role": None,
        "pinned": False,
    }


def ls(args: list[TierArg], long_: bool, paths_only: bool) -> int:
    ctx = options.context()
    inv = _read(args)
    rows = [_row(cache) for cache in inv.caches]
    code = _report(inv)
    if ctx.json:
        problems = [
            {"path": f"mooncake://{p.path}", "check": p.check, "message": p.message}
            for p in inv.problems
        ]
        render.emit_json({"caches": rows, "problems": problems})
        return code
    if paths_only:
        for r in rows:
            click.echo(r["path"])
        return code
    if rows:
        headers = [*render.CACHE_HEADERS, *(["SIZE", "KEY"] if long_ else ["KEY"])]
        table = []
        for r in rows:
            size = [render.human_size(r["size"])] if long_ else []
            table.append([*render.cache_cells(r), *size, r["path"]])
        table = render.printable_rows(table)  # a table's own metadata: escaped
        click.echo(render.table(headers, table, right=(3, 5) if long_ else (3,)))
    return code


def show(
    arg: object,
    op_filter: str | None,
    entries_of: Callable[[Cache, str | None], list[dict[str, Any]]],
    show_human: Callable[..., None],
) -> int:
    """One table, decoded and shown by show's own functions (passed in: show imports this)."""
    from fi_cache.tier.keys import parse_arg

    ctx = options.context()
    tier_arg = parse_arg(arg)
    if tier_arg.one is None:
        raise Refused("show takes one table's key; `fi-cache ls` lists a hash dir", tier_arg.text)
    inv = _read([tier_arg])
    if inv.problems:
        err = inv.problems[0].error()
        err.path = tier_arg.text
        raise err
    if not inv.caches:
        raise Refused("no table under this key (vLLM's daemon has published none)", tier_arg.text)
    cache = inv.caches[0]
    entries = entries_of(cache, op_filter)
    if ctx.json:
        doc = {"path": url(cache), "format": "v1", "role": None, "metadata": cache.metadata}
        render.emit_json({**doc, "entries": entries, "namespace": None})
        return 0
    show_human(cache, entries, label=url(cache))
    return 0


def verify(args: list[TierArg]) -> int:
    ctx = options.context()
    inv = _read(args)
    code = _report(inv)
    results: list[dict[str, Any]] = []
    for cache in inv.caches:
        defects = list(cache.defects())
        problems = [{"check": d.check, "message": d.message} for d in defects]
        results.append(
            {
                "path": url(cache),
                "format": "v1",
                "ok": not defects,
                "entries": len(cache.file.entries),
                "problems": problems,
            }
        )
        for d in defects:
            render.error(f"{url(cache)}: {d.message}")
        if defects:
            code = max(code, EXIT_PROBLEM)
    for p in inv.problems:
        problem = {"check": p.check, "message": p.message}
        results.append(
            {
                "path": f"mooncake://{p.path}",
                "format": None,
                "ok": False,
                "entries": None,
                "problems": [problem],
            }
        )
    if ctx.json:
        render.emit_json({"results": results, "ok": code == 0})
    elif not ctx.quiet:
        for r in results:
            if r["ok"]:
                click.echo(f"ok    {r['path']} ({r['entries']} entries)")
        bad = sum(1 for r in results if not r["ok"])
        click.echo(f"{len(results) - bad} ok, {bad} with problems", err=bad > 0)
    return code


def doctor(
    args: list[TierArg],
    target: Target,
    only: tuple[str, ...],
    strict: bool,
    fix: bool,
    dry_run: bool,
) -> int:
    """The tables under the keys, judged against the target; --fix removes the keys in error."""
    from fi_cache.tier.judge import bad_keys, judge

    ctx = options.context()
    inv = _read(args)
    findings = judge(inv, target, only or None)
    keys = bad_keys(findings, inv) if fix else []
    removed = _remove(keys) if keys and not dry_run else []
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    if ctx.json:
        render.emit_json(
            {
                "findings": [f.to_json() for f in findings],
                "errors": errors,
                "warnings": warnings,
                "target": {
                    **target.fingerprint.metadata(),
                    "arch": target.fingerprint.arch,
                    "vllm_version": target.vllm_version,
                    "finalize": target.finalize,
                },
                "actions": [{"action": "remove", "path": k, "applied": not dry_run} for k in keys],
            }
        )
    else:
        _render(findings, ctx.quiet)
        for k in keys:
            click.echo(f"{'would remove' if dry_run else 'removed'} {k}")
        del removed
    for text in inv.empty:
        render.error(f"{text}: no table under this key (vLLM's daemon has published none)")
    if inv.empty:
        return EXIT_REFUSED
    return EXIT_PROBLEM if errors or (strict and warnings) else 0


def _render(findings: list[Finding], quiet: bool) -> None:
    for f in findings:
        if quiet and f.severity == "info":
            continue
        # messages quote the tables' own `_metadata`: text, never commands to the terminal
        message = render.printable(f.message, lines=True)
        click.echo(f"{f.severity:<7} {f.check}  {f.path}: {message}")
        if f.fix and f.fix != "-":
            click.echo(f"        fix: {render.printable(f.fix, lines=True)}")
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    click.echo(
        f"{errors} error(s), {warnings} warning(s), {len(findings) - errors - warnings} info"
    )


def _remove(urls: list[str]) -> list[str]:
    from fi_cache.tier.keys import parse_arg

    done = []
    with _client() as client:
        for u in urls:
            one = parse_arg(u).one
            if one is not None and client.remove(one.key):
                done.append(u)
    return done


def evict(args: list[TierArg], dry_run: bool, selector_given: bool) -> int:
    """Remove whole tables from the tier (plan, then apply): the next daemon that tunes
    publishes under the key again. Entries cannot be evicted from a table in the tier: a
    rewritten table would be one vLLM never tuned."""
    ctx = options.context()
    if selector_given:
        raise Refused(
            "--op/--bucket/--runner/--tactic select entries in files; in the tier evict removes "
            "whole tables (pull, evict in the namespace, push --replace to edit one)",
            args[0].text,
        )
    inv = _read(args)
    for text in inv.empty:
        render.error(f"{text}: no table under this key: nothing to remove")
    code = EXIT_REFUSED if inv.empty else 0
    planned = [url(c) for c in inv.caches] + [f"mooncake://{p.path}" for p in inv.problems]
    removed = [] if dry_run else _remove(planned)
    if ctx.json:
        render.emit_json(
            {"dry_run": dry_run, "keys": [{"path": u, "removed": u in removed} for u in planned]}
        )
        return code
    for u in planned:
        if dry_run:
            click.echo(f"would remove {u}")
        elif u in removed:
            click.echo(f"removed {u}")
        else:
            click.echo(f"already gone {u}")
    return code


__all__ = ["doctor", "evict", "ls", "show", "verify"]


def push(url_arg: str, which: str, replace: bool) -> int:
    """Publish a namespace's rank tables under vLLM's keys (verified, first writer wins)."""
    from fi_cache.cli.bundle import resolve_namespaces
    from fi_cache.tier.keys import parse_arg
    from fi_cache.tier.publish import apply_push, plan_push, push_sources

    ctx = options.context()
    arg = parse_arg(url_arg)
    sources = push_sources(resolve_namespaces(ctx.store, which), arg)
    with _client() as client:
        items = plan_push(client, sources, replace, ctx.store)
        done = apply_push(client, items)
    written = {item.key.key for item in done}
    rows: list[dict[str, Any]] = [
        {
            "key": i.key.url,
            "source": str(i.source),
            "action": i.action,
            "written": i.key.key in written,
        }
        for i in items
    ]
    if ctx.json:
        render.emit_json({"published": rows})
        return 0
    for item in items:
        if item.mode_blind and item.key.key in written:
            render.warn(
                f"{item.key.url}: its MoE keys (FlashInfer <= 0.6.17) record no finalize mode, "
                "nor does the tier's key: every daemon that adopts it must run the mode it was "
                "tuned in (this namespace's), or its GEMM2 ids crash or run other kernels"
            )
    for r in rows:
        verb = {"publish": "published", "replace": "replaced", "same": "already there"}
        state = verb[r["action"]] if r["written"] or r["action"] == "same" else "taken meanwhile"
        click.echo(f"{state} {r['key']}  <- {render.display_path(r['source'])}")
    return 0


def pull(url_arg: str, finalize: str | None) -> int:
    """Adopt the tier's tables into this machine's namespace, only where they fit it."""
    from fi_cache import environment
    from fi_cache.doctor.gather import Overrides, make_target
    from fi_cache.store.namespace import Namespace
    from fi_cache.store.paths import state_dir
    from fi_cache.tier.keys import parse_arg
    from fi_cache.tier.publish import apply_pull, plan_pull

    ctx = options.context()
    arg = parse_arg(url_arg)
    inv = _read([arg])
    if inv.empty:
        raise Refused("no table under this key (vLLM's daemon has published none)", arg.text)
    modes = {m for c in inv.caches if (m := c.finalize()) in ("fused", "unfused")}
    mode = finalize or (modes.pop() if len(modes) == 1 else "fused")
    env = environment.detect(state_dir(ctx.store))
    target = make_target(env, Overrides(finalize=mode), dict(os.environ))
    ns = Namespace(target.fingerprint, "unfused" if mode == "unfused" else "fused")
    items = plan_pull(inv, target, ns.path(ctx.store))
    done = apply_pull(items, ns, ctx.store)
    rows: list[dict[str, Any]] = [
        {"key": i.key.url, "path": str(i.dest), "installed": i in done} for i in items
    ]
    if ctx.json:
        render.emit_json({"namespace": str(ns.path(ctx.store)), "pulled": rows})
        return 0
    for r in rows:
        state = "installed" if r["installed"] else "already there"
        click.echo(f"{state} {render.display_path(r['path'])}  <- {r['key']}")
    return 0
