"""The lock-file strategy, for filesystems where flock is not honoured (NFS without lockd,
Lustre, GPFS, FUSE object stores): a lock file holds pid/host/since, and a lock file without a
live holder is taken over. A namespace's lock file and a file's (`.NAME.lock`) alike.

Without a live holder means: its holder is a process of this host that has exited, or it names
no holder at all (the empty lock file the flock strategy leaves behind, or garbage) and no
process holds it by flock. A holder on another host cannot be checked: it holds until it lets go.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fi_cache.store.atomic import TMP_PREFIX, ensure_dir
from fi_cache.store.locks import flock
from fi_cache.store.locks.api import (
    LOCK_NAME,
    Holder,
    LockStrategy,
    NamespaceBusy,
    OnWait,
    Site,
    holder_bytes,
    non_lock_kind,
    read_holder,
    unlink_if_same,
    with_guard,
)

# A lock file made by O_EXCL and then written (where hard links are not available, and by
# fi-cache before 0.1's link) is empty for a moment: one this young may be a holder writing it.
WRITING_S = 10.0
# Filesystems without hard links answer these; the lock is then made by O_EXCL, then written.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}


class LockFile(LockStrategy):
    name = "lockfile"

    @contextlib.contextmanager
    def acquire(
        self, site: Site, me: Holder, timeout: float, on_wait: OnWait | None
    ) -> Iterator[None]:
        lock_file = site.lock_file
        deadline = time.monotonic() + timeout
        waited = False
        vanished = 0
        while True:
            site.clear()  # a dir, link or FIFO there: no holder, and no file to take
            try:
                mine = _create(lock_file, me)
            except FileNotFoundError as exc:  # an import or prune moved the dir away just now
                vanished += 1
                if vanished >= 10:
                    raise site.vanished(exc) from None
                ensure_dir(lock_file.parent)
                continue
            except OSError as exc:
                raise site.cannot_open(exc) from None
            if mine is not None:
                break
            seen = _look(site, me.host)
            if seen is None or (not seen.live and _break_stale(lock_file, seen, me)):
                continue
            if not waited and on_wait:
                on_wait(seen.holder)
            waited = True
            if time.monotonic() >= deadline:
                raise site.timed_out(seen.holder, timeout) from None
            time.sleep(0.1)
        with _holding(lock_file, mine):
            yield

    @contextlib.contextmanager
    def try_acquire(self, site: Site, me: Holder) -> Iterator[None]:
        lock_file = site.lock_file
        mine = None
        for _ in range(2):  # the second try follows the recovery of a lock without a holder
            site.clear()
            try:
                mine = _create(lock_file, me)
            except FileNotFoundError:  # moved away just now (an import or another prune)
                raise NamespaceBusy(site.guarded, None) from None
            except OSError as exc:
                raise site.cannot_open(exc) from None
            if mine is not None:
                break
            seen = _look(site, me.host)
            if seen is not None and (seen.live or not _break_stale(lock_file, seen, me)):
                raise NamespaceBusy(site.guarded, seen.holder)
        if mine is None:
            raise NamespaceBusy(site.guarded, read_holder(lock_file))
        with _holding(lock_file, mine):
            yield

    def probe(self, site: Site) -> tuple[bool, Holder | None]:
        if non_lock_kind(site.lock_file) is not None:
            return False, None  # no lock: what acquire clears away (a dry run says what apply does)
        seen = _look(site, os.uname().nodename)
        if seen is None:
            return False, None
        return seen.live, seen.holder


@dataclass(frozen=True)
class _Seen:
    """A lock file as judged: does a live holder have it, who, and which file it was."""

    live: bool
    holder: Holder | None
    ident: tuple[int, int] | None  # (st_dev, st_ino): never take over another file than judged


def _look(site: Site, host: str) -> _Seen | None:
    """Judge the lock file at `site`; None when there is none. Reads only."""
    lock_file = site.lock_file
    try:
        st = os.lstat(lock_file)
    except FileNotFoundError:
        return None
    except OSError:
        return _Seen(True, None, None)  # cannot even look: whoever cannot look cannot take it
    ident = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode):
        return _Seen(True, None, None)  # not a file we made: wait (with the timeout), never break
    holder = read_holder(lock_file)
    if holder is not None:
        dead = holder.host == host and not holder.live()  # its guard still stopping vLLM: live
        return _Seen(not dead, holder, ident)
    if flock.held(lock_file):  # the flock strategy's lock file, and its holder is running
        holder_file = site.holder_file
        return _Seen(True, read_holder(holder_file) if holder_file else None, ident)
    # Empty or garbage: left by the flock strategy or a killed writer, unless being written now
    # (abs: an NFS server's clock a little ahead makes a fresh file look from the future).
    writing = abs(time.time() - st.st_mtime) < WRITING_S
    return _Seen(writing, None, ident)


def _create(lock_file: Path, me: Holder) -> os.stat_result | None:
    """Make `lock_file` holding `me`, whole in one step (a temp file hard-linked into place, as
    NFS's own lock recipe does); None when a lock file is there already."""
    tmp = lock_file.with_name(f"{TMP_PREFIX}lock-{me.pid}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(holder_bytes(me))
            f.flush()
            os.fsync(f.fileno())
        mine = os.stat(tmp)
        try:
            os.link(tmp, lock_file)
        except FileExistsError:
            # Over NFS a link whose reply was lost is retried and fails: two links say it is ours.
            return mine if os.stat(tmp).st_nlink >= 2 else None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return _create_in_place(lock_file, me)
        return mine
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_in_place(lock_file: Path, me: Holder) -> os.stat_result | None:
    """O_EXCL, then write: empty for a moment (WRITING_S says how long others wait for it)."""
    try:
        fd = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return None
    with os.fdopen(fd, "wb") as f:
        mine = os.fstat(f.fileno())
        f.write(holder_bytes(me))
        f.flush()
        os.fsync(f.fileno())
    return mine


@contextlib.contextmanager
def _holding(lock_file: Path, mine: os.stat_result) -> Iterator[None]:
    """Remove our lock file (only it) at the end: the directory may have been moved meanwhile
    and a new lock file made where ours was."""
    try:
        yield
    finally:
        unlink_if_same(lock_file, mine)


def _break_stale(lock_file: Path, seen: _Seen, me: Holder) -> bool:
    """Remove a lock file without a live holder, so that of several waiters exactly one takes it
    over: it is renamed away (atomic; one rename wins) and checked afterwards. False when it
    cannot be moved (another user's, in a sticky dir): wait, with the timeout."""
    # A temp file's name: one a kill leaves here is a tmp-leftover, and never exported.
    aside = lock_file.with_name(f"{TMP_PREFIX}stale-lock-{me.pid}-{time.time_ns()}.tmp")
    try:
        os.rename(lock_file, aside)
    except FileNotFoundError:
        return True  # someone else moved it first: try to create ours again
    except OSError:
        return False
    try:
        st = os.lstat(aside)
        same = (st.st_dev, st.st_ino) == seen.ident and read_holder(aside) == seen.holder
    except OSError:
        same = False
    if not same:  # we moved a fresh lock someone took meanwhile: put it back unless replaced
        with contextlib.suppress(OSError):
            os.link(aside, lock_file)
    with contextlib.suppress(OSError):
        aside.unlink()
    return True


def add_guard(directory: Path, guard: int) -> None:
    """Name `guard` in the lock file this process holds (same file, rewritten in place): the
    lock is not stale while the guard lives, even after this process died."""
    lock_file = directory / LOCK_NAME
    holder = read_holder(lock_file)
    if holder is None or holder.pid != os.getpid():
        return
    with open(lock_file, "r+b") as f:
        f.write(holder_bytes(with_guard(holder, guard)))
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
