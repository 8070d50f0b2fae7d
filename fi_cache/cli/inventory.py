"""Read-only commands: env, ls, show, verify. None of them imports torch, flashinfer or vllm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fi_cache.cli import render
from fi_cache.discover import ScanProblem
from fi_cache.errors import EXIT_PROBLEM, EXIT_REFUSED, CorruptCache, Refused
from fi_cache.inventory import Cache, Inventory, scan
from fi_cache.model import keys as keymod
from fi_cache.model import moe, v1
from fi_cache.namespace import FINALIZE_MODES, NAMESPACES_DIR, Namespace, namespace_parts

_PATHS = click.argument("paths", nargs=-1, type=click.Path(path_type=Path, readable=False))


def _ctx() -> Any:
    return click.get_current_context().obj


# --- env ----------------------------------------------------------------------------------------


@click.command("env")
@click.option(
    "--exact/--no-exact",
    default=None,
    help="Ask FlashInfer itself for its metadata (a child process, cached). "
    "Default: when FlashInfer is installed and a GPU is visible.",
)
@click.option("--refresh", is_flag=True, help="Ignore the cached FlashInfer answer.")
def env_command(exact: bool | None, refresh: bool) -> int:
    """Show the detected environment and the namespace dir of each finalize mode."""
    from fi_cache import environment, storage
    from fi_cache.store import state_dir

    ctx = _ctx()
    env = environment.detect(state_dir(ctx.store), exact=exact, refresh=refresh)
    fp = env.fingerprint
    namespaces = {mode: str(Namespace(fp, mode).path(ctx.store)) for mode in FINALIZE_MODES}
    lock = (
        storage.lock_strategy(ctx.store)
        if ctx.store.is_dir()
        else ("flock", "store not created yet")
    )
    doc = {
        "metadata": fp.metadata(),
        "sources": env.sources,
        "arch": fp.arch,
        "gpus": [
            {"index": g.index, "name": g.name, "compute_cap": g.compute_cap} for g in env.gpus
        ],
        "torch_version": env.torch_version,
        "vllm": {
            "version": env.vllm.version,
            "envs_path": env.vllm.envs_path,
            "supports_fused_finalize_env": env.vllm.supports_finalize_env,
        },
        "store": str(ctx.store),
        "lock": {"strategy": lock[0], "why": lock[1]},
        "namespaces": namespaces,
        "notes": list(env.notes),
    }
    if ctx.json:
        render.emit_json(doc)
        return 0
    rows = [
        [name, value or "-", env.sources.get(name, "not detected")]
        for name, value in fp.metadata().items()
    ]
    rows.append(["arch (vLLM dir)", fp.arch or "-", env.sources.get("arch", "not detected")])
    click.echo(render.table(["FIELD", "VALUE", "SOURCE"], rows))
    gpus = ", ".join(f"{g.index}: {g.name} ({g.compute_cap})" for g in env.gpus) or "none visible"
    vllm = env.vllm
    support = {True: "supports", False: "does NOT support", None: "cannot tell whether it supports"}
    click.echo(f"\nGPUs    {gpus}")
    click.echo(f"torch   {env.torch_version or 'not installed'}")
    if vllm.version:
        click.echo(
            f"vLLM    {vllm.version}: {support[vllm.supports_finalize_env]} "
            "VLLM_FLASHINFER_MOE_FUSED_FINALIZE (the deterministic MoE path)"
        )
    else:
        click.echo("vLLM    not installed")
    click.echo(f"store   {ctx.store}  (locks: {lock[0]}; {lock[1]})")
    for mode, path in namespaces.items():
        click.echo(f"  {mode:<8}{path}")
    for note in env.notes:
        render.warn(note)
    return 0


# --- ls -----------------------------------------------------------------------------------------


def _store_roots(store: Path) -> list[Path]:
    root = store / NAMESPACES_DIR
    return [root] if root.is_dir() else []


def _scan(paths: tuple[Path, ...], include_store: bool) -> Inventory:
    store = _ctx().store
    inv = scan(_store_roots(store), explicit=False) if include_store else Inventory()
    extra = scan(paths)
    seen = {c.path.resolve() for c in inv.caches}  # a PATH inside the store: list it once
    inv.caches.extend(c for c in extra.caches if c.path.resolve() not in seen)
    inv.problems.extend(extra.problems)
    inv.empty.extend(extra.empty)
    return inv


def summary(cache: Cache, store: Path) -> dict[str, Any]:
    """One `ls` row as the contract's JSON (plus `layout`, `rank`, `namespace`)."""
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
    }


def _problem_json(p: ScanProblem) -> dict[str, str]:
    return {"path": str(p.path), "check": p.check, "message": p.message}


def _report_problems(inv: Inventory, quiet: bool = False) -> int:
    """Print each problem on one line; return the exit code they call for."""
    code = 0
    for p in inv.problems:
        render.warn(f"{p.path}: {p.message}")
        code = max(code, p.exit_code)
    for path in inv.empty:
        render.warn(f"{path}: no FlashInfer autotune caches found here")
        code = EXIT_REFUSED
    return code


@click.command("ls")
@_PATHS
@click.option("--no-store", is_flag=True, help="Only the given paths, not the fi-cache store.")
@click.option("-l", "--long", "long_", is_flag=True, help="Add size, modified time and ops.")
@click.option("--paths", "paths_only", is_flag=True, help="Print only paths, one per line.")
def ls_command(paths: tuple[Path, ...], no_store: bool, long_: bool, paths_only: bool) -> int:
    """List caches in the store and under PATHS (files, vLLM cache roots, v2 stores)."""
    ctx = _ctx()
    inv = _scan(paths, include_store=not no_store)
    rows = [summary(c, ctx.store) for c in inv.caches]
    code = _report_problems(inv)
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
    # Default columns fit 80 characters; -l adds size, time and ops. Store caches come first,
    # one group per namespace, their paths relative to it.
    headers = ["FLASHINFER", "ARCH", "GPU", "ENTRIES", "FINALIZE"]
    headers += ["SIZE", "MODIFIED", "PATH"] if long_ else ["PATH"]
    groups: dict[str | None, list[list[str]]] = {}
    for r in sorted(rows, key=lambda r: (r["namespace"] is None, r["namespace"] or "", r["path"])):
        row = [
            r["flashinfer_version"] or "?",
            r["arch"] or "-",
            render.short_gpu(r["gpu"]),
            str(r["entries"]),
            r["finalize"] or "-",
        ]
        if long_:
            row += [render.human_size(r["size"]), r["modified"][:16].replace("T", " ")]
        path = Path(r["path"])
        shown = path.relative_to(r["namespace"]) if r["namespace"] else path
        groups.setdefault(r["namespace"], []).append([*row, render.display_path(shown)])
    right = (3, 5) if long_ else (3,)
    for i, (ns_dir, table_rows) in enumerate(groups.items()):
        if ns_dir is not None or len(groups) > 1:
            title = f"namespace {render.display_path(Path(ns_dir))}" if ns_dir else "other caches"
            click.echo(("\n" if i else "") + title)
        click.echo(render.table(headers, table_rows, right=right, width=render.terminal_width()))
    if long_:
        click.echo()
        for r in rows:
            click.echo(f"{render.display_path(Path(r['path']))}: {', '.join(r['ops']) or '-'}")
    return code


# --- show ---------------------------------------------------------------------------------------


def _entry_json(raw: str, key: keymod.CacheKey | None, value: Any) -> dict[str, Any]:
    if not isinstance(value, list):
        value = [None, value]  # malformed (verify says so); still shown as it is
    if key is None:
        return {
            "op": None,
            "runner": value[0] if value else None,
            "profile": None,
            "extras": None,
            "tactic": value[1] if len(value) > 1 else None,
            "raw_key": raw,
        }
    extras: Any = keymod.to_json(key.extras) if key.has_extras else None
    if moe.is_moe(key.op) and (named := moe.named_extras(key)):
        extras = {name: keymod.to_json(v) for name, v in named.items()}
    out = {
        "op": key.op,
        "runner": key.runner,
        "profile": keymod.to_json(key.profile),
        "extras": extras,
        "tactic": value[1] if isinstance(value, list) and len(value) > 1 else None,
    }
    if moe.is_moe(key.op):
        out["finalize"] = moe.finalize_mode(key)
    if isinstance(value, list) and len(value) > 2:
        out["value_extra"] = value[2:]  # 0.7.4 provenance / selection data
    return out


def _load_one(path: Path) -> Cache:
    inv = scan([path])
    if inv.problems:
        p = inv.problems[0]
        raise (Refused if p.exit_code == EXIT_REFUSED else CorruptCache)(p.message, p.path)
    if inv.empty or not inv.caches:
        raise Refused("no FlashInfer autotune cache here", path)
    if len(inv.caches) > 1:
        raise Refused(f"holds {len(inv.caches)} caches; name one file (see `fi-cache ls`)", path)
    return inv.caches[0]


@click.command("show")
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option("--op", "op_filter", default=None, help="Only entries of this op (substring).")
def show_command(path: Path, op_filter: str | None) -> int:
    """Decode one cache: metadata, entries by op with shapes and tactics, MoE extras by name."""
    ctx = _ctx()
    cache = _load_one(path)
    entries = [_entry_json(raw, key, value) for raw, key, value in v1.iter_entries(cache.file)]
    if op_filter:
        entries = [e for e in entries if e["op"] and op_filter in e["op"]]
    if ctx.json:
        render.emit_json(
            {
                "path": str(cache.path),
                "format": cache.found.format,
                "metadata": cache.metadata,
                "entries": entries,
            }
        )
        return 0
    _show_human(cache, entries)
    return 0


def _show_human(cache: Cache, entries: list[dict[str, Any]]) -> None:
    click.echo(
        f"{render.display_path(cache.path)}  ({cache.found.format}, {len(entries)} entries, "
        f"{render.human_size(cache.size)})"
    )
    meta = cache.metadata
    if meta is None:
        click.echo("metadata: none (FlashInfer accepts the file in any environment)")
    else:
        for name, value in meta.items():
            click.echo(f"  {name:<24}{value}")
    if cache.file.generation:
        click.echo(f"  {'_generation':<24}{cache.file.generation[:16]}…")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault((e["op"] or "(unparsable key)", e["runner"] or "?"), []).append(e)
    for (op, runner), group in sorted(groups.items()):
        click.echo(f"\n{op} · {runner}  ({len(group)} entries)")
        rows = []
        for e in sorted(group, key=lambda e: json.dumps(e["profile"])):
            extras = e["extras"]
            if "finalize" in e and not isinstance(extras, dict):
                extras_text = "unknown finalize (no extras in key)"
            elif isinstance(extras, dict):  # MoE: the fields that tell runs apart
                extras_text = (
                    f"{e.get('finalize')} top_k={extras.get('top_k')} "
                    f"ep={extras.get('ep_size')} tp={extras.get('tp_size')}"
                )
            else:
                extras_text = _compact(extras) if extras is not None else "-"
            rows.append([_shapes(e["profile"]), _compact(e["tactic"]), extras_text])
        headers = ["PROFILE", "TACTIC", "EXTRAS"]
        click.echo(render.table(headers, rows, width=render.terminal_width()))


def _shapes(profile: Any) -> str:
    """Profile shapes as `1x4096 4096x2048 0 -1x2048`: one token per input, dims joined by x."""
    if not isinstance(profile, list):
        return str(profile)
    parts = []
    for shape in profile:
        if isinstance(shape, list):
            parts.append("x".join(str(d) for d in shape) if shape else "()")
        else:
            parts.append(str(shape))
    return " ".join(parts)


def _compact(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return str(value)


# --- verify -------------------------------------------------------------------------------------


@click.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False))
def verify_command(paths: tuple[Path, ...]) -> int:
    """Check integrity: valid JSON, every key parses, `_generation` matches, value shapes."""
    ctx = _ctx()
    inv = scan(paths)
    results: list[dict[str, Any]] = []
    code = _report_problems(inv)
    for cache in inv.caches:
        defects = [*cache.read_defects, *v1.defects(cache.file)]
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
            render.warn(f"{cache.path}: {d.message}")
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
    elif not ctx.quiet:
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
    if cache.found.format != "v1":
        return None
    if cache.file.generation is None:
        return "absent"
    return "mismatch" if any(d.check == "generation-mismatch" for d in defects) else "ok"


COMMANDS = [env_command, ls_command, show_command, verify_command]
