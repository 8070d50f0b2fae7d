"""Bundles: one or more store namespaces in a tar.gz with a manifest of sha256 and sizes.

Export reads the store under each namespace's lock. Import trusts nothing: every member is
checked (name, type, size, checksum, that each namespace's path is the one its fingerprint
gives) before anything reaches the store, files land in a temp dir inside the store, and only
then is each namespace renamed into place under its lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from fi_cache import __version__
from fi_cache.caches.inventory import max_file_bytes
from fi_cache.errors import CorruptCache, FiCacheError, Refused
from fi_cache.model import v1
from fi_cache.model.fingerprint import FINGERPRINT_FIELDS, Fingerprint
from fi_cache.store import install, locks, trash
from fi_cache.store import manifest as manifests
from fi_cache.store.files import TMP_PREFIX, atomic_write
from fi_cache.store.namespace import NAMESPACES_DIR, Namespace

BUNDLE_MANIFEST = "fi-cache-bundle.json"
FORMAT = "fi-cache-bundle"
SCHEMA = 1
_SKIP_NAMES = {locks.LOCK_NAME, locks.HOLDER_NAME, locks.IN_USE_NAME}
_MB = 1024 * 1024


def max_member_bytes() -> int:
    return max_file_bytes()  # one cap for a cache file, wherever it comes from


def max_bundle_bytes() -> int:
    try:
        return int(os.environ.get("FI_CACHE_MAX_BUNDLE_MB", 4096)) * _MB
    except ValueError:
        return 4096 * _MB


@dataclass(frozen=True)
class BundledNamespace:
    path: str  # posix, relative to the store: namespaces/<fi>/<arch>/<gpu>/<mode>-<hash>
    fingerprint: Fingerprint
    finalize: str


@dataclass(frozen=True)
class BundleFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class BundleManifest:
    namespaces: tuple[BundledNamespace, ...]
    files: tuple[BundleFile, ...]
    created: float
    fi_cache_version: str

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema": SCHEMA,
            "fi_cache_version": self.fi_cache_version,
            "created": self.created,
            "namespaces": [
                {"path": n.path, "fingerprint": asdict(n.fingerprint), "finalize": n.finalize}
                for n in self.namespaces
            ],
            "files": [asdict(f) for f in self.files],
        }


def parse_manifest(data: Any) -> BundleManifest:
    """Raises Refused with the reason for anything that is not a bundle manifest."""
    try:
        if data["format"] != FORMAT or int(data["schema"]) != SCHEMA:
            raise Refused(f"not a schema-{SCHEMA} fi-cache bundle")
        namespaces = tuple(
            BundledNamespace(
                str(n["path"]),
                _fingerprint(n["fingerprint"]),
                str(n["finalize"]),
            )
            for n in data["namespaces"]
        )
        files = tuple(
            BundleFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
        )
        return BundleManifest(
            namespaces, files, float(data["created"]), str(data["fi_cache_version"])
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise Refused(f"malformed bundle manifest ({exc})") from None


def _fingerprint(data: Any) -> Fingerprint:
    values = {k: v for k, v in dict(data).items() if k in FINGERPRINT_FIELDS}
    if not all(v is None or isinstance(v, str) for v in values.values()):
        raise ValueError("fingerprint values must be strings")
    return Fingerprint(**values)


# --- export -------------------------------------------------------------------------------------


def _namespace_files(store: Path, ns_dir: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ns_dir):
        dirnames.sort()
        for name in sorted(filenames):
            if name in _SKIP_NAMES or name.startswith(TMP_PREFIX) or name.endswith(".tmp"):
                continue
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                out.append(path)
    return out


def export(store: Path, namespace_dirs: list[Path], out: Path) -> BundleManifest:
    """Write a bundle of `namespace_dirs` to `out` (atomically). Raises FiCacheError."""
    if not namespace_dirs:
        raise Refused("nothing to export: no namespace in the store matches", store)
    namespaces, files, members = [], [], []
    for ns_dir in namespace_dirs:
        # A read-only store (a mounted snapshot) cannot change under us: no lock needed there.
        writable = os.access(ns_dir, os.W_OK)
        lock = (
            locks.namespace_lock(ns_dir, "export", 60) if writable else contextlib.nullcontext()
        )
        with lock:
            m = manifests.load(ns_dir)
            if m is None:
                raise CorruptCache("namespace has no manifest (never warmed?)", ns_dir)
            rel = ns_dir.relative_to(store).as_posix()
            namespaces.append(BundledNamespace(rel, m.fingerprint, m.finalize))
            for path in _namespace_files(store, ns_dir):
                data = path.read_bytes()  # read under the lock: a consistent snapshot
                name = path.relative_to(store).as_posix()
                files.append(BundleFile(name, len(data), hashlib.sha256(data).hexdigest()))
                members.append((name, data))
    bm = BundleManifest(tuple(namespaces), tuple(files), time.time(), __version__)
    atomic_write(out, _tar_bytes(bm, members), lock=False)
    return bm


def _tar_bytes(bm: BundleManifest, members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            (BUNDLE_MANIFEST, json.dumps(bm.to_json(), indent=2).encode()),
            *members,
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(bm.created)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --- import -------------------------------------------------------------------------------------


def _safe_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or "\\" in name or any(part in ("..", "") for part in p.parts):
        raise Refused(f"bundle member {name!r} points outside the store")
    return p


def read_manifest(bundle: Path) -> tuple[BundleManifest, list[tarfile.TarInfo]]:
    """Open and vet a bundle without writing anything. Raises Refused (exit 2)."""
    try:
        with tarfile.open(bundle, mode="r:gz") as tar:
            members = tar.getmembers()  # reads the whole stream: a truncated gzip fails here
            if not members or members[0].name != BUNDLE_MANIFEST or not members[0].isfile():
                raise Refused(f"first member is not {BUNDLE_MANIFEST}", bundle)
            if members[0].size > _MB:
                raise Refused("bundle manifest is implausibly large", bundle)
            raw = tar.extractfile(members[0])
            data = json.loads(raw.read() if raw else b"")
    except FileNotFoundError:
        raise Refused("no such file", bundle) from None
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise Refused(f"not a readable tar.gz bundle ({exc})", bundle) from None
    bm = parse_manifest(data)
    _vet(bm, members[1:], bundle)
    return bm, members[1:]


def _vet(bm: BundleManifest, members: list[tarfile.TarInfo], bundle: Path) -> None:
    declared = {f.path: f for f in bm.files}
    if len(declared) != len(bm.files):
        raise Refused("bundle manifest lists a file twice", bundle)
    if bm.size > max_bundle_bytes():
        raise Refused(
            f"bundle declares {bm.size / _MB:.0f} MB, over the "
            f"{max_bundle_bytes() // _MB} MB limit (FI_CACHE_MAX_BUNDLE_MB)",
            bundle,
        )
    ns_paths = {n.path for n in bm.namespaces}
    if len(ns_paths) != len(bm.namespaces) or any(
        a != b and a.startswith(b + "/") for a in ns_paths for b in ns_paths
    ):
        raise Refused("bundle lists a namespace twice, or one inside another", bundle)
    for n in bm.namespaces:
        _safe_name(n.path)
        expected = Namespace(n.fingerprint, n.finalize).relpath.as_posix()  # type: ignore[arg-type]
        if n.finalize not in ("fused", "unfused") or n.path != expected:
            raise Refused(
                f"namespace {n.path!r} does not match its fingerprint ({expected})", bundle
            )
    seen = set()
    for m in members:
        name = _safe_name(m.name)
        if m.name in seen:
            raise Refused(f"bundle member {m.name!r} appears twice", bundle)
        if not m.isfile():
            kind = "symlink" if m.issym() else "hard link" if m.islnk() else "non-regular member"
            raise Refused(f"bundle member {m.name!r} is a {kind}", bundle)
        f = declared.get(m.name)
        if f is None:
            raise Refused(f"bundle member {m.name!r} is not in its manifest", bundle)
        if m.size != f.size or m.size > max_member_bytes():
            raise Refused(
                f"bundle member {m.name!r}: size {m.size} does not match or is over the limit",
                bundle,
            )
        if name.parts[0] != NAMESPACES_DIR or not any(m.name.startswith(p + "/") for p in ns_paths):
            raise Refused(f"bundle member {m.name!r} is outside its namespaces", bundle)
        seen.add(m.name)
    if missing := set(declared) - seen:
        raise Refused(f"bundle is missing {sorted(missing)[0]!r}", bundle)


def foreign_fields(bm: BundleManifest, here: Fingerprint) -> list[str]:
    """Fields where a bundled namespace's environment differs from this machine's (both known)."""
    out = []
    for n in bm.namespaces:
        for name in FINGERPRINT_FIELDS:
            theirs, ours = getattr(n.fingerprint, name), getattr(here, name)
            if theirs is not None and ours is not None and theirs != ours:
                out.append(f"{name}: bundle {theirs!r}, here {ours!r}")
    return sorted(set(out))


def import_bundle(store: Path, bundle: Path, here: Fingerprint, force: bool) -> BundleManifest:
    """Verify `bundle` completely, then install its namespaces. Raises Refused or FiCacheError."""
    bm, members = read_manifest(bundle)
    if (diff := foreign_fields(bm, here)) and not force:
        raise Refused(
            f"bundle is for another environment ({'; '.join(diff)}); --force to import anyway",
            bundle,
        )
    declared = {f.path: f for f in bm.files}
    staging = install.make_staging_dir(store)
    try:
        with tarfile.open(bundle, mode="r:gz") as tar:
            for m in members:
                src = tar.extractfile(m)
                if src is None:
                    raise Refused(f"cannot read bundle member {m.name!r}", bundle)
                digest = install.write_member(staging / m.name, src, m.size)
                if digest != declared[m.name].sha256:
                    raise Refused(f"checksum mismatch for {m.name!r}", bundle)
        _check_contents(staging, bm, bundle)
        for n in bm.namespaces:
            install.install_dir(staging / n.path, store / n.path, store)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused(f"bundle could not be read to the end ({exc})", bundle) from None
    finally:
        if staging.exists():
            trash.remove_tree(staging, store)
    return bm


def _check_contents(staging: Path, bm: BundleManifest, bundle: Path) -> None:
    """Checksums say the bytes are the sender's; this says they are caches and manifests."""
    for n in bm.namespaces:
        try:
            m = manifests.load(staging / n.path)
        except FiCacheError as exc:
            raise Refused(f"namespace {n.path}: {exc.message}", bundle) from None
        if m is None or m.fingerprint != n.fingerprint or m.finalize != n.finalize:
            raise Refused(f"namespace {n.path}: its manifest does not match the bundle's", bundle)
    for f in bm.files:
        if f.path.endswith(".json") and not f.path.endswith("/" + manifests.MANIFEST_NAME):
            try:
                v1.loads((staging / f.path).read_bytes())
            except v1.FormatError as exc:
                raise Refused(f"bundled cache {f.path}: {exc}", bundle) from None


def remote_key(fp: Fingerprint) -> str:
    """Where a machine's bundle lives under a push/pull URL: readable levels, then a hash of the
    whole fingerprint, so machines of every GPU type and software stack share one bucket."""
    from fi_cache.store.namespace import slug

    levels = [slug(fp.flashinfer_version), slug(fp.arch), slug(fp.gpu)]
    return "/".join([*levels, f"{fp.digest()[:16]}.tar.gz"])
