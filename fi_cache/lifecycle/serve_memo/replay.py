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
        store = store_of(argv, environ)
        where = memo_dir(store)
        the_key = key(argv, environ, os.getcwd())
        path = os.path.join(where, the_key + MEMO_SUFFIX)
        doc = _read_private(where, path)
    except (OSError, ValueError, EOFError, TypeError, RecursionError):
        return None
    if doc is None or doc.get("schema") != SCHEMA or doc.get("key") != the_key:
        return None
    if not _inside(doc.get("ns_dir"), os.path.join(os.path.realpath(store), "namespaces")):
        return None  # the in-use file it touches lies in one of the store's namespaces
    try:
        hit, inputs, watch, (recorded, expires) = _parse(doc, environ, path)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # not a memo this fi-cache wrote
    if not recorded <= time.time() < (expires if expires is not None else float("inf")):
        return None  # expired, or the clock stepped back
    try:
        for kind, p, value in inputs:
            if stamp(kind, p) != value:
                return None
    except (ValueError, TypeError):  # a path with a NUL: not a memo this fi-cache wrote
        return None
    if watch is not None and running(*watch):
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
) -> tuple[Hit, list[tuple[str, str, Stamp]], Any, tuple[float, float | None]]:
    command = doc["command"]
    if not isinstance(command, list) or not command or not all(map(_clean, command)):
        raise ValueError("command")
    changed, unset = doc["set"], set(doc["unset"])
    if not all(_clean(k) and "=" not in k and _clean(v, empty=True) for k, v in changed.items()):
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
    if not _clean(hit.ns_dir):
        raise ValueError("ns_dir")
    watch = doc["watch"]
    if watch is not None:
        words, prefixes = watch
        if not all(isinstance(w, list) and w and all(map(_clean, w)) for w in words):
            raise ValueError("watch")
        if not all(isinstance(p, str) for p in prefixes):
            raise ValueError("watch")
        watch = (words, prefixes)
    recorded, expires = doc["recorded"], doc["expires"]
    if not isinstance(recorded, (int, float)) or not isinstance(expires, (int, float, type(None))):
        raise ValueError("times")
    return hit, inputs, watch, (recorded, expires)


def _inside(path: object, root: str) -> bool:
    """Is `path` a normalised absolute path below `root` (no `..`, no `//`)?"""
    return (
        isinstance(path, str)
        and os.path.isabs(path)
        and os.path.normpath(path) == path
        and path.startswith(root.rstrip("/") + "/")
    )


def _clean(value: object, *, empty: bool = False) -> bool:
    """A string exec and the environment take (no NUL; not empty unless allowed)."""
    return isinstance(value, str) and "\0" not in value and (empty or value != "")


def running(words: Sequence[Sequence[str]], prefixes: Sequence[str]) -> bool:
    """Does a process on this machine (but this one) run what the full serve looked for: one of
    the word sequences in its command line (the first word by its basename), or a first word
    with one of the prefixes ("": any process)?"""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return True  # cannot look: take the long way, which can
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="surrogateescape").split("\0")
        except OSError:
            continue
        if argv and any(argv[0].startswith(p) for p in prefixes):
            return True
        for i, word in enumerate(argv):
            for seq in words:
                if os.path.basename(word) == seq[0] and argv[i + 1 : i + len(seq)] == seq[1:]:
                    return True
    return False


def hand_over(hit: Hit) -> OSError:
    """Note the serve, hold the namespace in use, exec the engine. Returns only when the exec
    failed: the error (the memo is removed: the next serve runs in full)."""
    from fi_cache.store import in_use

    fd = None
    if hit.hold:
        fd = in_use.mark(hit.ns_dir)  # which notes the serve too
    else:
        in_use.note_served(hit.ns_dir)
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
