"""Bundles: one or more store namespaces in a tar.gz with a manifest of sha256 and sizes.

A bundle carries cache data only: each namespace's manifest and the caches discovery finds in it
(`content_files` says which; `content_refusal` is the rule on names). Export packs exactly that and
import accepts exactly that. Export reads the store under each namespace's lock. Import trusts
nothing: the manifest is vetted first (counts, declared sizes, names), then every tar header
before its data is decompressed, then the bytes (sha256) and the contents (every cache parses and,
without --force, was written in this environment) in a temp dir inside the store; only then is
each namespace renamed into place under its lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from fi_cache import __version__
from fi_cache.caches.discover import TMP_PATTERN, Found
from fi_cache.caches.inventory import MAX_FILE_ENV, MB, env_megabytes, max_file_bytes, scan
from fi_cache.errors import CorruptCache, FiCacheError, Refused, read_refusal
from fi_cache.fleet import node

# The manifest's types and parser (bundle_manifest.py), re-exported: callers know them here.
from fi_cache.fleet.bundle_manifest import FORMAT as FORMAT
from fi_cache.fleet.bundle_manifest import MAX_FILES as MAX_FILES
from fi_cache.fleet.bundle_manifest import SCHEMA as SCHEMA
from fi_cache.fleet.bundle_manifest import BundledNamespace as BundledNamespace
from fi_cache.fleet.bundle_manifest import BundleFile as BundleFile
from fi_cache.fleet.bundle_manifest import BundleManifest as BundleManifest
from fi_cache.fleet.bundle_manifest import parse_manifest as parse_manifest
from fi_cache.fleet.node import NodeRanks
from fi_cache.model import v2
from fi_cache.model.fingerprint import (
    FINGERPRINT_FIELDS,
    Fingerprint,
    compare_metadata,
    unsafe_field,
)
from fi_cache.store import install, locks
from fi_cache.store import manifest as manifests
from fi_cache.store import pin as pins
from fi_cache.store.files import TMP_PREFIX, atomic_write
from fi_cache.store.namespace import Namespace

BUNDLE_MANIFEST = "fi-cache-bundle.json"
_MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# A namespace's own manifest is a few kB (a store keeps its newest 1000 warm and evict records,
# store/manifest.py MAX_RECORDS); every ls, doctor and serve reads it, so a bundle's is bounded.
MAX_NAMESPACE_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_NAMESPACE_RECORDS = 10_000
# tarfile reads a PAX or GNU long-name header whole into memory before anyone sees the member;
# an export's are a few hundred bytes (one long path).
_MAX_EXTENDED_HEADER = 4096
# After the end-of-archive block a tar is zero-padded to its record (tarfile and GNU tar: 10 KB).
_MAX_TAR_PADDING = 2 * tarfile.RECORDSIZE
_EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
_LOCK_NAMES = {locks.LOCK_NAME, locks.HOLDER_NAME, locks.IN_USE_NAME}
_NAME_PART = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
)  # every name vLLM, FlashInfer, fi-cache write
_NS_DEPTH = len(Namespace(Fingerprint(), "fused").relpath.parts)  # namespaces/<fi>/<arch>/<gpu>/<m>


def max_member_bytes() -> int:
    return max_file_bytes()  # one cap for a cache file, wherever it comes from


def max_bundle_bytes() -> int:
    return env_megabytes("FI_CACHE_MAX_BUNDLE_MB", 4096) * MB


# --- what a bundle carries: export and import both go by these two ------------------------------


def content_refusal(rel: PurePosixPath) -> str | None:
    """Why the file at `rel` (inside a namespace dir) is no bundle content; None when it may be:
    the namespace manifest or a JSON cache. Locks, temp files and anything else stay home."""
    name = rel.name
    if name in _LOCK_NAMES or name.startswith(locks.LOCK_NAME):
        return "is a lock file"
    if TMP_PATTERN.match(name) or name.startswith(TMP_PREFIX) or name.endswith(".tmp"):
        return "is a temp file"
    if not rel.parts or not all(_NAME_PART.match(part) for part in rel.parts):
        return "has a name no cache has (hidden, or characters vLLM and FlashInfer never write)"
    if rel.suffix != ".json":
        return "is not a cache file"
    return None


def content_files(ns_dir: Path, found: Iterable[Found]) -> list[Path]:
    """The files of `ns_dir` a bundle carries: its manifest and the caches `found` there (v1
    files, v2 stores' manifest and entries), regular files only, by `content_refusal`."""
    paths = [ns_dir / manifests.MANIFEST_NAME]
    for f in found:
        if f.format == "v1":
            paths.append(f.path)
            continue
        paths.append(f.path / v2.MANIFEST)
        entries = f.path / v2.ENTRIES_DIR
        if entries.is_dir():
            paths.extend(sorted(p for p in entries.iterdir() if p.name.endswith(".json")))
    return [
        p
        for p in paths
        if _is_regular(p)
        and content_refusal(PurePosixPath(p.relative_to(ns_dir).as_posix())) is None
    ]


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


# --- export -------------------------------------------------------------------------------------


def _namespace_files(ns_dir: Path) -> list[Path]:
    """The files to bundle, each cache judged by verify's rules as import will judge it: a
    bundle no node can import is refused here, naming the file, not on every node later."""
    inv = scan([ns_dir], explicit=False)
    for p in inv.problems:
        raise Refused(p.message, p.path)
    for cache in inv.caches:
        if defects := cache.defects():
            raise Refused(
                f"{defects[0].message}: import would refuse the bundle (`fi-cache verify`, "
                "`fi-cache doctor --fix` quarantines it)",
                cache.path,
            )
    return content_files(ns_dir, [c.found for c in inv.caches])


def export(store: Path, namespace_dirs: list[Path], out: Path) -> BundleManifest:
    """Write a bundle of `namespace_dirs` to `out` (atomically). Raises FiCacheError."""
    if not namespace_dirs:
        raise Refused("nothing to export: no namespace in the store matches", store)
    namespaces, files, members = [], [], []
    for ns_dir in namespace_dirs:
        # A read-only store (a mounted snapshot) cannot change under us: no lock needed there.
        writable = os.access(ns_dir, os.W_OK)
        lock = locks.namespace_lock(ns_dir, "export", 60) if writable else contextlib.nullcontext()
        with lock:
            m = manifests.load(ns_dir)
            if m is None:
                raise CorruptCache("namespace has no manifest (never warmed?)", ns_dir)
            rel = ns_dir.relative_to(store).as_posix()
            namespaces.append(BundledNamespace(rel, m.fingerprint, m.finalize))
            for path in _namespace_files(ns_dir):
                if path.stat().st_size > max_member_bytes():  # import would refuse it
                    raise Refused(f"over the {_member_limit()}", path)
                data = path.read_bytes()  # read under the lock: a consistent snapshot
                name = path.relative_to(store).as_posix()
                files.append(BundleFile(name, len(data), hashlib.sha256(data).hexdigest()))
                members.append((name, data))
    if len(files) > MAX_FILES:
        raise Refused(f"{len(files)} files to bundle, over the limit of {MAX_FILES}", store)
    bm = BundleManifest(tuple(namespaces), tuple(files), time.time(), __version__)
    if bm.size > max_bundle_bytes():
        raise Refused(f"{bm.size / MB:.0f} MB to bundle, over the {_bundle_limit()}", store)
    atomic_write(out, _tar_bytes(bm, members), lock=False)
    return bm


def _member_limit() -> str:
    return f"{max_member_bytes() // MB} MB limit ({MAX_FILE_ENV})"


def _bundle_limit() -> str:
    return f"{max_bundle_bytes() // MB} MB limit (FI_CACHE_MAX_BUNDLE_MB)"


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


# --- import: reading and vetting, nothing written -----------------------------------------------


class _Header(tarfile.TarInfo):
    """A tar header that refuses, before tarfile reads it, what no export writes and what would
    cost memory or time out of proportion: an oversized extended header, a sparse member."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise Refused(f"bundle member {self.name!r} is a sparse file")
        if self.type in _EXTENDED and self.size > _MAX_EXTENDED_HEADER:
            raise Refused(
                f"bundle has a {self.size}-byte extended tar header (no export writes one)"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc, no-any-return]


@dataclass(frozen=True)
class OpenBundle:
    """A bundle whose manifest and tar headers passed every check, still open for the install."""

    path: Path
    file: IO[bytes]
    manifest: BundleManifest
    members: list[tarfile.TarInfo]


@contextlib.contextmanager
def open_bundle(bundle: Path) -> Iterator[OpenBundle]:
    """Open and vet a bundle without writing anything. Raises Refused (exit 2)."""
    with _open_regular(bundle) as f:
        bm, members = _read_headers(f, bundle)
        yield OpenBundle(bundle, f, bm, members)


def read_manifest(bundle: Path) -> tuple[BundleManifest, list[tarfile.TarInfo]]:
    with open_bundle(bundle) as opened:
        return opened.manifest, opened.members


def _open_regular(bundle: Path) -> IO[bytes]:
    """The bundle, opened without blocking: a FIFO or device named as one is refused at once."""
    try:
        fd = os.open(
            bundle, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        )
    except OSError as exc:
        raise read_refusal(exc, bundle, "bundle") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refused("is a directory, not a bundle", bundle)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not a regular file (a FIFO or device is no bundle)", bundle)
        if st.st_size > max_bundle_bytes():
            raise Refused(f"bundle is {st.st_size / MB:.0f} MB, over the {_bundle_limit()}", bundle)
        return os.fdopen(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def _read_headers(f: IO[bytes], bundle: Path) -> tuple[BundleManifest, list[tarfile.TarInfo]]:
    """The manifest, vetted, then every tar header, each checked before its data is read."""
    try:
        with tarfile.open(fileobj=f, mode="r:gz", tarinfo=_Header) as tar:
            first = tar.next()
            if first is None or first.name != BUNDLE_MANIFEST or not _is_plain(first):
                raise Refused(f"first member is not {BUNDLE_MANIFEST}", bundle)
            if first.size > _MAX_MANIFEST_BYTES:
                raise Refused(
                    f"bundle manifest is implausibly large ({first.size / MB:.0f} MB)", bundle
                )
            raw = tar.extractfile(first)
            bm = _parse(raw.read() if raw else b"", bundle)
            _vet_manifest(bm, bundle)
            members = _vet_members(tar, bm, bundle)
            _check_gzip_end(tar, bundle)
            return bm, members
    except Refused as exc:
        raise Refused(exc.message, exc.path or bundle) from None
    except (tarfile.TarError, EOFError, OSError, ValueError, RecursionError) as exc:
        raise Refused(f"not a readable tar.gz bundle ({exc})", bundle) from None


def _parse(raw: bytes, bundle: Path) -> BundleManifest:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused(f"bundle manifest is not JSON ({exc})", bundle) from None
    return parse_manifest(data)


def _is_plain(m: tarfile.TarInfo) -> bool:
    return m.type in (tarfile.REGTYPE, tarfile.AREGTYPE)  # what export writes, nothing sparse


def _safe_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or "\\" in name or any(part in ("..", "") for part in p.parts):
        raise Refused(f"bundle member {name!r} points outside the store")
    return p


def _vet_manifest(bm: BundleManifest, bundle: Path) -> None:
    """Everything the manifest alone can show, before any member's data is read."""
    declared = {f.path for f in bm.files}
    if len(declared) != len(bm.files):
        raise Refused("bundle manifest lists a file twice", bundle)
    if bm.size > max_bundle_bytes():
        raise Refused(f"bundle declares {bm.size / MB:.0f} MB, over the {_bundle_limit()}", bundle)
    ns_paths = {n.path for n in bm.namespaces}
    if len(ns_paths) != len(bm.namespaces):
        raise Refused("bundle lists a namespace twice, or one inside another", bundle)
    for n in bm.namespaces:
        _safe_name(n.path)
        if (bad := unsafe_field(n.fingerprint)) is not None:  # --force or not: paths come of it
            raise Refused(
                f"namespace {n.path!r}: fingerprint {bad} is no plain name (a path separator, "
                "'..' or a control character): refused, --force or not",
                bundle,
            )
        expected = Namespace(n.fingerprint, n.finalize).relpath.as_posix()  # type: ignore[arg-type]
        if n.finalize not in ("fused", "unfused") or n.path != expected:
            raise Refused(
                f"namespace {n.path!r} does not match its fingerprint ({expected})", bundle
            )
        if f"{n.path}/{manifests.MANIFEST_NAME}" not in declared:
            raise Refused(f"namespace {n.path!r} has no {manifests.MANIFEST_NAME}", bundle)
    for f in bm.files:  # every path is a namespace's and of an expected depth: none nests
        parts = _safe_name(f.path).parts
        if len(parts) <= _NS_DEPTH or "/".join(parts[:_NS_DEPTH]) not in ns_paths:
            raise Refused(f"bundle member {f.path!r} is outside its namespaces", bundle)
        if reason := content_refusal(PurePosixPath(*parts[_NS_DEPTH:])):
            raise Refused(
                f"bundle member {f.path!r} {reason}: a bundle carries cache files and the "
                "namespace manifest only",
                bundle,
            )
        if f.size > max_member_bytes():
            raise Refused(
                f"bundle member {f.path!r} declares {f.size / MB:.0f} MB, over the "
                f"{_member_limit()}",
                bundle,
            )
        if parts[_NS_DEPTH:] == (manifests.MANIFEST_NAME,) and (
            f.size > MAX_NAMESPACE_MANIFEST_BYTES
        ):
            raise Refused(
                f"namespace manifest {f.path!r} declares {f.size / MB:.1f} MB, over the "
                f"{MAX_NAMESPACE_MANIFEST_BYTES // MB} MB limit (a namespace's manifest is a "
                "few kB)",
                bundle,
            )


def _vet_members(tar: tarfile.TarFile, bm: BundleManifest, bundle: Path) -> list[tarfile.TarInfo]:
    """Each header against the manifest as it comes: one that is not listed, or not as listed,
    is refused before its data (or anything after it) is decompressed."""
    declared = {f.path: f for f in bm.files}
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    while (m := tar.next()) is not None:
        _safe_name(m.name)
        if m.name in seen:
            raise Refused(f"bundle member {m.name!r} appears twice", bundle)
        if not _is_plain(m):
            kind = "symlink" if m.issym() else "hard link" if m.islnk() else "non-regular member"
            raise Refused(f"bundle member {m.name!r} is a {kind}", bundle)
        f = declared.get(m.name)
        if f is None:
            raise Refused(f"bundle member {m.name!r} is not in its manifest", bundle)
        if m.size != f.size:
            raise Refused(
                f"bundle member {m.name!r}: its tar header says {m.size} bytes, "
                f"its manifest {f.size}",
                bundle,
            )
        seen.add(m.name)
        members.append(m)
    if missing := set(declared) - seen:
        raise Refused(f"bundle is missing {sorted(missing)[0]!r}", bundle)
    return members


def _check_gzip_end(tar: tarfile.TarFile, bundle: Path) -> None:
    """Read the gzip stream to its end, where gzip checks its CRC32 and length: tarfile stops
    at the tar's end-of-archive blocks and never gets there, so a damaged or cut trailer went
    unseen. Raises BadGzipFile/EOFError there; more than a tar record of padding is refused."""
    stream = tar.fileobj
    if stream is not None and len(stream.read(_MAX_TAR_PADDING + 1)) > _MAX_TAR_PADDING:
        raise Refused("bundle holds data after its last member (no export writes that)", bundle)


def foreign_fields(bm: BundleManifest, here: Fingerprint) -> list[str]:
    """Fields where a bundled namespace's environment differs from this machine's (both known)."""
    out = []
    for n in bm.namespaces:
        for name in FINGERPRINT_FIELDS:
            theirs, ours = getattr(n.fingerprint, name), getattr(here, name)
            if theirs is not None and ours is not None and theirs != ours:
                out.append(f"{name}: bundle {theirs!r}, here {ours!r}")
    return sorted(set(out))


# --- import: installing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """An import: the bundle's manifest, and this node's rank files kept (node.py)."""

    manifest: BundleManifest
    node: NodeRanks


def import_bundle(store: Path, bundle: Path, here: Fingerprint, force: bool) -> Installed:
    """Verify `bundle` completely, then install its namespaces. Raises Refused or FiCacheError."""
    with open_bundle(bundle) as opened:
        return install_bundle(store, opened, here, force)


def install_bundle(store: Path, opened: OpenBundle, here: Fingerprint, force: bool) -> Installed:
    """Install a vetted bundle: its bytes (sha256) and contents checked in a staging dir first.
    Rank files of this node's that the bundle (another node's) lacks are written anew beside
    the bundle's (node.py), so the engine does not re-tune every rank for them."""
    bm, bundle = opened.manifest, opened.path
    _refuse_before_unpacking(store, bm, bundle, here, force)
    staging = install.make_staging_dir(store)
    try:
        _unpack_checked(opened, staging, here, force)
        for n in bm.namespaces:  # a pin is the store's own decision: it does not travel
            pins.drop_staged(staging / n.path)
        mine = {n.path: node.own_rank_files(store / n.path) for n in bm.namespaces}
        for n in bm.namespaces:
            install.install_dir(staging / n.path, store / n.path, store)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused(f"bundle could not be read to the end ({exc})", bundle) from None
    finally:
        if staging.exists():
            install.discard_staging_dir(staging)
    return Installed(bm, node.keep(store, mine))


def _refuse_before_unpacking(
    store: Path, bm: BundleManifest, bundle: Path, here: Fingerprint, force: bool
) -> None:
    if (diff := foreign_fields(bm, here)) and not force:
        raise Refused(
            f"bundle is for another environment ({'; '.join(diff)}); --force to import anyway",
            bundle,
        )
    for n in bm.namespaces:  # refused before anything is unpacked
        if pins.pinned(store / n.path) is not None:
            raise pins.refusal(store / n.path, "an import")


def _unpack_checked(opened: OpenBundle, staging: Path, here: Fingerprint, force: bool) -> None:
    """Unpack every member into `staging`, checking its sha256, then the namespaces' contents."""
    bm, bundle = opened.manifest, opened.path
    declared = {f.path: f for f in bm.files}
    opened.file.seek(0)
    with tarfile.open(fileobj=opened.file, mode="r:gz", tarinfo=_Header) as tar:
        for m in opened.members:
            src = tar.extractfile(m)
            if src is None:
                raise Refused(f"cannot read bundle member {m.name!r}", bundle)
            digest = install.write_member(staging / m.name, src, m.size)
            if digest != declared[m.name].sha256:
                raise Refused(f"checksum mismatch for {m.name!r}", bundle)
    _check_contents(staging, bm, bundle, None if force else here)


@dataclass(frozen=True)
class PlannedNamespace:
    """What an import would do with one bundled namespace (`import --dry-run`)."""

    path: str  # relative to the store
    replaces: bool  # a namespace of that path is there now (it would go to .trash/)


def plan_install(
    store: Path, opened: OpenBundle, here: Fingerprint, force: bool
) -> list[PlannedNamespace]:
    """What install_bundle would do, refused where it would refuse, with nothing written to the
    store and no lock taken: the members are unpacked and checked in a private temp dir."""
    import tempfile

    bm, bundle = opened.manifest, opened.path
    _refuse_before_unpacking(store, bm, bundle, here, force)
    _refuse_unwritable(store)
    try:
        with tempfile.TemporaryDirectory(prefix="fi-cache-dry-run-") as tmp:
            _unpack_checked(opened, Path(tmp), here, force)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused(f"bundle could not be read to the end ({exc})", bundle) from None
    for n in bm.namespaces:  # as install.install_dir says it, under the lock the real run takes
        if locks.in_use(store / n.path):
            raise FiCacheError(
                "in use by a running `fi-cache serve`: import after it stops", store / n.path
            )
    return [PlannedNamespace(n.path, (store / n.path).is_dir()) for n in bm.namespaces]


def _refuse_unwritable(store: Path) -> None:
    """What install.make_staging_dir would refuse, asked without writing: the store (or the dir
    that would hold it) on a read-only mount or without write permission."""
    where = store
    while not where.exists() and where.parent != where:
        where = where.parent
    if not os.access(where, os.W_OK):
        read_only = os.statvfs(where).f_flag & os.ST_RDONLY
        why = "Read-only file system" if read_only else "Permission denied"
        raise Refused(f"store is not writable: {why}", store)


def _check_contents(
    staging: Path, bm: BundleManifest, bundle: Path, here: Fingerprint | None
) -> None:
    """Checksums say the bytes are the sender's; this says they are a namespace manifest and
    caches, every one of which parses and (unless `here` is None: --force) fits this machine."""
    covered: set[str] = set()
    for n in bm.namespaces:
        ns_dir = staging / n.path
        try:
            m = manifests.load(ns_dir)
        except FiCacheError as exc:
            raise Refused(f"namespace {n.path}: {exc.message}", bundle) from None
        if m is None or m.fingerprint != n.fingerprint or m.finalize != n.finalize:
            raise Refused(f"namespace {n.path}: its manifest does not match the bundle's", bundle)
        if (records := len(m.warms) + len(m.evictions)) > MAX_NAMESPACE_RECORDS:
            raise Refused(
                f"namespace {n.path}: its manifest holds {records} warm and evict records, "
                f"over the limit of {MAX_NAMESPACE_RECORDS}",
                bundle,
            )
        inv = scan([ns_dir], explicit=False)
        for p in inv.problems:
            raise Refused(f"bundled cache {_member(p.path, staging)}: {p.message}", bundle)
        for cache in inv.caches:
            member = _member(cache.path, staging)
            if cache.found.format == "v2":
                member = f"{member}/{v2.MANIFEST}"  # where a v2 store records its environment
            # verify's rules, the loaders' own: one such file on a bucket fails a fleet's starts
            if defects := cache.defects():
                raise Refused(f"bundled cache {member}: {defects[0].message}", bundle)
            foreign = [x for x in compare_metadata(cache.metadata, here) if x.hard] if here else []
            if foreign:
                fields = "; ".join(
                    f"{x.field}: cache {x.saved!r}, here {x.target!r}" for x in foreign
                )
                raise Refused(
                    f"bundle member {member!r} was written in another environment ({fields}); "
                    "--force to import anyway",
                    bundle,
                )
        found = [c.found for c in inv.caches]
        covered.update(_member(p, staging) for p in content_files(ns_dir, found))
    for f in bm.files:
        if f.path not in covered:
            raise Refused(
                f"bundle member {f.path!r} is not a cache fi-cache can read (nor a namespace "
                "manifest): a bundle carries cache files and the namespace manifest only",
                bundle,
            )


def _member(path: Path, staging: Path) -> str:
    try:
        return path.relative_to(staging).as_posix()
    except ValueError:
        return str(path)


def remote_key(fp: Fingerprint) -> str:
    """Where a machine's bundle lives under a push/pull URL: readable levels, then a hash of the
    whole fingerprint, so machines of every GPU type and software stack share one bucket."""
    from fi_cache.store.namespace import slug

    levels = [slug(fp.flashinfer_version), slug(fp.arch), slug(fp.gpu)]
    return "/".join([*levels, f"{fp.digest()[:16]}.tar.gz"])
