"""The one module that writes to disk: temp file + fsync + rename, under a lock.

Readers never see a half-written file: data goes to a temp file in the target's directory,
is fsynced, then renamed over the target (atomic on POSIX within one filesystem), and the
directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fi_cache.errors import FiCacheError, Refused

# Our temp files; doctor's tmp-leftover check knows this prefix.
TMP_PREFIX = ".fi-cache-"
LOCK_SUFFIX = ".lock"
DEFAULT_LOCK_TIMEOUT = 60.0


def lock_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def locked(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the lock that guards `path` (a sibling `.NAME.lock` file)."""
    import filelock  # deferred: 40 ms of imports that read-only commands and serve never need

    lock_file = lock_path_for(path)
    _ensure_dir(lock_file.parent)
    lock = filelock.FileLock(str(lock_file), timeout=timeout)
    try:
        with lock:
            yield
    except filelock.Timeout:
        raise FiCacheError(
            f"timed out after {timeout:.0f}s waiting for the lock {lock_file}", path
        ) from None


def ensure_dir(directory: Path) -> None:
    """mkdir -p; a failure is one Refused line naming the directory."""
    _ensure_dir(directory)


def _ensure_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot create directory: {exc.strerror}", directory) from None


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    lock: bool = True,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix."""
    if lock:
        with locked(path, timeout):
            _replace(path, data, mode)
    else:
        _replace(path, data, mode)


def _check_writable(directory: Path) -> None:
    """Refuse early (filelock would retry a read-only lock file until its timeout)."""
    for attempt in range(3):
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=TMP_PREFIX, suffix=".tmp")
        except FileNotFoundError:
            if attempt == 2:
                raise Refused("store dir keeps disappearing", directory) from None
            _ensure_dir(directory)  # an import or prune moved the namespace away just now
            continue
        except OSError as exc:
            raise Refused(f"store is not writable: {exc.strerror}", directory) from None
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # moved away with the namespace by a concurrent import: fine
        return


def _replace(path: Path, data: bytes, mode: int) -> None:
    _ensure_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".tmp")
    except OSError as exc:
        raise Refused(f"cannot write here: {exc.strerror}", path.parent) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem can fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- Namespace locks ------------------------------------------------------------------------------
# One lock per namespace dir. Where flock works it is the kernel's (released when the holder dies,
# so a SIGKILLed warm never blocks the next one); on filesystems where flock is not honoured
# (NFS without lockd, Lustre, GPFS, FUSE object stores) an O_EXCL lock file holds
# pid/host/since and a dead holder on this host is recovered.

LOCK_NAME = ".fi-cache.lock"
HOLDER_NAME = ".fi-cache.lock.holder"
_UNTRUSTED_FS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "fuse")


@dataclass(frozen=True)
class Holder:
    """Who holds a namespace lock, for the waiting message."""

    pid: int
    host: str
    since: float
    purpose: str

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.purpose} by pid {self.pid} on host {self.host} since {when}"


def _this_holder(purpose: str) -> Holder:
    return Holder(os.getpid(), socket.gethostname(), time.time(), purpose)


def _read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text())
        return Holder(
            int(data["pid"]), str(data["host"]), float(data["since"]), str(data["purpose"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holder_bytes(holder: Holder) -> bytes:
    return json.dumps(holder.__dict__).encode()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def filesystem_type(path: Path) -> str | None:
    """The mount type holding `path` (Linux /proc/mounts; None elsewhere)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, parts[2]
    return best_type


def _flock_honoured(directory: Path) -> bool:
    """Two open file descriptions must exclude each other; some network filesystems let both in."""
    where = directory
    for _ in range(5):
        try:
            # A name of its own: probes of one dir by two processes must not lock each other.
            a, probe = tempfile.mkstemp(dir=where, prefix=f"{TMP_PREFIX}flock-")
        except FileNotFoundError:  # an import or prune moved the dir away just now
            where = _existing_parent(where)  # the same filesystem answers as well
            continue
        except OSError:
            return False
        try:
            verdict = _excludes(a, probe)
        finally:
            os.close(a)
            with contextlib.suppress(OSError):
                os.unlink(probe)
        if verdict is not None:
            return verdict
        where = _existing_parent(where)
    return False


def _existing_parent(path: Path) -> Path:
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return parent


def _excludes(a: int, probe: str) -> bool | None:
    """Does a second open of `probe` fail to flock while `a` holds it? None: the dir was moved
    before the second open, so ask again."""
    import fcntl

    try:
        b = os.open(probe, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    except OSError:
        return False
    finally:
        os.close(b)


def lock_strategy(directory: Path) -> tuple[str, str]:
    """("flock" | "lockfile", why) for locks under `directory` (created if missing)."""
    fs = filesystem_type(directory) or "unknown"
    if os.environ.get("FI_CACHE_LOCK") in ("flock", "lockfile"):
        return os.environ["FI_CACHE_LOCK"], "set by FI_CACHE_LOCK"
    if fs.startswith(_UNTRUSTED_FS):
        return "lockfile", f"{fs} filesystem: flock is not trusted there"
    if os.name != "posix":
        return "lockfile", "no flock on this platform"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "flock", f"{fs} filesystem (not writable, untested)"
    if _flock_honoured(directory):
        return "flock", f"{fs} filesystem honours flock"
    return "lockfile", f"{fs} filesystem does not honour flock"


@contextlib.contextmanager
def namespace_lock(
    directory: Path,
    purpose: str,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait: Callable[[Holder | None], None] | None = None,
    strategy: str | None = None,
) -> Iterator[Holder]:
    """Hold `directory`'s lock. Calls on_wait(holder) once if someone else has it first;
    raises FiCacheError naming the holder when `timeout` passes."""
    _ensure_dir(directory)
    _check_writable(directory)
    me = _this_holder(purpose)
    kind = strategy or lock_strategy(directory)[0]
    lock_file, holder_file = directory / LOCK_NAME, directory / HOLDER_NAME
    acquire = _acquire_flock if kind == "flock" else _acquire_lockfile
    with acquire(lock_file, holder_file, me, timeout, on_wait):
        yield me


def _timeout_error(holder: Holder | None, timeout: float, lock_file: Path) -> FiCacheError:
    who = holder.describe() if holder else "another process"
    return FiCacheError(f"timed out after {timeout:.0f}s waiting for {who}", lock_file)


def _same_file(fd: int, path: Path) -> bool:
    """Is the locked descriptor still the file at `path`? (An import or prune may have moved
    the namespace, and its lock file with it, while we waited.)"""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _flock_acquired(
    lock_file: Path,
    holder_file: Path,
    deadline: float,
    timeout: float,
    on_wait: Callable[[Holder | None], None] | None,
) -> int:
    """A descriptor of `lock_file` holding LOCK_EX, reopened if the file was replaced meanwhile."""
    import fcntl  # POSIX only; lock_strategy picks "lockfile" elsewhere

    waited = False
    vanished = 0
    while True:
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # the dir was moved between the mkdir and the open
            vanished += 1
            if vanished < 10:
                continue
            raise Refused("cannot lock: the directory keeps disappearing", lock_file) from None
        except OSError as exc:
            raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait:
                    on_wait(_read_holder(holder_file))
                waited = True
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise _timeout_error(_read_holder(holder_file), timeout, lock_file) from None
                time.sleep(0.1)
        if _same_file(fd, lock_file):
            return fd
        os.close(fd)  # we locked a file that was moved away: lock the one there now


@contextlib.contextmanager
def _acquire_flock(
    lock_file: Path,
    holder_file: Path,
    me: Holder,
    timeout: float,
    on_wait: Callable[[Holder | None], None] | None,
) -> Iterator[None]:
    import fcntl

    fd = _flock_acquired(lock_file, holder_file, time.monotonic() + timeout, timeout, on_wait)
    try:
        mine: os.stat_result | None = None
        try:
            _replace(holder_file, _holder_bytes(me), 0o644)
            mine = os.stat(holder_file)
            yield
        finally:
            if mine is not None:  # the dir may have been replaced: never remove another's
                _unlink_if_same(holder_file, mine)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)  # the kernel drops the lock with the last descriptor, even on SIGKILL


@contextlib.contextmanager
def _acquire_lockfile(
    lock_file: Path,
    holder_file: Path,
    me: Holder,
    timeout: float,
    on_wait: Callable[[Holder | None], None] | None,
) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    waited = False
    vanished = 0
    while True:
        try:
            fd = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read_holder(lock_file)
            if _break_stale(lock_file, holder, me):
                continue
            if not waited and on_wait:
                on_wait(holder)
            waited = True
            if time.monotonic() >= deadline:
                raise _timeout_error(holder, timeout, lock_file) from None
            time.sleep(0.1)
            continue
        except FileNotFoundError:  # an import or prune moved the dir away just now
            vanished += 1
            if vanished >= 10:
                raise Refused("cannot lock: the directory keeps disappearing", lock_file) from None
            _ensure_dir(lock_file.parent)
            continue
        except OSError as exc:
            raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
        break
    with _holding_lockfile(fd, lock_file, me):
        yield


@contextlib.contextmanager
def _holding_lockfile(fd: int, lock_file: Path, me: Holder) -> Iterator[None]:
    """Write who we are into the lock file we created, and remove it (only it) at the end:
    the directory may have been moved meanwhile and a new lock file made where ours was."""
    mine = os.fstat(fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_holder_bytes(me))
            f.flush()
            os.fsync(f.fileno())
        yield
    finally:
        _unlink_if_same(lock_file, mine)


def _break_stale(lock_file: Path, holder: Holder | None, me: Holder) -> bool:
    """Remove the lock of a dead holder on this host, so that of several waiters exactly one
    takes it over: the lock is renamed away (atomic; one rename wins) and checked afterwards."""
    if not holder or holder.host != me.host or _alive(holder.pid):
        return False
    aside = lock_file.with_name(f"{lock_file.name}.stale-{me.pid}-{time.time_ns()}")
    try:
        os.rename(lock_file, aside)
    except FileNotFoundError:
        return True  # someone else moved it first: try to create ours again
    except OSError:
        return False  # we may not move it (another user's, in a sticky dir): wait, with timeout
    if _read_holder(aside) == holder:
        with contextlib.suppress(OSError):
            aside.unlink()
    else:  # we moved a fresh lock someone took meanwhile: put it back unless replaced
        with contextlib.suppress(OSError):
            os.link(aside, lock_file)
        with contextlib.suppress(OSError):
            aside.unlink()
    return True


def _unlink_if_same(path: Path, mine: os.stat_result) -> None:
    """Remove our lock file, never one another process made where ours was."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            path.unlink()


# --- Moving things aside (doctor --fix) ---------------------------------------------------------


def move_aside(path: Path, quarantine_dir: Path, note: str) -> Path:
    """Move a file or dir into `quarantine_dir` (never delete), with a `.why` note beside it."""
    _ensure_dir(quarantine_dir)
    # Every vLLM cache is called autotune_configs.json: prefix a hash of where it came from.
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    dest = quarantine_dir / f"{tag}-{path.name}"
    n = 1
    while os.path.lexists(dest):
        n += 1
        dest = quarantine_dir / f"{tag}-{n}-{path.name}"
    try:
        shutil.move(str(path), str(dest))
    except OSError as exc:
        raise Refused(f"cannot move into quarantine: {exc.strerror}", path) from None
    atomic_write(dest.with_name(dest.name + ".why"), f"{path}\n{note}\n".encode(), lock=False)
    return dest


def remove_file(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise Refused(f"cannot remove: {exc.strerror}", path) from None


# --- Deleting namespaces (prune) ------------------------------------------------------------------
# A namespace leaves the store in one rename: it is moved into `<store>/.trash/` (atomic on one
# filesystem) and only then deleted, so a prune killed at any moment leaves each namespace either
# whole under namespaces/ or gone from it. What a killed prune left in the trash is emptied later.

TRASH_DIR = ".trash"


class NamespaceBusy(FiCacheError):
    """Someone else holds the namespace's lock (`holder`, when known)."""

    def __init__(self, directory: Path, holder: Holder | None) -> None:
        who = holder.describe() if holder else "another process"
        super().__init__(f"in use: locked for {who}", directory)
        self.holder = holder


def probe_namespace_lock(directory: Path, strategy: str) -> tuple[bool, Holder | None]:
    """(held, holder) of `directory`'s lock, creating and changing nothing.

    A lock file that cannot be opened counts as held: whoever cannot probe it cannot take it either.
    """
    lock_file = directory / LOCK_NAME
    if strategy == "lockfile":
        if not os.path.lexists(lock_file):
            return False, None
        holder = _read_holder(lock_file)
        if holder and holder.host == socket.gethostname() and not _alive(holder.pid):
            return False, holder  # a dead holder on this host: the next taker recovers it
        return True, holder
    import fcntl

    if in_use(directory):
        return True, None  # a running server (serve) holds it
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, _read_holder(directory / HOLDER_NAME)
    try:
        # Shared, so that two probes never see each other as holders.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True, _read_holder(directory / HOLDER_NAME)
    except OSError:
        return False, None  # flock unsupported here: nobody can hold it either
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)


@contextlib.contextmanager
def try_namespace_lock(directory: Path, purpose: str, strategy: str) -> Iterator[Holder]:
    """Take `directory`'s lock without waiting and without creating the directory or any file
    but the lock itself. Raises NamespaceBusy when it is held, Refused when it cannot be taken."""
    me = _this_holder(purpose)
    lock_file = directory / LOCK_NAME
    if strategy == "lockfile":
        with _try_lockfile(lock_file, me):
            yield me
        return
    import fcntl

    try:
        fd = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o644)
    except FileNotFoundError:  # moved away just now (an import or another prune): not ours
        raise NamespaceBusy(directory, None) from None
    except OSError as exc:
        raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NamespaceBusy(directory, _read_holder(directory / HOLDER_NAME)) from None
        try:
            if in_use(directory) or not _same_file(fd, lock_file):
                # A server holds it, or an import replaced the dir since our open: what the
                # caller judged is no longer there, so leave it for next time.
                raise NamespaceBusy(directory, None)
            yield me
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _try_lockfile(lock_file: Path, me: Holder) -> Iterator[None]:
    for _ in range(2):  # the second try follows the recovery of a dead holder's lock
        try:
            fd = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            holder = _read_holder(lock_file)
            if _break_stale(lock_file, holder, me):
                continue
            raise NamespaceBusy(lock_file.parent, holder) from None
        except FileNotFoundError:  # moved away just now (an import or another prune)
            raise NamespaceBusy(lock_file.parent, None) from None
        except OSError as exc:
            raise Refused(f"cannot lock: {exc.strerror}", lock_file) from None
    else:
        raise NamespaceBusy(lock_file.parent, _read_holder(lock_file))
    with _holding_lockfile(fd, lock_file, me):
        yield


def remove_tree(path: Path, store: Path) -> None:
    """Delete the directory `path` inside `store`: one atomic rename into `<store>/.trash/`,
    then the deletion. Raises Refused when it cannot be moved (nothing was removed then) and
    FiCacheError when it was moved but not fully deleted (empty_trash retries later)."""
    trash = store / TRASH_DIR
    _ensure_dir(trash)
    dest = trash / f"{time.time_ns()}-{os.getpid()}-{path.name}"
    try:
        os.replace(path, dest)
    except OSError as exc:
        raise Refused(f"cannot remove: {exc.strerror}", path) from None
    _fsync_dir(path.parent)
    _fsync_dir(trash)
    _delete_tree(dest)


def _delete_tree(path: Path) -> None:
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        # A create that looked the dir up just before it was moved lands in it afterwards.
        time.sleep(0.05)
    if os.path.lexists(path):
        raise FiCacheError("moved to the trash but could not delete all of it", path)


def trash_leftovers(store: Path) -> list[Path]:
    """What killed prunes left in `<store>/.trash/`."""
    try:
        return sorted((store / TRASH_DIR).iterdir())
    except OSError:
        return []


def empty_trash_entry(path: Path) -> None:
    """Delete one entry of `<store>/.trash/` (a directory or a file)."""
    if path.is_dir() and not path.is_symlink():
        _delete_tree(path)
    else:
        remove_file(path)


def remove_empty_parents(path: Path, stop: Path) -> None:
    """rmdir `path`'s parents up to (not including) `stop` while they are empty."""
    for parent in path.parents:
        if parent == stop or stop not in parent.parents:
            return
        try:
            os.rmdir(parent)
        except OSError:
            return


# --- Installing imported namespaces (import) ------------------------------------------------------
# A bundle is unpacked into `<store>/.import-*` first; each namespace then replaces its old self
# with two renames under the namespace lock, so readers see the old or the new one, never a mix.

STAGING_PREFIX = ".import-"


def make_staging_dir(store: Path) -> Path:
    _ensure_dir(store)
    try:
        return Path(tempfile.mkdtemp(dir=store, prefix=STAGING_PREFIX))
    except OSError as exc:
        raise Refused(f"store is not writable: {exc.strerror}", store) from None


def write_member(path: Path, src: IO[bytes], size: int) -> str:
    """Copy exactly `size` bytes of `src` to a new file at `path`; returns their sha256."""
    _ensure_dir(path.parent)
    digest = hashlib.sha256()
    left = size
    with open(path, "xb") as f:  # "x": never follow or overwrite anything already there
        while left > 0:
            block = src.read(min(left, 1 << 20))
            if not block:
                raise Refused("bundle member ends early (truncated)", path)
            digest.update(block)
            f.write(block)
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


_INSTALL_ATTEMPTS = 20  # each retry waits for a newcomer's lock: only a storm of them exhausts it


def install_dir(
    new: Path, target: Path, store: Path, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> None:
    """Replace `target` with the staged dir `new` (old one to the trash) under target's lock.

    Where the filesystem can exchange two paths in one step (Linux renameat2), `target` never
    stops existing: a process arriving mid-import finds the old namespace or the new one. Elsewhere
    (NFS) it is two renames, and a process that creates `target` in between is waited for."""
    if not new.is_dir():  # never move the old one aside without a replacement in hand
        raise Refused("staged namespace is missing", new)
    _ensure_dir(target.parent)
    _ensure_dir(store / TRASH_DIR)
    _check_writable(store / TRASH_DIR)  # before anything moves: the old dir must have a place
    with namespace_lock(target, "import", timeout):
        if in_use(target):  # its in-use mark would go with the old dir, and prune ignore it
            raise FiCacheError(
                "in use by a running `fi-cache serve`: import after it stops", target
            )
        swapped = _exchange(new, target)
        if swapped:
            _fsync_dir(target.parent)
    if swapped:  # `new` now holds the old namespace: the import is done, whatever happens next
        with contextlib.suppress(OSError, FiCacheError):
            _delete_tree(_to_trash(new, store, target.name))
        return
    _install_in_two_renames(new, target, store, timeout)


def _to_trash(path: Path, store: Path, name: str) -> Path:
    """Move an install's old dir into the trash under a name prune leaves alone for a while."""
    aside = store / TRASH_DIR / f"{INSTALLING_PREFIX}{time.time_ns()}-{os.getpid()}-{name}"
    _ensure_dir(aside.parent)
    os.replace(path, aside)
    return aside


INSTALLING_PREFIX = "installing-"
INSTALLING_KEEP_S = 3600.0  # an install moves its old dir back on failure: prune waits this long


def trash_entry_in_use(path: Path, now: float) -> bool:
    """Is this trash entry an install's, young enough that the install may still need it?"""
    if not path.name.startswith(INSTALLING_PREFIX):
        return False  # a killed prune's leftover: nobody comes back for it
    stamp = path.name[len(INSTALLING_PREFIX) :].partition("-")[0]
    try:
        return now - int(stamp) / 1e9 < INSTALLING_KEEP_S
    except ValueError:
        return False


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE). False where this
    platform or filesystem cannot (not Linux, old libc, NFS, a seccomp filter): a failed
    renameat2 changes nothing, so the caller's fallback runs and reports any real problem."""
    try:
        import ctypes

        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def _install_in_two_renames(new: Path, target: Path, store: Path, timeout: float) -> None:
    """install_dir without an exchange: old aside, then new in place. A newcomer (a warm) that
    recreates `target` in between holds its lock: wait for it, then move its dir aside too."""
    trashed: list[Path] = []
    try:
        for _ in range(_INSTALL_ATTEMPTS):
            with namespace_lock(target, "import", timeout):
                aside = _to_trash(target, store, target.name)
                trashed.append(aside)
                if _put_in_place(new, target):
                    _fsync_dir(target.parent)
                    break
        else:
            raise FiCacheError("kept being recreated by other processes; try again", target)
    except BaseException as exc:
        restored = False
        if trashed and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.replace(trashed[0], target)  # put the old one back: never lose it
                restored = True
        if not restored and trashed and isinstance(exc, Exception):
            raise FiCacheError(
                f"import did not finish ({exc}); the namespace as it was is in {trashed[0]} "
                f"(kept {INSTALLING_KEEP_S / 3600:.0f} h from prune)",
                target,
            ) from None
        for other in trashed[1:] if restored else []:  # newcomers' dirs, replaced as planned
            with contextlib.suppress(FiCacheError):
                _delete_tree(other)
        raise
    for old in trashed:
        _delete_tree(old)


def _put_in_place(new: Path, target: Path) -> bool:
    """os.replace(new, target); False when a newcomer recreated `target` meanwhile."""
    for _ in range(3):
        try:
            os.replace(new, target)
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            if exc.errno != errno.ENOENT or not new.is_dir():
                raise
            _ensure_dir(target.parent)  # a prune removed the emptied parents just now
    raise FiCacheError("its parent directory keeps disappearing", target)


# --- Namespaces in use by a running server (serve) ---------------------------------------------
# `serve` execs vLLM holding a shared flock on this file (the descriptor survives the exec), so a
# prune never deletes the namespace of a server that is still running. Warms do not look at it.

IN_USE_NAME = ".fi-cache.inuse"


def hold_in_use(directory: Path) -> int | None:
    """Mark `directory` in use until this process (or what it execs) exits; None where flock
    is not available or not trusted (a lock-file store cannot mark shared use)."""
    import fcntl

    if lock_strategy(directory)[0] != "flock":
        return None
    try:
        fd = os.open(directory / IN_USE_NAME, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        return None  # a read-only store: nothing can prune it from here either
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)
    return fd


def in_use(directory: Path) -> bool:
    """Does a running server hold `directory`? Creates nothing."""
    import fcntl

    try:
        fd = os.open(directory / IN_USE_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def share_like_store(paths: list[Path], store: Path) -> None:
    """Give files vLLM/FlashInfer wrote (0600) the read access the store dir itself grants, so
    a shared store is readable by every server that shares it and a private one stays private."""
    try:
        grant = store.stat().st_mode & 0o044
    except OSError:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            os.chmod(path, (path.stat().st_mode & 0o777) | grant)
