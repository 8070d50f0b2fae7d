"""show: one cache decoded (metadata, entries by op with shapes and tactics, MoE extras)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import FiCacheError, Refused

if TYPE_CHECKING:  # `fi-cache --help` loads every command module: keep them light
    from fi_cache.caches.inventory import Cache
    from fi_cache.model import keys as keymod
    from fi_cache.store.manifest import Manifest


def _entry_json(raw: str, key: keymod.CacheKey | None, value: Any) -> dict[str, Any]:
    from fi_cache.model import keys as keymod
    from fi_cache.model import moe

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


def _load(path: Path) -> list[Cache]:
    """One cache, or the rank files of one SGLang deployment dir (read as one cache)."""
    from fi_cache.caches.inventory import scan

    inv = scan([path])
    if inv.problems:
        raise inv.problems[0].error()
    if inv.empty or not inv.caches:
        raise Refused("no FlashInfer autotune cache here", path)
    ranks = [c for c in inv.caches if not c.found.run]
    groups = {c.found.group for c in ranks}
    if len(inv.caches) > 1 and not (len(groups) == 1 and None not in groups):
        return [one_of(inv.caches, path)]
    return sorted(ranks, key=lambda c: c.found.rank or ()) if len(inv.caches) > 1 else inv.caches


def one_of(caches: list[Cache], path: Path) -> Cache:
    """The engine's own file among a dir's caches when the others are side files (a vLLM 0.32
    hash dir: one rank's file and the sparse-MLA decode file; a FlashInfer dump beside it),
    said on stderr; else refused."""
    own = [c for c in caches if c.role is None]
    if len(own) != 1:
        raise Refused(f"holds {len(caches)} caches; name one file (see `fi-cache ls`)", path)
    for c in caches:
        if c.role is not None:
            render.warn(
                f"left out {render.display_path(c.path)} (name it to read it): {_role_note(c.role)}"
            )
    return own[0]


def _role_note(role: str) -> str:
    from fi_cache.caches.discover import ROLE_NOTES

    return ROLE_NOTES[role]


@click.command(
    "show",
    epilog=render.examples(
        "fi-cache show autotune_configs.json",
        "fi-cache show autotune_configs.json --op fused_moe",
        "fi-cache --format json show autotune_configs.json",
    ),
)
@click.argument("path", type=click.Path(path_type=Path, readable=False))
@click.option("--op", "op_filter", default=None, help="Only entries of this op (substring).")
def show_command(path: Path, op_filter: str | None) -> int:
    """Decode one cache: metadata, entries by op with shapes and tactics, MoE extras by name."""
    from fi_cache.tier.keys import is_tier_arg

    if is_tier_arg(path):  # mooncake://KEY: vLLM 0.34's fleet tier
        from fi_cache.cli import tier

        return tier.show(path, op_filter, _entries, _show_human)
    ctx = options.context()
    caches = _load(path)
    if len(caches) > 1:
        return _show_ranks(caches, op_filter)
    cache = caches[0]
    entries = _parsed(cache, op_filter, rows=not ctx.json)
    key = _sglang_key(caches, ctx.store)
    ns = _namespace_json(cache, ctx.store)
    if ctx.json:
        doc = {
            "path": str(cache.path),
            "format": cache.found.format,
            "role": cache.role,
            "metadata": cache.metadata,
            "entries": _entries_json(entries),
            "namespace": ns,
        }
        render.emit_json({**doc, "sglang": key} if key else doc)
        return 0
    _say_key(key)
    _show_human(cache, entries)
    _say_namespace(ns)
    return 0


def _manifest(path: Path, store: Path) -> tuple[Path, Manifest | None] | None:
    """The store namespace holding `path` and its manifest (None when it has none or it is
    broken: doctor and verify name a broken manifest; show only shows)."""
    from fi_cache.store import manifest as manifests
    from fi_cache.store.namespace import namespace_parts

    parts = namespace_parts(path, store)
    if parts is None:
        return None
    try:
        return Path(parts["dir"]), manifests.load(Path(parts["dir"]))
    except FiCacheError:
        return Path(parts["dir"]), None


def _namespace_json(cache: Cache, store: Path) -> dict[str, Any] | None:
    """What the namespace's manifest says about this file: the evicts that took entries."""
    found = _manifest(cache.path, store)
    if found is None:
        return None
    ns, m = found
    try:
        rel = str(cache.path.resolve().relative_to(ns.resolve()))
    except ValueError:
        rel = ""
    evictions = [
        {"at": render.iso_time(e.at), "selector": e.selector, "evicted": f.evicted, "kept": f.kept}
        for e, f in (m.evictions_of(rel) if m else [])
    ]
    pinned = None
    if m is not None and m.pin is not None:
        from fi_cache.store.pin import changed

        pinned = {"since": render.iso_time(m.pin.at), "changed": changed(ns, m.pin)}
    return {"dir": str(ns), "evictions": evictions, "pinned": pinned}


def _say_namespace(ns: dict[str, Any] | None) -> None:
    if ns is None:
        return
    if (pin := ns["pinned"]) is not None:
        click.echo(f"\nnamespace pinned since {pin['since']}: no start may change it")
        if pin["changed"]:
            render.warn(
                f"changed since it was pinned (file modes do not stop root): "
                f"{', '.join(pin['changed'])}"
            )
    for e in ns["evictions"]:
        how = " ".join(f"--{k} {v}" for k, v in e["selector"].items())
        click.echo(
            f"\nevicted {len(e['evicted'])} entries at {e['at']} by `fi-cache evict {how}` "
            f"(kept {e['kept']}; the next start re-tunes them)"
        )


def _sglang_key(caches: list[Cache], store: Path) -> dict[str, Any] | None:
    """What an SGLang deployment's 16-hex dir hashes (not reversible), and the SGLang arguments
    that made it when a fi-cache warm in the store wrote these files."""
    found = caches[0].found
    if found.layout != "sglang" or found.key_dir is None:
        return None
    from fi_cache.versions import SGLANG_KEY_FIELDS

    out: dict[str, Any] = {
        "key_dir": found.key_dir,
        "hashes": list(SGLANG_KEY_FIELDS),
        "warmed_with": None,
        "sglang_version": None,
    }
    ns, m = _manifest(caches[0].path, store) or (Path(), None)
    paths = {c.path.resolve() for c in caches}
    for warm in reversed(m.warms if m else ()):
        if warm.engine == "sglang" and any((ns / f.path).resolve() in paths for f in warm.files):
            out["warmed_with"], out["sglang_version"] = warm.argv, warm.engine_version
            break
    return out


def _say_key(key: dict[str, Any] | None) -> None:
    if key is None:
        return
    click.echo(f"SGLang deployment {key['key_dir']}: a hash of {', '.join(key['hashes'])}")
    if key["warmed_with"] is not None:
        argv = " ".join(key["warmed_with"])
        click.echo(f"  warmed by fi-cache with SGLang {key['sglang_version']}: {argv}")


# Raw key, its parsed key (None: unparsable) or for the human output its row read from the
# text (keys.key_row, a tuple), and the value.
Entry = tuple[str, "keymod.CacheKey | keymod.KeyRow | None", Any]


def _entries(cache: Cache, op_filter: str | None) -> list[dict[str, Any]]:
    """The entries as `--format json` lists them (fi_cache/cli/tier.py shows a tier's so)."""
    return _entries_json(_parsed(cache, op_filter))


def _parsed(cache: Cache, op_filter: str | None, rows: bool = False) -> list[Entry]:
    """Every entry with its parsed key; `rows`: a non-MoE key of a shape seen before with its
    row instead (what the human output prints, without parsing 200,000 keys)."""
    from fi_cache.model import v1

    entries = list(_with_rows(cache) if rows else v1.iter_entries(cache.file))
    if not op_filter:
        return entries
    matched = [e for e in entries if e[1] is not None and op_filter in _op(e[1])]
    if entries and not matched:
        ops = ", ".join(cache.file.ops()) or "none"
        raise Refused(f"no op matches --op {op_filter!r}; its ops: {ops}", cache.path)
    return matched


def _op(key: keymod.CacheKey | keymod.KeyRow) -> str:
    return key[0] if isinstance(key, tuple) else key.op


def _with_rows(cache: Cache) -> Iterator[Entry]:
    from fi_cache.model import keys as keymod
    from fi_cache.model import moe

    moe_ops: dict[str, bool] = {}
    for raw, value in cache.file.entries.items():
        row = keymod.key_row(raw)
        if row is not None:
            if (is_moe := moe_ops.get(row[0])) is None:
                is_moe = moe_ops[row[0]] = moe.is_moe(row[0])
            if not is_moe:  # MoE extras are shown by name: from the parsed key
                yield raw, row, value
                continue
        try:
            yield raw, keymod.parse_key(raw), value
        except keymod.KeyError_:
            yield raw, None, value


def _entries_json(entries: list[Entry]) -> list[dict[str, Any]]:
    # rows=False: every key here is parsed (or None)
    return [_entry_json(raw, key, value) for raw, key, value in entries]  # type: ignore[arg-type]


def _show_ranks(caches: list[Cache], op_filter: str | None) -> int:
    """An SGLang deployment: its rank files one after another, each with its rank."""
    group = caches[0].found.group
    ranks: list[dict[str, Any]] = [
        {
            "rank": list(c.found.rank or ()),
            "path": str(c.path),
            "metadata": c.metadata,
            "entries": _parsed(c, op_filter, rows=not options.context().json),
        }
        for c in caches
    ]
    key = _sglang_key(caches, options.context().store)
    if options.context().json:
        for rank in ranks:
            rank["entries"] = _entries_json(rank["entries"])
        render.emit_json(
            {"path": str(group), "format": "v1", "layout": "sglang", "ranks": ranks, "sglang": key}
        )
        return 0
    click.echo(f"{render.display_path(Path(str(group)))}  (SGLang, {len(caches)} rank files)")
    _say_key(key)
    for cache, rank in zip(caches, ranks, strict=True):
        tp, pp, dp = (*rank["rank"], 0, 0, 0)[:3]
        click.echo(f"\nrank tp{tp} pp{pp} dp{dp}: ", nl=False)
        _show_human(cache, rank["entries"])
    return 0


def _show_human(
    cache: Cache, entries: list[Entry] | list[dict[str, Any]], label: str | None = None
) -> None:
    from fi_cache.model import keys as keymod
    from fi_cache.model.buckets import shape_order

    where = label or render.display_path(cache.path)  # label: a tier key (mooncake://)
    click.echo(
        f"{render.printable(where)}  ({cache.found.format}, {len(entries)} entries, "
        f"{render.human_size(cache.size)})"
    )
    if cache.role is not None:
        from fi_cache.caches.discover import ROLE_NOTES

        click.echo(f"  {ROLE_NOTES[cache.role]}")
    meta = cache.metadata
    if meta is None:
        click.echo("metadata: none (FlashInfer accepts the file in any environment)")
    else:
        for name, value in meta.items():
            click.echo(render.printable(f"  {name:<24}{value}"))
    if cache.file.generation:
        click.echo(f"  {'_generation':<24}{render.printable(cache.file.generation[:16])}…")
    # Each row with its sort key: (0, the profile) where it is tuples of ints (a numeric sort
    # of the parsed dims), else (1, the shapes text in numeric order).
    groups: dict[tuple[str, str], list[tuple[Any, list[str]]]] = {}
    moe_ops: dict[str, bool] = {}
    for entry in entries:
        if isinstance(entry, dict):  # as `--format json` lists it (a tier's table)
            group, row = _json_row(entry)
            groups.setdefault(group, []).append(((1, shape_order(row[0])), row))
            continue
        raw, key, value = entry
        tactic = value[1] if isinstance(value, list) and len(value) > 1 else value
        if isinstance(key, tuple):  # read from the key's text
            groups.setdefault((key[0], key[1]), []).append(
                ((0, key[3]), [key[2], _compact(tactic), key[4]])
            )
            continue
        if key is None:
            holder = value[0] if isinstance(value, list) and value else None
            row = ["", _compact(tactic), raw]  # the raw key, to find it in the file
            groups.setdefault(("(unparsable key)", str(holder or "?")), []).append(((1, ()), row))
            continue
        text = keymod.shapes_text(raw) or keymod.shapes(key.profile)
        order = keymod.profile_order(key.profile, text)
        row = [text, _compact(tactic), _extras_text(key, moe_ops)]
        groups.setdefault((key.op, key.runner), []).append((order, row))
    for (op, runner), keyed in sorted(groups.items(), key=lambda item: item[0]):
        click.echo(render.printable(f"\n{op} · {runner}  ({len(keyed)} entries)", lines=True))
        keyed.sort(key=lambda pair: (pair[0], pair[1][2]))  # buckets in numeric order
        rows = [row for _, row in keyed]
        headers = ["PROFILE", "TACTIC", "EXTRAS"]
        click.echo(
            render.table(headers, render.printable_rows(rows), width=render.terminal_width())
        )


def _json_row(e: dict[str, Any]) -> tuple[tuple[str, str], list[str]]:
    from fi_cache.model import keys as keymod

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
    group = (e["op"] or "(unparsable key)", e["runner"] or "?")
    shapes = keymod.shapes(e["profile"]) if e["op"] else ""
    return group, [shapes, _compact(e["tactic"]), extras_text if e["op"] else e["raw_key"]]


def _extras_text(key: keymod.CacheKey, moe_ops: dict[str, bool]) -> str:
    if (is_moe := moe_ops.get(key.op)) is None:
        from fi_cache.model import moe

        is_moe = moe_ops[key.op] = moe.is_moe(key.op)
    if not is_moe and type(key.extras) is tuple:
        text = "[" + ",".join(map(str, key.extras)) + "]"  # a plain leaf's str is its JSON's
        if "(" not in text[1:] and "[" not in text[1:]:
            return text
    from fi_cache.model import keys as keymod
    from fi_cache.model import moe

    if is_moe:
        named = moe.named_extras(key)
        if not named:
            return "unknown finalize (no extras in key)"
        extras = {name: keymod.to_json(v) for name, v in named.items()}
        # MoE: the fields that tell runs apart
        return (
            f"{moe.finalize_mode(key)} top_k={extras.get('top_k')} "
            f"ep={extras.get('ep_size')} tp={extras.get('tp_size')}"
        )
    return _compact(keymod.to_json(key.extras)) if key.has_extras else "-"


def _compact(value: Any) -> str:
    if isinstance(value, list):
        if all(type(v) in _PLAIN for v in value):  # most extras: no call per item
            return "[" + ",".join(map(str, value)) + "]"
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return str(value)


_PLAIN = (int, str, float, bool, type(None))


COMMANDS = [show_command]
