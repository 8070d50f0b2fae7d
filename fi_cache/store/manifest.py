"""A namespace's manifest: its fingerprint, when it was made and used, every warm, every
evict that took entries from its files, and its pin (`fi-cache pin`: no start may change it).

Pure data and (de)serialisation; `load`/`save` read and write it through the store package, so a
reader sees the old or the new manifest, never half of one.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fi_cache.errors import CorruptCache, Refused, refuse_special
from fi_cache.model import jsoncheck
from fi_cache.model.fingerprint import FINGERPRINT_FIELDS, Fingerprint
from fi_cache.store.files import atomic_write
from fi_cache.store.namespace import Namespace
from fi_cache.store.paths import relative_problem

MANIFEST_NAME = "manifest.json"
SCHEMA = 1
# Warm and evict records kept, newest first: one warm per start or config, so years of use; a
# manifest read by every ls, doctor and serve stays a few hundred kB at most.
MAX_RECORDS = 1000


@dataclass(frozen=True)
class CacheFileRecord:
    path: str  # relative to the namespace dir
    entries: int
    size: int
    seeded: int = 0  # entries fi-cache put there from earlier files before vLLM started


@dataclass(frozen=True)
class WarmRecord:
    started: float
    seconds: float
    vllm_version: str | None
    argv: list[str]  # the vLLM serve arguments, as the user gave them
    argv_key: str  # what makes two warms "the same" (argv without host/port)
    files: list[CacheFileRecord]
    supports_finalize_env: bool | None  # did that vLLM read VLLM_FLASHINFER_MOE_FUSED_FINALIZE?
    ok: bool = True
    engine: str = "vllm"  # "flashinfer": tuned by `warm --engine flashinfer --plan` (argv)
    engine_version: str | None = None  # SGLang's release, for engine "sglang"


@dataclass(frozen=True)
class EvictedFile:
    path: str  # relative to the namespace dir
    evicted: list[str]  # the raw keys that went
    kept: int  # entries left in the file


@dataclass(frozen=True)
class EvictRecord:
    """One `fi-cache evict` run over this namespace's files: when, by which selector (the
    options given: op, bucket, runner, tactic), and what went from which file."""

    at: float
    selector: dict[str, str | int]
    files: list[EvictedFile]


@dataclass(frozen=True)
class PinRecord:
    """`fi-cache pin`: when, the modes the engines' files and dirs had before (unpin gives them
    back) and each file's sha256 then (what tells a change made despite the pin)."""

    at: float
    modes: dict[str, int]  # path relative to the namespace dir -> st_mode & 0o7777
    sha256: dict[str, str]  # the same paths' files -> hex digest


@dataclass(frozen=True)
class Manifest:
    fingerprint: Fingerprint
    finalize: str
    created: float
    last_used: float
    warms: tuple[WarmRecord, ...] = ()
    unknown: dict[str, Any] = field(default_factory=dict)  # newer fields kept on rewrite
    evictions: tuple[EvictRecord, ...] = ()
    pin: PinRecord | None = None

    @classmethod
    def new(cls, ns: Namespace, now: float | None = None) -> Manifest:
        t = time.time() if now is None else now
        return cls(ns.fingerprint, ns.finalize, t, t)

    def with_warm(self, warm: WarmRecord) -> Manifest:
        warms = (*self.warms, warm)[-MAX_RECORDS:]
        return replace(self, warms=warms, last_used=warm.started + warm.seconds)

    def with_eviction(self, evict: EvictRecord) -> Manifest:
        return replace(self, evictions=(*self.evictions, evict)[-MAX_RECORDS:])

    def evictions_of(self, rel: str) -> list[tuple[EvictRecord, EvictedFile]]:
        """Every evict that took entries from the file `rel` (relative to the namespace)."""
        return [(e, f) for e in self.evictions for f in e.files if f.path == rel]

    def used(self, now: float | None = None) -> Manifest:
        return replace(self, last_used=time.time() if now is None else now)

    def last_warm(
        self, argv_key: str | None = None, since: float | None = None
    ) -> WarmRecord | None:
        """The newest successful warm (for this argv key, finished after `since`)."""
        for w in reversed(self.warms):
            if not w.ok or (argv_key is not None and w.argv_key != argv_key):
                continue
            if since is not None and w.started + w.seconds < since:
                continue
            return w
        return None


# A newer fi-cache may record more about a warm; this one reads what it knows.
_WARM_FIELDS = frozenset(f.name for f in fields(WarmRecord)) - {"files"}
_FILE_FIELDS = frozenset(f.name for f in fields(CacheFileRecord))


def to_json(m: Manifest) -> dict[str, Any]:
    return {
        **m.unknown,
        "schema": SCHEMA,
        "fingerprint": asdict(m.fingerprint),
        "finalize": m.finalize,
        "created": m.created,
        "last_used": m.last_used,
        "warms": [asdict(w) for w in m.warms],
        **({"evictions": [asdict(e) for e in m.evictions]} if m.evictions else {}),
        **({"pinned": asdict(m.pin)} if m.pin else {}),
    }


def from_json(data: Any) -> Manifest:
    """Raises ValueError (with a reason) for anything that is not a manifest."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if (why := jsoncheck.problem(data)) is not None:
        raise ValueError(why)
    try:
        fp = {k: v for k, v in dict(data["fingerprint"]).items() if k in FINGERPRINT_FIELDS}
        _check(all(v is None or isinstance(v, str) for v in fp.values()), "fingerprint")
        warms = tuple(_warm(w) for w in _list(data.get("warms", []), "warms"))
        evictions = tuple(_evict(e) for e in _list(data.get("evictions", []), "evictions"))
        pin = _pin(data["pinned"]) if "pinned" in data else None
        known = {"schema", "fingerprint", "finalize", "created", "last_used", "warms"}
        known |= {"evictions", "pinned"}
        _check(isinstance(data["finalize"], str), "finalize")
        return Manifest(
            Fingerprint(**fp),
            data["finalize"],
            _number(data["created"], "created"),
            _number(data["last_used"], "last_used"),
            warms,
            {k: v for k, v in data.items() if k not in known},
            evictions,
            pin,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed manifest ({exc})") from None


# What each warm field holds; a value of another type is a malformed manifest, not a crash later.
_WARM_TYPES: dict[str, tuple[type, ...]] = {
    "vllm_version": (str, type(None)),
    "argv_key": (str,),
    "supports_finalize_env": (bool, type(None)),
    "ok": (bool,),
    "engine": (str,),
    "engine_version": (str, type(None)),
}


def _warm(w: Any) -> WarmRecord:
    _check(isinstance(w, dict), "warms")
    fields_ = {k: v for k, v in w.items() if k in _WARM_FIELDS}
    for name, types in _WARM_TYPES.items():
        if name in fields_:
            _check(isinstance(fields_[name], types), f"warms: {name}")
    for name in ("started", "seconds"):
        if name in fields_:
            fields_[name] = _number(fields_[name], f"warms: {name}")
    argv = _list(fields_.get("argv", []), "warms: argv")
    _check(all(isinstance(a, str) for a in argv), "warms: argv")
    files = [_file(f) for f in _list(w["files"], "warms: files")]
    return WarmRecord(**fields_, files=files)


def _file(f: Any) -> CacheFileRecord:
    _check(isinstance(f, dict), "warms: files")
    rec = CacheFileRecord(**{k: v for k, v in f.items() if k in _FILE_FIELDS})
    _check(isinstance(rec.path, str), "warms: files: path")
    _confined(rec.path, "warms: files: path")
    for n in (rec.entries, rec.size, rec.seeded):
        _check(isinstance(n, int) and not isinstance(n, bool), "warms: files: entries/size")
    return rec


def _evict(e: Any) -> EvictRecord:
    _check(isinstance(e, dict), "evictions")
    selector = e.get("selector")
    _check(isinstance(selector, dict), "evictions: selector")
    _check(all(isinstance(v, (str, int)) for v in selector.values()), "evictions: selector")
    files = []
    for f in _list(e.get("files"), "evictions: files"):
        _check(isinstance(f, dict) and isinstance(f.get("path"), str), "evictions: files: path")
        _confined(f["path"], "evictions: files: path")
        keys = _list(f.get("evicted"), "evictions: files: evicted")
        _check(all(isinstance(k, str) for k in keys), "evictions: files: evicted")
        kept = f.get("kept")
        _check(isinstance(kept, int) and not isinstance(kept, bool), "evictions: files: kept")
        files.append(EvictedFile(f["path"], keys, kept))
    return EvictRecord(_number(e.get("at"), "evictions: at"), dict(selector), files)


def _pin(p: Any) -> PinRecord:
    _check(isinstance(p, dict), "pinned")
    modes, digests = p.get("modes"), p.get("sha256")
    _check(isinstance(modes, dict) and isinstance(digests, dict), "pinned: modes/sha256")
    for mode in modes.values():
        _check(isinstance(mode, int) and not isinstance(mode, bool), "pinned: modes")
    _check(all(isinstance(d, str) for d in digests.values()), "pinned: sha256")
    return PinRecord(_number(p.get("at"), "pinned: at"), dict(modes), dict(digests))


def _list(value: Any, what: str) -> list[Any]:
    _check(isinstance(value, list), what)
    return value  # type: ignore[no-any-return]


def _number(value: Any, what: str) -> float:
    _check(isinstance(value, (int, float)) and not isinstance(value, bool), what)
    return float(value)


def _confined(rel: str, what: str) -> None:
    """A file record's path names a file inside the namespace: seeding reads it, push sends it."""
    if (why := relative_problem(rel)) is not None:
        raise ValueError(f"{what} {rel!r} {why}: not a path inside the namespace")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{what} has the wrong type")


def load(directory: Path) -> Manifest | None:
    """The namespace's manifest, None when there is none yet. Raises CorruptCache."""
    path = directory / MANIFEST_NAME
    try:
        refuse_special(path, "manifest file")  # before open(): a FIFO would block there
        text = path.read_text(encoding="utf-8")
    except Refused as exc:
        raise CorruptCache(exc.message, path) from None
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCache(f"manifest is not UTF-8 text ({exc.reason})", path) from None
    except OSError as exc:
        raise CorruptCache(f"cannot read manifest: {exc.strerror}", path) from None
    try:
        return from_json(json.loads(text))
    except RecursionError:
        raise CorruptCache("manifest is JSON nested too deeply", path) from None
    except ValueError as exc:
        raise CorruptCache(str(exc), path) from None


def save(directory: Path, m: Manifest) -> None:
    """Atomic replace; the caller holds the namespace lock."""
    data = json.dumps(to_json(m), indent=2).encode()
    atomic_write(directory / MANIFEST_NAME, data, lock=False)
