"""Read caches from disk into data: one `Cache` per file (v1) or env dir (v2).

Bad files never abort a scan: `scan` collects them as problems and carries on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fi_cache.caches.discover import Found, ScanProblem, discover
from fi_cache.errors import (
    CorruptCache,
    FiCacheError,
    Refused,
    read_refusal,
    special_kind,
    special_message,
)
from fi_cache.model import jsoncheck, moe, v1, v2
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.versions import SPARSE_MLA_OP_PREFIX, VLLM_CACHE_FILE

# Real caches are kilobytes to tens of MB (100,000 entries is about 25 MB). Refuse far
# bigger files instead of reading gigabytes into memory; FI_CACHE_MAX_FILE_MB raises the cap.
_DEFAULT_MAX_MB = 512
MAX_FILE_ENV = "FI_CACHE_MAX_FILE_MB"
MB = 1024 * 1024


def env_megabytes(name: str, default: int) -> int:
    """$name as a whole number of MB (unset or empty: `default`). Raises Refused naming it:
    a typo must not silently leave the default in force."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise Refused(f"{name}={raw!r}: give a whole number of MB (0 or more), or unset it")
    return int(raw)


def max_file_bytes() -> int:
    return env_megabytes(MAX_FILE_ENV, _DEFAULT_MAX_MB) * MB


def _size(n: int) -> str:
    if n < MB:
        return f"{n} bytes"
    return f"{n / MB:.1f} MB" if n < 100 * MB else f"{n / MB:.0f} MB"


def _too_big(size: int, limit: int) -> str:
    if size > _DEFAULT_MAX_MB * MB:
        return (
            f"{_size(size)} is far larger than any autotune cache "
            f"(limit {limit // MB} MB, raise with {MAX_FILE_ENV})"
        )
    return f"{_size(size)} is over the {limit // MB} MB limit that {MAX_FILE_ENV} sets"


@dataclass(frozen=True)
class Cache:
    """One cache as read: its location, content, and defects found while reading (v2)."""

    found: Found
    file: v1.CacheFile
    size: int
    modified: float
    read_defects: tuple[v1.Defect, ...] = ()
    manifest: dict[str, Any] | None = None  # v2 only

    @property
    def path(self) -> Path:
        return self.found.path

    def defects(self) -> tuple[v1.Defect, ...]:
        """Every problem `verify` reports (exit 1): what reading found, then the content's own
        (v1.defects: unparsable keys, malformed values, `_records`, a stale `_generation`)."""
        return (*self.read_defects, *v1.defects(self.file))

    @property
    def metadata(self) -> dict[str, Any] | None:
        return self.file.metadata

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.from_metadata(self.file.metadata, self.found.arch)

    @property
    def flashinfer_version(self) -> str | None:
        return self.fingerprint.flashinfer_version or self.found.dir_version

    def finalize(self) -> moe.FileFinalize | None:
        return self.file.finalize()

    @property
    def role(self) -> str | None:
        """What the file is for where it is not its engine's own tune (discover.ROLE_NOTES): by
        its place, or, for vLLM's plain name alone in a hash dir, by FlashInfer's sparse-MLA
        decode ops in it (0.6.17/0.6.18 keys: that dir is vLLM 0.32+'s)."""
        if self.found.role is not None:
            return self.found.role
        plain = self.found.path.name == VLLM_CACHE_FILE and self.found.layout != "file"
        if plain and any(op.startswith(SPARSE_MLA_OP_PREFIX) for op in self.file.ops()):
            return "sparse-mla"
        return None


def _read_bytes(path: Path) -> bytes:
    try:
        st = path.stat()
        if (kind := special_kind(st.st_mode)) is not None:  # before open(): a FIFO blocks there
            raise Refused(special_message(kind, "cache file"), path)
        size = st.st_size
        if size > (limit := max_file_bytes()):
            raise Refused(_too_big(size, limit), path)
        return path.read_bytes()
    except PermissionError:
        raise Refused("permission denied (FlashInfer writes its files 0600)", path) from None
    except OSError as exc:
        raise read_refusal(exc, path, "cache file") from None


def read(found: Found) -> Cache:
    """Load one cache. Raises CorruptCache (exit 1) or Refused (exit 2)."""
    if found.format == "v2":
        return _read_v2(found)
    data = _read_bytes(found.path)
    if not data or (len(data) < 64 and not data.strip()):
        raise CorruptCache("empty file (a writer was killed before writing anything?)", found.path)
    try:
        cf = v1.loads(data)
    except v1.FormatError as exc:
        raise CorruptCache(str(exc), found.path) from None
    st = found.path.stat()
    return Cache(found, cf, st.st_size, st.st_mtime)


def _read_v2(found: Found) -> Cache:
    manifest_path = found.path / v2.MANIFEST
    raw_manifest = _read_bytes(manifest_path)
    try:
        manifest = json.loads(jsoncheck.text(raw_manifest))  # as FlashInfer reads: UTF-8 only
    except jsoncheck.NotUtf8 as exc:
        raise CorruptCache(f"manifest is {exc}", manifest_path) from None
    except RecursionError:
        raise CorruptCache("manifest is JSON nested too deeply", manifest_path) from None
    except ValueError as exc:
        raise CorruptCache(f"manifest is not valid JSON ({exc})", manifest_path) from None
    if not isinstance(manifest, dict):
        raise CorruptCache("manifest is not a JSON object", manifest_path)
    if (why := jsoncheck.problem(manifest, raw_manifest)) is not None:
        raise CorruptCache(f"manifest: {why}", manifest_path)
    entries: dict[str, list[Any]] = {}
    defects: list[v1.Defect] = []
    size = manifest_path.stat().st_size
    modified = manifest_path.stat().st_mtime
    entries_dir = found.path / v2.ENTRIES_DIR
    try:
        names = sorted(n for n in os.listdir(entries_dir) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise Refused(f"cannot list entries: {exc.strerror}", entries_dir) from None
    for name in names:
        path = entries_dir / name
        try:
            raw = _read_bytes(path)
            data = json.loads(jsoncheck.text(raw))  # FlashInfer's open(encoding="utf-8")
            if (why := jsoncheck.problem(data, raw)) is not None:
                raise ValueError(why)
            entry = v2.parse_entry(name, data)
        except FiCacheError as exc:
            defects.append(v1.Defect("corrupt-file", f"{name}: {exc.message}"))
            continue
        except RecursionError:
            defects.append(v1.Defect("corrupt-file", f"{name}: JSON nested too deeply"))
            continue
        except ValueError as exc:
            defects.append(v1.Defect("corrupt-file", f"{name}: {exc}"))
            continue
        entries[entry.key] = entry.value
        st = path.stat()
        size += st.st_size
        modified = max(modified, st.st_mtime)
    cf = v1.CacheFile(v2.metadata_of(manifest), entries)
    expected = v2.env_hash(manifest)
    if expected != found.path.name:
        defects.append(
            v1.Defect(
                "generation-mismatch",
                f"manifest hashes to {expected}, not to its directory name "
                "(edited by hand? FlashInfer will never look here)",
            )
        )
    return Cache(found, cf, size, modified, tuple(defects), manifest)


@dataclass
class Inventory:
    caches: list[Cache] = field(default_factory=list)
    problems: list[ScanProblem] = field(default_factory=list)
    # Paths given explicitly that held no cache at all.
    empty: list[Path] = field(default_factory=list)


def scan(paths: Iterable[Path], *, explicit: bool = True) -> Inventory:
    """Discover and read every cache under `paths`. Missing paths raise Refused when explicit;
    every unreadable or corrupt cache becomes a problem and the scan goes on."""
    max_file_bytes()  # a bad FI_CACHE_MAX_FILE_MB is one refusal, not a problem per file
    inv = Inventory()
    seen: set[Path] = set()
    for root in paths:
        try:
            found, problems = discover(root)
        except Refused:
            if explicit:
                raise
            continue
        inv.problems.extend(problems)
        if not found and not problems and explicit:
            inv.empty.append(root)
        for f in found:
            key = f.path.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                inv.caches.append(read(f))
            except CorruptCache as exc:
                inv.problems.append(
                    ScanProblem(Path(exc.path or f.path), "corrupt-file", exc.message)
                )
            except Refused as exc:
                check = "unreadable-permissions" if "permission" in exc.message else "corrupt-file"
                inv.problems.append(ScanProblem(Path(exc.path or f.path), check, exc.message, 2))
    return inv
