"""Replaying a serve: its memo found and trusted only when private, every input re-stamped,
/proc looked at, then the engine exec'd as the full serve would."""

from __future__ import annotations

import marshal
import os
import stat
import time

from fi_cache.lifecycle.serve_memo import MEMO_SUFFIX, SCHEMA, enabled, key, memo_dir, store_of
from fi_cache.lifecycle.serve_memo.stamps import STAMPERS, stamp

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from fi_cache.lifecycle.serve_memo.stamps import Stamp

_MAX_MEMO = 4 << 20


class Hit:
    """What a replayed serve does (a plain class: typing's NamedTuple costs a repeat 3 ms)."""

    __slots__ = (
        "command",
        "display",
        "environ",
        "err",
        "hold",
        "memo",
        "ns_dir",
        "out",
        "stdout_to_stderr",
    )

    def __init__(
        self,
        *,
        out: bytes,  # what the serve printed on stdout, and on stderr
        err: bytes,
        command: list[str],
        environ: dict[str, str],  # the engine's whole environment
        display: str,  # the engine's name, for a failed exec
        ns_dir: str,
        hold: bool,  # the store trusts flock: hold the in-use mark while the engine runs
        stdout_to_stderr: bool,  # --format json: the engine's log goes to stderr
        memo: str,  # the memo's path
    ) -> None:
        self.out, self.err, self.command, self.environ = out, err, command, environ
        self.display, self.ns_dir, self.hold = display, ns_dir, hold
        self.stdout_to_stderr, self.memo = stdout_to_stderr, memo


def lookup(argv: Sequence[str], environ: Mapping[str, str]) -> Hit | None:
    """The serve to replay for this command line, or None (run the full serve)."""
    if not enabled(environ) or "serve" not in argv:
        return None
    try:
        where = memo_dir(store_of(argv, environ))
        the_key = key(argv, environ, os.getcwd())
        path = os.path.join(where, the_key + MEMO_SUFFIX)
        doc = _read_private(where, path)
    except (OSError, ValueError, EOFError, TypeError, RecursionError):
        return None
    if doc is None or doc.get("schema") != SCHEMA or doc.get("key") != the_key:
        return None
    try:
        hit, inputs, watch, expires = _parse(doc, environ, path)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # not a memo this fi-cache wrote
    if expires is not None and time.time() >= expires:
        return None
    for kind, p, value in inputs:
        if stamp(kind, p) != value:
            return None
    if watch and running(watch):
        return None
    return hit


def _read_private(directory: str, path: str) -> dict[str, Any] | None:
    """The memo, when it and its dir are this user's alone; else None."""
    uid = os.getuid()
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
            return None
        data = marshal.loads(f.read(_MAX_MEMO + 1)[:_MAX_MEMO])
    return data if isinstance(data, dict) else None


def _parse(
    doc: dict[str, Any], environ: Mapping[str, str], path: str
) -> tuple[Hit, list[tuple[str, str, Stamp]], list[bytes], float | None]:
    command = doc["command"]
    if not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command")
    changed, unset = doc["set"], set(doc["unset"])
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in changed.items()):
        raise ValueError("set")
    env = {k: v for k, v in environ.items() if k not in unset}
    env.update(changed)
    inputs = [(str(k), str(p), v) for k, p, v in doc["inputs"] if k in STAMPERS]
    if len(inputs) != len(doc["inputs"]):
        raise ValueError("inputs")
    out, err = doc["out"], doc["err"]
    if not isinstance(out, bytes) or not isinstance(err, bytes):
        raise ValueError("output")
    hit = Hit(
        out=out,
        err=err,
        command=command,
        environ=env,
        display=str(doc["display"]),
        ns_dir=str(doc["ns_dir"]),
        hold=doc["hold"] is True,
        stdout_to_stderr=doc["stdout_to_stderr"] is True,
        memo=path,
    )
    watch = [str(w).encode() for w in doc["watch"]]
    expires = doc["expires"]
    if expires is not None and not isinstance(expires, (int, float)):
        raise ValueError("expires")
    return hit, inputs, watch, expires


def running(words: Sequence[bytes]) -> bool:
    """Does a process on this machine hold one of `words` in its command line (b"": any
    process but this one)?"""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return True  # cannot look: take the long way, which can
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(w in cmdline for w in words):
            return True
    return False


def hand_over(hit: Hit) -> OSError:
    """Note the serve, hold the namespace in use, exec the engine. Returns only when the exec
    failed: the error (the memo is removed: the next serve runs in full)."""
    from fi_cache.store import in_use

    in_use.note_served(hit.ns_dir)
    fd = in_use.mark(hit.ns_dir) if hit.hold else None
    try:
        os.execve(hit.command[0], hit.command, hit.environ)
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        import contextlib
        from pathlib import Path

        from fi_cache.errors import FiCacheError
        from fi_cache.store import files

        with contextlib.suppress(FiCacheError):
            files.remove_file(Path(hit.memo))
        return exc
    raise AssertionError("unreachable: execve returned")  # pragma: no cover
