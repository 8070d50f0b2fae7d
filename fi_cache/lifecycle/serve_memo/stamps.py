"""What an input looked like: a file's or link's stat, a store dir's entries, a /proc file's
content. The os functions are the real ones, taken before record.py watches os.stat."""

from __future__ import annotations

import os
import stat

try:  # hashlib's OpenSSL costs 2 ms of a repeat's 50; the builtin BLAKE2 is the same digest
    from _blake2 import blake2b
except ImportError:  # pragma: no cover (an interpreter built without it)
    from hashlib import blake2b

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    Stamp: TypeAlias = Any  # a JSON value: a list of ints, a hex digest, or None (not there)

_os_stat, _os_lstat, _os_listdir, _os_access = os.stat, os.lstat, os.listdir, os.access
_MAX_CONTENT = 64 << 20  # /proc/mounts of a host with thousands of mounts
# What every serve writes in its namespace: the lock, lock holder and in-use mark, and the probe
# files of the lock strategy and the writability check (store/locks, store/atomic), gone again
# before it ends. Only the first three stay, and are no entry of a dir's stamp: a temp file left
# by a killed writer is (doctor reports it).
# (No regex: re's import costs a repeat 5 ms.)
_KEPT_BOOKKEEPING = frozenset({".fi-cache.lock", ".fi-cache.lock.holder", ".fi-cache.inuse"})


def bookkeeping(name: str) -> bool:
    """One of serve's own writes in a namespace (a file name)."""
    return (
        name in _KEPT_BOOKKEEPING
        or name.startswith(".fi-cache-flock-")
        or (name.startswith(".fi-cache-") and name.endswith(".tmp"))
    )


def content(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return blake2b(f.read(_MAX_CONTENT), digest_size=16).hexdigest()
    except OSError:
        return None


def _fields(st: os.stat_result) -> list[int]:
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid, st.st_gid]


def _of(st: os.stat_result, path: str) -> Stamp:
    """What a stat-only decision can see: a file's every field; a dir's type, inode and
    permissions (its entries are a listing's stamp); a link's target."""
    if stat.S_ISDIR(st.st_mode):
        return [st.st_ino, st.st_mode, st.st_uid, st.st_gid]
    if stat.S_ISLNK(st.st_mode):
        return [st.st_ino, st.st_mode, os.readlink(path)]
    return _fields(st)


def _stat(path: str) -> Stamp:
    try:
        return _of(_os_stat(path), path)
    except OSError:
        return None


def _lstat(path: str) -> Stamp:
    try:
        return _of(_os_lstat(path), path)
    except OSError:
        return None


def _dir(path: str) -> Stamp:
    """A dir listed outside the store (an import's): its entries change its mtime."""
    try:
        return _fields(_os_stat(path))
    except OSError:
        return None


def _access(path: str) -> Stamp:
    """What os.access answers (an immutable flag, an ACL, a read-only export change it without
    a mode change), and whether the filesystem is mounted read-only."""
    try:
        ro = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        ro = None
    return [_os_access(path, m) for m in (os.R_OK, os.W_OK, os.X_OK)] + [ro]


def settled_before(value: Stamp, when_ns: int) -> bool:
    """Was a file stamp's content last changed before `when_ns` (or has it no content)?"""
    return not (isinstance(value, list) and len(value) == 7 and value[0] >= when_ns)


def _listing(path: str) -> Stamp:
    """A store dir's entries (its bookkeeping aside), and who may change them."""
    try:
        st = _os_stat(path)
        names = sorted(n for n in _os_listdir(path) if n not in _KEPT_BOOKKEEPING)
    except OSError:
        return None
    digest = blake2b("\0".join(names).encode(errors="surrogateescape"), digest_size=16)
    return [digest.hexdigest(), st.st_ino, st.st_mode, st.st_uid, st.st_gid]


STAMPERS: dict[str, Callable[[str], Stamp]] = {
    "stat": _stat,
    "lstat": _lstat,
    "dir": _dir,
    "access": _access,
    "listing": _listing,
    "content": content,
}


def stamp(kind: str, path: str) -> Stamp:
    return STAMPERS[kind](path)


__all__ = ["STAMPERS", "blake2b", "bookkeeping", "content", "settled_before", "stamp"]
