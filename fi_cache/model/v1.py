"""FlashInfer's v1 cache file (`flashinfer.autotune(cache=PATH)`): parse, check, serialise.

Layout (autotuner.py `save_configs`, 0.6.18): one JSON object, `indent=2`; `_metadata` first,
then `_records` (only when non-empty), then entries in sorted key order, then `_generation` =
sha256 of the object without `_generation`, dumped with sort_keys and compact separators.
Entry value: `[runner_name, tactic, *more]`: from 0.7.1rc2 a 3rd element, the profiling
policy (autotuner/autotuner.py 0.7.1rc2:3511, 0.7.2.post1:3545-3547); 0.7.4 adds a 4th, a
selection dict (:4659).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fi_cache.model import jsoncheck, moe
from fi_cache.model import keys as keymod
from fi_cache.versions import (
    FLASHINFER_GENERATION,
    GENERATION_KEY,
    METADATA_KEY,
    RECORDS_KEY,
    parse_version,
)

# Tactics nest a few levels (cuDNN: [plan, [[k, v]]]); anything deeper is not FlashInfer's.
_MAX_TACTIC_DEPTH = 16


class FormatError(ValueError):
    """The bytes are not a v1 cache file; the message is one line for the user."""


@dataclass(frozen=True)
class CacheFile:
    """A v1 file as data. `entries` keeps raw keys and values exactly as stored."""

    metadata: dict[str, Any] | None
    entries: dict[str, list[Any]]
    records: Any = None
    generation: str | None = None
    # Top-level fields fi-cache does not know, kept so a rewrite loses nothing.
    unknown: dict[str, Any] = field(default_factory=dict)
    # `_records` / `_generation` exactly as found (null and non-strings included): FlashInfer's
    # loader treats a present null differently from an absent field.
    reserved: dict[str, Any] = field(default_factory=dict)

    @property
    def has_records(self) -> bool:
        return self.records is not None

    def ops(self) -> list[str]:
        """Sorted distinct op names (custom_op of each key)."""
        found = {raw[2 : raw.find("'", 2)] for raw in self.entries if raw.startswith("('")}
        if (
            len(found) > 0
            and not any("\\" in op for op in found)
            and all(raw.startswith("('") for raw in self.entries)
        ):
            return sorted(found)
        return sorted({op for op, _ in heads(list(self.entries))})

    def finalize(self) -> moe.FileFinalize | None:
        """The MoE finalize mode of the file's entries; None without MoE entries."""
        modes = {entry[1] for raw in self.entries if (entry := moe_entry(raw)) is not None}
        return moe.combine(modes)


def moe_entry(raw: str) -> tuple[str, moe.Finalize] | None:
    """(op, finalize mode) of a fused-MoE entry key; None for other ops and bad keys."""
    if "fused_moe::" not in raw and "'moe_" not in raw:  # cheap filter before parsing
        return None
    head = raw[: raw.find("',")]
    if head.startswith("('") and "\\" not in head:
        mode = _moe_mode(head[2:], keymod.signature(raw))
        return None if mode is None else (head[2:], mode)
    try:  # unusual head (escaped quotes): parse as is
        key = keymod.parse_key(raw)
    except keymod.KeyError_:
        return None
    return (key.op, moe.finalize_mode(key)) if moe.is_moe(key.op) else None


@functools.lru_cache(maxsize=4096)
def _moe_mode(op: str, signature: bytes) -> moe.Finalize | None:
    """Keys that differ only in shape digits share op and extras, so one parse of their
    signature serves every bucket of every file (a key parses iff its signature does)."""
    if not moe.is_moe(op):
        return None
    try:
        key = keymod.parse_key(signature.decode("utf-8", "surrogatepass"))
    except keymod.KeyError_:
        return None
    return moe.finalize_mode(key)


def heads(raw_keys: list[str]) -> list[tuple[str, str]]:
    """(op, runner) per key; fast path for the common case, full parse otherwise."""
    fast = keymod.key_heads(raw_keys)
    if fast is not None:
        return fast
    out = []
    for raw in raw_keys:
        try:
            key = keymod.parse_key(raw)
            out.append((key.op, key.runner))
        except keymod.KeyError_:
            out.append(("?", "?"))
    return out


def loads(text: str | bytes) -> CacheFile:
    """Parse a v1 file's bytes. Raises FormatError for anything FlashInfer could not load, and for
    JSON no FlashInfer writes (nested too deeply, lone surrogates: model/jsoncheck.py)."""
    try:
        text = jsoncheck.text(text)  # FlashInfer reads text; json's UTF-16/32 sniffing is not
        data = json.loads(text)
    except jsoncheck.NotUtf8 as exc:
        raise FormatError(str(exc)) from None
    except json.JSONDecodeError as exc:
        # Ending inside a string or at the last byte means the writer stopped early.
        truncated = exc.msg.startswith("Unterminated string") or exc.pos >= len(text.rstrip()) - 1
        where = "truncated" if truncated else "invalid JSON"
        msg = exc.msg.removesuffix(" at")  # json's "Invalid control character at" ends so
        raise FormatError(f"{where}: {msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise FormatError("JSON nested too deeply to be a cache file") from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise FormatError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FormatError(f"top level is a JSON {_json_type(data)}, not an object")
    if (why := jsoncheck.problem(data, text)) is not None:
        raise FormatError(why)
    return from_json(data)


def from_json(data: dict[str, Any]) -> CacheFile:
    """A CacheFile from parsed JSON. Takes ownership of `data` (its dict becomes `entries`)."""
    metadata = data.get(METADATA_KEY)
    if metadata is not None and not isinstance(metadata, dict):
        # FlashInfer treats it as all fields missing and skips the file in every environment.
        raise FormatError(
            f"{METADATA_KEY} is a JSON {_json_type(metadata)}, not an object "
            "(FlashInfer ignores the whole file)"
        )
    # Entry keys start with "("; everything else is reserved or unknown (kept, never dropped).
    others = {k: data.pop(k) for k in [k for k in data if k[:1] != "("]}
    reserved = {k: others.pop(k) for k in (RECORDS_KEY, GENERATION_KEY) if k in others}
    others.pop(METADATA_KEY, None)
    generation = reserved.get(GENERATION_KEY)
    if not isinstance(generation, str):
        generation = None  # defects() says what FlashInfer makes of it
    entries: dict[str, list[Any]] = data
    return CacheFile(metadata, entries, reserved.get(RECORDS_KEY), generation, others, reserved)


def as_json(cf: CacheFile) -> dict[str, Any]:
    """The parsed JSON object the file was read from (reserved fields as found, unordered)."""
    out: dict[str, Any] = {**cf.entries, **cf.unknown, **cf.reserved}
    if cf.metadata is not None:
        out[METADATA_KEY] = cf.metadata
    return out


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def compute_generation(cf: CacheFile) -> str:
    """`_generation` exactly as FlashInfer 0.6.18 computes it over the file it writes."""
    canonical = json.dumps(
        _unordered(cf),
        sort_keys=True,
        separators=(",", ":"),
        check_circular=False,  # parsed JSON has no cycles; saves a tenth of the time
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _unordered(cf: CacheFile) -> dict[str, Any]:
    """The file without `_generation`, in any order (for hashing with sort_keys)."""
    out: dict[str, Any] = dict(cf.entries)
    out.update(cf.unknown)
    if cf.metadata is not None:
        out[METADATA_KEY] = cf.metadata
    if cf.records:
        out[RECORDS_KEY] = cf.records
    return out


def _ordered(cf: CacheFile, include_generation: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cf.metadata is not None:
        out[METADATA_KEY] = cf.metadata
    if cf.records:  # FlashInfer writes `_records` only when non-empty
        out[RECORDS_KEY] = cf.records
    # FlashInfer sorts every non-reserved top-level key as a config, unknown ones included.
    body = {**cf.entries, **cf.unknown}
    for k in sorted(body):
        out[k] = body[k]
    if include_generation and cf.generation is not None:
        out[GENERATION_KEY] = cf.generation
    return out


def dumps(cf: CacheFile, *, with_generation: bool | None = None) -> str:
    """Serialise in FlashInfer's layout. `_generation` is recomputed when written at all:
    by default when the file had one (a <= 0.6.17 reader would load it as a bogus entry)."""
    if with_generation is None:
        with_generation = cf.generation is not None
    generation = compute_generation(cf) if with_generation else None
    out = _ordered(CacheFile(cf.metadata, cf.entries, cf.records, generation, cf.unknown), True)
    return _indent2(out)


# What json.dumps writes for a str and an int item (the C string encoder, int.__repr__).
_ITEM: dict[type, Callable[[Any], str]] = {
    str: json.encoder.encode_basestring_ascii,
    int: int.__repr__,
}


def _indent2(out: dict[str, Any]) -> str:
    """`json.dumps(out, indent=2)`, byte for byte, ~5x faster on 200,000 entries (indent=2 runs
    the pure-Python encoder): a flat list of strs and ints (every entry's value) is joined here,
    anything else is dumped with indent=2 and shifted one level (JSON strings hold no newline)."""
    if not out:
        return "{}"
    quote = _ITEM[str]
    parts = []
    for k, v in out.items():
        if type(k) is not str:
            return json.dumps(out, indent=2)
        try:
            if type(v) is not list or not v:
                raise KeyError
            text = "[\n    " + ",\n    ".join([_ITEM[type(x)](x) for x in v]) + "\n  ]"
        except KeyError:  # another value: as json.dumps writes it, one level in
            text = json.dumps(v, indent=2).replace("\n", "\n  ")
        parts.append(f"{quote(k)}: {text}")
    return "{\n  " + ",\n  ".join(parts) + "\n}"


# --- Integrity --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Defect:
    """Something wrong inside a parsed file. `check` is a doctor check id."""

    check: str
    message: str


def value_problem(value: Any) -> str | None:
    """Why an entry value is not `[runner_name, tactic, *extra]`, or None when it is fine."""
    if not isinstance(value, list):
        return f"value is a JSON {_json_type(value)}, not [runner, tactic]"
    if not 2 <= len(value) <= 4:
        return f"value has {len(value)} elements, expected 2 to 4"
    if not isinstance(value[0], str):
        return "runner name (value[0]) is not a string"
    if not _is_tactic(value[1], 0):
        return "tactic (value[1]) is not an int or a nested list of ints/strings"
    return None


def _is_tactic(tactic: Any, depth: int) -> bool:
    if isinstance(tactic, bool):
        return False
    if isinstance(tactic, (int, str)):
        return True
    if isinstance(tactic, list) and depth < _MAX_TACTIC_DEPTH:
        return all(
            v is None or isinstance(v, (float, bool)) or _is_tactic(v, depth + 1) for v in tactic
        )
    return False


def reader_eras(metadata: dict[str, Any] | None) -> tuple[bool, bool]:
    """(a FlashInfer <= 0.6.17 reads it, a FlashInfer >= 0.6.18rc2 reads it). A FlashInfer of
    another version than the one `_metadata` names skips the file before reading any entry;
    a file without a version (or with "*") is read by every one."""
    version = parse_version(str(metadata.get("flashinfer_version"))) if metadata else None
    if version is None:
        return True, True
    return version < FLASHINFER_GENERATION, version >= FLASHINFER_GENERATION


def load_crash(value: Any) -> str | None:
    """The exception FlashInfer's `load_configs` (0.6.17, 0.6.18) raises on a top-level field it
    reads as an entry (`runner = value[0]; value[1]; runner.startswith(...)`), or None."""
    if isinstance(value, dict):
        return "KeyError: 0"
    if not isinstance(value, (list, str)):
        return f"TypeError: a JSON {_json_type(value)} is not [runner, tactic]"
    if len(value) < 2:
        return f"IndexError: {len(value)} element{'' if len(value) == 1 else 's'}, not 2"
    if not isinstance(value[0], str):
        return f"AttributeError: the runner name value[0] is a JSON {_json_type(value[0])}"
    return None


def _legacy_cudnn(value: list[Any]) -> bool:
    """FlashInfer skips a cuDNN entry whose tactic is an int >= 0 (an old plan index): a miss."""
    t = value[1]
    return isinstance(t, int) and t >= 0 and value[0].startswith("Cudnn")


def _load_defects(cf: CacheFile) -> Iterator[Defect]:
    """What the load path crashes on besides the entries: unknown top-level fields (loaded as
    entries), and `_records` / `_generation` (entries for <= 0.6.17; 0.6.18 wants an object)."""
    old, new = reader_eras(cf.metadata)
    for name, value in cf.unknown.items():
        if (crash := load_crash(value)) is not None:
            yield Defect(
                "corrupt-file",
                f"top-level field {_short(name)!r}: FlashInfer loads every field but "
                f"{_reserved_text(old)} as an entry [runner, tactic] and crashes on this one "
                f"({crash})",
            )
    res = cf.reserved or {  # a CacheFile built in code rather than parsed
        k: v
        for k, v in ((RECORDS_KEY, cf.records), (GENERATION_KEY, cf.generation))
        if v is not None
    }
    if RECORDS_KEY in res:
        records = res[RECORDS_KEY]
        if new and not isinstance(records, dict):
            yield Defect(
                "corrupt-file",
                f"{RECORDS_KEY} is a JSON {_json_type(records)}, not an object (FlashInfer "
                f">= {FLASHINFER_GENERATION} raises ValueError loading it)",
            )
        elif old and (crash := load_crash(records)) is not None:
            yield Defect(
                "records-unreadable" if isinstance(records, dict) else "corrupt-file",
                f"has {RECORDS_KEY}, which FlashInfer <= 0.6.17 (its {METADATA_KEY} lets one read "
                f"the file) reads as an entry and crashes on ({crash})",
            )
    if GENERATION_KEY in res and not isinstance(gen := res[GENERATION_KEY], str):
        if old:
            yield Defect(
                "corrupt-file",
                f"{GENERATION_KEY} is a JSON {_json_type(gen)}: FlashInfer <= 0.6.17 reads it as "
                f"an entry and crashes ({load_crash(gen)})",
            )
        elif gen is not None:
            yield Defect(
                "generation-mismatch",
                f"{GENERATION_KEY} is a JSON {_json_type(gen)}, not the sha256 FlashInfer writes",
            )
    elif old and GENERATION_KEY in res and (crash := load_crash(res[GENERATION_KEY])):
        yield Defect(
            "corrupt-file",
            f"{GENERATION_KEY} is too short to be a hash: FlashInfer <= 0.6.17 reads it as an "
            f"entry and crashes ({crash})",
        )


def _reserved_text(old: bool) -> str:
    return f"`{METADATA_KEY}`" if old else f"`{METADATA_KEY}`, `{RECORDS_KEY}`, `{GENERATION_KEY}`"


def defects(cf: CacheFile, limit: int = 20) -> Iterator[Defect]:
    """Every integrity problem: what FlashInfer's loader crashes on or skips, unparsable keys,
    malformed values, a stale `_generation`. At most `limit` per kind are spelled out; the last
    line counts the rest."""
    yield from _load_defects(cf)
    raw_keys = list(cf.entries)
    bad_keys = keymod.find_unparsable(raw_keys)
    yield from _capped(
        "corrupt-file",
        [f"key {_short(raw_keys[i])} does not parse: {why}" for i, why in bad_keys.items()],
        limit,
    )
    bad_values = []
    for k, v in cf.entries.items():
        if type(v) is list and len(v) == 2 and type(v[0]) is str:
            t = v[1]  # the common shapes, checked without a call: int, or cuDNN's [plan, []]
            if (type(t) is int and (t < 0 or not v[0].startswith("Cudnn"))) or (
                type(t) is list and len(t) == 2 and type(t[0]) is int and t[1] == []
            ):
                continue
        why = value_problem(v)
        if why is None and _legacy_cudnn(v):
            why = (
                "a cuDNN tactic that is a plain int (an old plan index): FlashInfer skips the "
                "entry and tunes that shape again"
            )
        elif why is not None and (crash := load_crash(v)) is not None:
            why += f" (FlashInfer's loader crashes on it: {crash})"
        if why is not None:
            bad_values.append(f"entry {_short(k)}: {why}")
    yield from _capped("corrupt-file", bad_values, limit)
    if cf.generation is not None:
        expected = compute_generation(cf)
        if expected != cf.generation:
            yield Defect(
                "generation-mismatch",
                f"{GENERATION_KEY} is {cf.generation[:12]}… but the content hashes to "
                f"{expected[:12]}… (edited or merged by hand after FlashInfer wrote it)",
            )


def _capped(check: str, messages: list[str], limit: int) -> Iterator[Defect]:
    for message in messages[:limit]:
        yield Defect(check, message)
    if len(messages) > limit:
        yield Defect(check, f"… and {len(messages) - limit} more like these")


def _short(raw_key: str, width: int = 60) -> str:
    return raw_key if len(raw_key) <= width else raw_key[: width - 1] + "…"


def iter_entries(cf: CacheFile) -> Iterator[tuple[str, keymod.CacheKey | None, list[Any]]]:
    """(raw key, parsed key or None when it does not parse, value) for every entry."""
    for raw, value in cf.entries.items():
        try:
            parsed: keymod.CacheKey | None = keymod.parse_key(raw)
        except keymod.KeyError_:
            parsed = None
        yield raw, parsed, value
