"""push / pull: bundles to and from object storage (any fsspec URL), one key per environment.

A machine's bundle lives at `<URL>/<fi>/<arch>/<gpu>/<digest16>.tar.gz` (bundle.remote_key), so
machines of every GPU type and software stack share one bucket and a pull picks its own by
computing the key. Beside it, `<key>.json` (the sidecar) records the bundle's size and sha256:
a pull checks the download against it before the tar is opened, then `bundle.import_bundle`
verifies every member as `fi-cache import` does. fi-cache never runs a server: the object
store is the shared engine.

fsspec (and s3fs for s3://) is an optional extra, imported only here and only when used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from fi_cache import __version__
from fi_cache.caches.inventory import MB
from fi_cache.errors import EXIT_REFUSED, FiCacheError, Refused
from fi_cache.fleet import bundle
from fi_cache.fleet.bundle import BundleManifest, Installed
from fi_cache.fleet.node import NodeRanks
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import files, install
from fi_cache.store.namespace import unknown_levels

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)

SIDECAR_FORMAT = "fi-cache-remote-bundle"
SIDECAR_SCHEMA = 1
SIDECAR_SUFFIX = ".json"
_CHUNK = 8 * MB
_MAX_SIDECAR = MB
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_INSTALL_HINT = "pip install 'fi-cache[fleet]'"
# Filesystems with real directories and an atomic rename: upload to a temp name, then rename.
# Everything else is an object store (s3, gs, az, memory, ...), where one PUT or a completed
# multipart upload is atomic by itself: readers see the old object or the new one, never half.
_RENAMES = frozenset({"file", "local", "sftp", "ssh", "smb"})


@dataclass(frozen=True)
class Transferred:
    """What push or pull moved: the remote bundle's URL, size and sha256, and its manifest."""

    url: str
    key: str
    size: int
    sha256: str
    manifest: BundleManifest
    # This node's rank files an import kept (pull; a push moves none).
    node: NodeRanks = field(default_factory=NodeRanks)
    # pull --dry-run: what the import would do (nothing was imported); None otherwise.
    planned: list[bundle.PlannedNamespace] | None = None


@dataclass(frozen=True)
class Sidecar:
    key: str
    size: int
    sha256: str
    created: float
    fingerprint: dict[str, Any]

    def to_json(self, bm: BundleManifest) -> dict[str, Any]:
        return {
            "format": SIDECAR_FORMAT,
            "schema": SIDECAR_SCHEMA,
            "fi_cache_version": __version__,
            **asdict(self),
            "namespaces": [n.path for n in bm.namespaces],
            "files": len(bm.files),
            "content_size": bm.size,
        }


# --- fsspec access ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remote:
    """A filesystem and the base path under it that the user's URL names."""

    fs: Any
    base: str
    url: str

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def display(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"

    @property
    def renames(self) -> bool:
        return bool(self._protocols & _RENAMES)

    @property
    def local(self) -> bool:
        return bool(self._protocols & {"file", "local"})

    @property
    def _protocols(self) -> set[str]:
        protocols = self.fs.protocol
        return {protocols} if isinstance(protocols, str) else set(protocols)


def _fsspec() -> Any:
    try:
        import fsspec  # type: ignore[import-untyped, unused-ignore]  # optional extra, deferred
    except ImportError:
        raise Refused(f"push/pull need fsspec: {_INSTALL_HINT}") from None
    return fsspec


def _missing_package(protocol: str) -> str:
    """The package fsspec names for `protocol` ("s3" -> "s3fs"), if it knows one."""
    from fsspec.registry import known_implementations  # type: ignore[import-untyped, unused-ignore]

    impl = known_implementations.get(protocol, {}).get("class", "")
    return str(impl).split(".")[0] if impl else ""


def _refuse_placeless(url: str) -> None:
    """Refused (exit 2) for a URL that names no remote place: fsspec reads '', '-' and
    'file://' as the working directory, and a control character prints as another name."""
    scheme, sep, rest = url.partition("://")
    if not url.strip() or (sep and not rest and "/" not in scheme):
        raise Refused(f"URL {url!r} names no place: give s3://BUCKET/DIR, file:///DIR or a path")
    if url == "-":
        raise Refused("URL '-' names no place (bundles do not go to stdout): give a URL or a path")
    if any(unicodedata.category(c) == "Cc" for c in url):
        raise Refused(
            f"URL {url!r} holds a control character: refusing a name that prints as another"
        )


def open_remote(url: str) -> Remote:
    """The filesystem behind `url`. Raises Refused for a bad or unsupported URL."""
    _refuse_placeless(url)
    fsspec = _fsspec()
    scheme = url.partition("://")[0] if "://" in url else "file"
    try:
        fs, base = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        package = _missing_package(scheme)
        hint = _INSTALL_HINT if scheme in ("s3", "s3a") else f"pip install {package}"
        raise Refused(f"{scheme}:// needs {package or 'a package'} ({exc}): {hint}", url) from None
    except (ValueError, TypeError) as exc:
        raise Refused(f"not a usable fsspec URL: {_one_line(exc)}", url) from None
    except Exception as exc:  # a backend's constructor may raise anything (config, credentials)
        raise FiCacheError(f"cannot open: {_one_line(exc)}", url) from None
    return Remote(fs, str(base).rstrip("/"), url)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text[:300]}"


@contextlib.contextmanager
def _remote_errors(what: str, where: str) -> Iterator[None]:
    """Backend failures (network, permissions, missing bucket) become one line, exit 1."""
    try:
        yield
    except FiCacheError:
        raise
    except Exception as exc:  # fsspec backends raise their own types (botocore, aiohttp, OSError)
        raise FiCacheError(f"{what} failed: {_one_line(exc)}", where) from None


# --- push ---------------------------------------------------------------------------------------


def _temp_in_store(store: Path, what: str) -> Path:
    """A fresh name under the store's state dir (`.fi-cache-` prefix: doctor knows leftovers)."""
    from fi_cache.store.paths import state_dir

    name = f"{files.TMP_PREFIX}{what}-{os.getpid()}-{secrets.token_hex(6)}.tar.gz.tmp"
    return state_dir(store) / name


def _one_fingerprint(namespace_dirs: list[Path]) -> Fingerprint:
    """The environment the bundle is for; one key holds one environment."""
    from fi_cache.store import manifest as manifests

    fps = set()
    for d in namespace_dirs:
        m = manifests.load(d)
        if m is None:
            raise Refused("namespace has no manifest (never warmed?)", d)
        fps.add(m.fingerprint)
    if len(fps) != 1:
        raise Refused(
            f"{len(fps)} environments selected: push bundles one environment at a time "
            "(--namespace here, fused, unfused or one namespace dir)"
        )
    return fps.pop()


def push(
    store: Path,
    url: str,
    namespace_dirs: list[Path],
    progress: Progress | None = None,
    allow_unknown: bool = False,
) -> Transferred:
    """Export `namespace_dirs` (one environment) and upload the bundle and its sidecar. An
    environment with undetected key levels is refused unless `allow_unknown`."""
    remote = open_remote(url)  # a bad URL fails before the export's work
    if not namespace_dirs:
        raise Refused("nothing to push: no namespace of this machine in the store (warm first)")
    fp = _one_fingerprint(namespace_dirs)
    key = bundle.remote_key(fp)
    if (unknown := unknown_levels(fp)) and not allow_unknown:
        raise Refused(
            f"{', '.join(unknown)} not detected where it was warmed, so key {key} is the one "
            "every machine with the same failed detection pulls; fix the detection there "
            "(`fi-cache env`) and warm again, or pass --allow-unknown",
            namespace_dirs[0],
        )
    _refuse_local_destination(remote, key)
    local = _temp_in_store(store, "push")
    try:
        bm = bundle.export(store, namespace_dirs, local)
        size, digest = local.stat().st_size, _sha256(local)
        sidecar = Sidecar(key, size, digest, bm.created, asdict(fp))
        with _remote_errors("upload", remote.display(key)):
            # Bundle first, sidecar second: a pull that races a push sees a sha256 mismatch
            # (and retries once), never a sidecar that vouches for a bundle not yet there.
            _upload_file(remote, local, remote.path(key), progress)
            data = json.dumps(sidecar.to_json(bm), indent=2).encode()
            _upload_bytes(remote, data, remote.path(key + SIDECAR_SUFFIX))
    finally:
        files.remove_file(local)
    return Transferred(remote.display(key), key, size, digest, bm)


def _refuse_local_destination(remote: Remote, key: str) -> None:
    """A file:// push replaces only files, as every writer does: a directory, FIFO or device
    where the bundle or its sidecar goes (or where the URL's directory is) is refused."""
    if not remote.local:
        return
    base = Path(remote.base or ".")
    if base.exists() and not base.is_dir():
        raise Refused("is not a directory: a push URL names the directory bundles go under", base)
    files.refuse_destination(Path(remote.path(key)), "bundle file")
    files.refuse_destination(Path(remote.path(key + SIDECAR_SUFFIX)), "bundle sidecar file")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _temp_remote(path: str) -> str:
    return f"{path}.{secrets.token_hex(6)}.partial"


def _upload_file(remote: Remote, src: Path, dest: str, progress: Progress | None) -> None:
    fs = remote.fs
    if not remote.renames:
        fs.put_file(str(src), dest, callback=_fsspec_callback(progress))
        return
    fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
    tmp = _temp_remote(dest)
    total, done = src.stat().st_size, 0
    try:
        with open(src, "rb") as f, fs.open(tmp, "wb") as out:
            for block in iter(lambda: f.read(_CHUNK), b""):
                out.write(block)
                done += len(block)
                if progress:
                    progress(done, total)
        fs.mv(tmp, dest)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm_file(tmp)
        raise


def _upload_bytes(remote: Remote, data: bytes, dest: str) -> None:
    fs = remote.fs
    if not remote.renames:
        fs.pipe_file(dest, data)  # one PUT
        return
    tmp = _temp_remote(dest)
    try:
        fs.pipe_file(tmp, data)
        fs.mv(tmp, dest)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm_file(tmp)
        raise


def _fsspec_callback(progress: Progress | None) -> Any:
    from fsspec.callbacks import (  # type: ignore[import-untyped, unused-ignore]
        DEFAULT_CALLBACK,
        Callback,
    )

    if progress is None:
        return DEFAULT_CALLBACK
    report: Progress = progress

    class _Report(Callback):  # type: ignore[misc]
        def call(self, *args: Any, **kwargs: Any) -> None:
            report(int(self.value or 0), int(self.size or 0))

    return _Report()


# --- pull ---------------------------------------------------------------------------------------


def _parse_sidecar(raw: bytes, key: str, where: str) -> Sidecar:
    try:
        data = json.loads(raw)
        if data["format"] != SIDECAR_FORMAT or int(data["schema"]) != SIDECAR_SCHEMA:
            raise ValueError(f"not a schema-{SIDECAR_SCHEMA} {SIDECAR_FORMAT} sidecar")
        sidecar = Sidecar(
            str(data["key"]),
            int(data["size"]),
            str(data["sha256"]),
            float(data["created"]),
            dict(data["fingerprint"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
        raise Refused(f"malformed sidecar ({exc})", where) from None
    if sidecar.key != key or not _SHA256.match(sidecar.sha256) or sidecar.size < 0:
        raise Refused("sidecar does not describe this bundle (key, sha256 or size)", where)
    return sidecar


def _remote_size(remote: Remote, path: str, where: str) -> int | None:
    """The size of the file at `path`; Refused when it is none (file:// can hold a FIFO or a
    link to /dev/zero, which a read would wait on, or read forever)."""
    info = remote.fs.info(path)
    if info.get("type", "file") != "file":
        kind = info.get("type")
        raise Refused(
            f"is not a regular file ({kind!r}); a bundle and its sidecar are files", where
        )
    size = info.get("size")
    return None if size is None else int(size)


def _read_sidecar(remote: Remote, key: str) -> Sidecar | None:
    """The sidecar under `key`, None when there is none."""
    path = remote.path(key + SIDECAR_SUFFIX)
    where = remote.display(key + SIDECAR_SUFFIX)
    with _remote_errors("reading the sidecar", where):
        try:
            _remote_size(remote, path, where)
            raw = remote.fs.cat_file(path, start=0, end=_MAX_SIDECAR + 1)
        except FileNotFoundError:
            return None
    if len(raw) > _MAX_SIDECAR:
        raise Refused("sidecar is implausibly large", where)
    return _parse_sidecar(raw, key, where)


def available(remote: Remote) -> list[str]:
    """Keys of the bundles under the URL. Raises FiCacheError when it cannot be listed."""
    prefix = remote.base + "/" if remote.base else ""
    with _remote_errors("listing", remote.url):
        try:
            names = remote.fs.find(remote.base)
        except FileNotFoundError:
            return []
    return sorted(
        str(n)[len(prefix) :]
        for n in names
        if str(n).startswith(prefix) and str(n).endswith(".tar.gz")
    )


def _no_bundle(remote: Remote, key: str, here: Fingerprint) -> Refused:
    who = f"FlashInfer {here.flashinfer_version or '?'}, arch {here.arch or '?'}, " + (
        f"GPU {here.gpu or '?'}"
    )
    return Refused(
        f"no bundle for this machine ({who}) at key {key}; {_others(remote, key)}", remote.url
    )


def _others(remote: Remote, key: str) -> str:
    """What the URL holds instead, same FlashInfer/arch/GPU first (a listing only explains)."""
    try:
        keys = available(remote)
    except FiCacheError as exc:
        return f"could not list what the URL holds ({exc.message})"
    if not keys:
        return "the URL holds no bundles (push from a machine like this one first)"
    same_dir = key.rsplit("/", 1)[0] + "/"
    keys.sort(key=lambda k: (not k.startswith(same_dir), k))
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return (
        f"it holds {len(keys)} bundle(s) for other environments: {shown} "
        "(pull one with --key KEY --force, or push from a machine like this one)"
    )


def _checked_key(key: str) -> str:
    """A --key must name a bundle under the URL, not a path out of it."""
    parts = key.strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts) or "\\" in key or not key.endswith(".tar.gz"):
        raise Refused(f"--key {key!r} is not a bundle key like <fi>/<arch>/<gpu>/<hash>.tar.gz")
    return "/".join(parts)


def _exists(remote: Remote, key: str) -> bool:
    with _remote_errors("looking up the bundle", remote.display(key)):
        return bool(remote.fs.exists(remote.path(key)))


def _check_bucket(remote: Remote) -> None:
    """A missing bucket is the storage's failure (exit 1, as push says it), not a missing bundle:
    object stores report both as "not found", so ask about the bucket itself."""
    split = getattr(remote.fs, "split_path", None)  # s3fs, gcsfs, adlfs: (bucket, key, version)
    if split is None or not remote.base:
        return
    bucket = str(split(remote.base)[0])
    try:
        remote.fs.ls(bucket, detail=False)
    except FileNotFoundError:
        raise FiCacheError(
            f"pull failed: the bucket {bucket!r} does not exist", remote.url
        ) from None
    except Exception:  # denied or unreachable: the missing bundle is the news
        return


def _no_sidecar(remote: Remote, key: str) -> Refused:
    return Refused(
        f"bundle has no {SIDECAR_SUFFIX} sidecar to check it against (push it with fi-cache push)",
        remote.display(key),
    )


class _Counting:
    """A read-only file that reports progress as it is read."""

    def __init__(self, f: Any, total: int, progress: Progress | None) -> None:
        self.f, self.total, self.progress, self.done = f, total, progress, 0

    def read(self, n: int = -1) -> bytes:
        block: bytes = self.f.read(n)
        self.done += len(block)
        if self.progress:
            self.progress(min(self.done, self.total), self.total)
        return block


class _Mismatch(Refused):
    """The bundle is not what its sidecar says: tampered, or replaced by a push mid-pull."""

    def __init__(self, message: str, where: str, sidecar: Sidecar) -> None:
        super().__init__(message, where)
        self.sidecar = sidecar


def _download(remote: Remote, key: str, sidecar: Sidecar, dest: Path, pr: Progress | None) -> None:
    """Stream the bundle into `dest` (through install.write_member), checked against `sidecar`."""
    where = remote.display(key)
    with _remote_errors("download", where):
        size = _remote_size(remote, remote.path(key), where)
        if size is not None and size != sidecar.size:
            raise _Mismatch(
                f"bundle is {size} bytes, its sidecar says {sidecar.size}", where, sidecar
            )
        with remote.fs.open(remote.path(key), "rb", block_size=_CHUNK) as f:
            if pr:
                pr(0, sidecar.size)
            src = cast("IO[bytes]", _Counting(f, sidecar.size, pr))  # write_member only reads
            try:
                digest = install.write_member(dest, src, sidecar.size)
            except Refused:
                raise _Mismatch("bundle ends early (truncated)", where, sidecar) from None
            if f.read(1):
                raise _Mismatch("bundle is longer than its sidecar says", where, sidecar)
    if digest != sidecar.sha256:
        raise _Mismatch("bundle does not match its sidecar's sha256", where, sidecar)


def pull(
    store: Path,
    url: str,
    *,
    force: bool = False,
    progress: Progress | None = None,
    key: str | None = None,
    dry_run: bool = False,
) -> Transferred:
    """Download this machine's bundle (or `key`'s), check it against its sidecar, import it.
    `dry_run`: the download goes to a private temp dir outside the store and is checked as
    import checks it; nothing is imported, no lock taken."""
    from fi_cache import environment
    from fi_cache.store.paths import state_dir

    remote = open_remote(url)
    here = environment.detect(state_dir(store)).fingerprint
    key = _checked_key(key) if key else bundle.remote_key(here)
    for attempt in (1, 2):
        try:
            return _pull_once(store, remote, key, here, force, progress, dry_run)
        except _Mismatch as exc:
            if attempt == 1 and _read_sidecar(remote, key) != exc.sidecar:
                continue  # a push replaced the bundle while we read it: once more
            message = f"{exc.message} (tampered or corrupted; nothing imported)"
            raise Refused(message, exc.path) from None
    raise AssertionError("unreachable")


def _pull_once(
    store: Path,
    remote: Remote,
    key: str,
    here: Fingerprint,
    force: bool,
    pr: Progress | None,
    dry_run: bool = False,
) -> Transferred:
    sidecar = _read_sidecar(remote, key)
    if sidecar is None:
        if _exists(remote, key):
            raise _no_sidecar(remote, key)
        _check_bucket(remote)
        raise _no_bundle(remote, key, here)
    where = remote.display(key)
    if sidecar.size > bundle.max_bundle_bytes():
        raise Refused(
            f"bundle is {sidecar.size / MB:.0f} MB, over the "
            f"{bundle.max_bundle_bytes() // MB} MB limit (FI_CACHE_MAX_BUNDLE_MB)",
            where,
        )
    if dry_run:
        return _dry_pull(store, remote, key, here, force, pr, sidecar)
    local = _temp_in_store(store, "pull")
    try:
        _download(remote, key, sidecar, local, pr)
        installed = _import(store, local, here, force, where)
    finally:
        files.remove_file(local)
    return Transferred(where, key, sidecar.size, sidecar.sha256, installed.manifest, installed.node)


def _dry_pull(
    store: Path,
    remote: Remote,
    key: str,
    here: Fingerprint,
    force: bool,
    pr: Progress | None,
    sidecar: Sidecar,
) -> Transferred:
    import tempfile

    where = remote.display(key)
    with tempfile.TemporaryDirectory(prefix="fi-cache-dry-run-") as tmp:
        local = Path(tmp) / "bundle.tar.gz"
        _download(remote, key, sidecar, local, pr)
        try:
            with bundle.open_bundle(local) as opened:
                planned = bundle.plan_install(store, opened, here, force)
        except FiCacheError as exc:
            if exc.path != str(local):
                raise
            cls = Refused if exc.exit_code == EXIT_REFUSED else FiCacheError
            raise cls(exc.message, where) from None
    return Transferred(where, key, sidecar.size, sidecar.sha256, opened.manifest, planned=planned)


def _import(store: Path, local: Path, here: Fingerprint, force: bool, where: str) -> Installed:
    try:
        return bundle.import_bundle(store, local, here, force)
    except FiCacheError as exc:
        if exc.path != str(local):
            raise
        # Name the remote bundle: the temp file is gone by the time anyone reads this.
        cls = Refused if exc.exit_code == EXIT_REFUSED else FiCacheError
        raise cls(exc.message, where) from None
