"""A repeated `fi-cache serve` hands over at once: the last serve with the same command line,
environment and working dir, whose every input is unchanged, is replayed (its output, the
engine's command and environment) without importing the rest of fi-cache.

Recording (the full serve; `Recorder`, a sys.audit hook that __main__ installs before anything
else is imported) notes every file opened for reading and every dir listed, fi-cache's and
Python's own modules included, and code that decides on a stat alone raises
`sys.audit("fi_cache.stat", path)`. A memo is kept only for a serve that changed nothing it reads:
no warm, no finding, no child process (nvidia-smi, a probe), no write but the namespace's lock
and in-use bookkeeping. Each input gets a stamp: a file's (mtime, ctime, size, inode, mode), a dir
outside the store its own, a dir inside it its entries (the bookkeeping aside), a /proc or /sys
file its content. Replaying re-stamps them all and falls back to the full serve on the first
difference; running `vllm preload` daemons (which /proc shows, and no stamp can) are looked for
again each time.

The memo names a command to exec, so it is private: <store>/.fi-cache/serve/<uid>/<key>.json,
the dir 0700 and both the user's own, nothing in them writable by another. FI_CACHE_SERVE_MEMO=0
runs the full serve every time; FI_CACHE_SERVE_MEMO=explain says what the memo did.
Light on purpose: the standard library and fi_cache.store.in_use.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False

try:  # hashlib's OpenSSL costs 2 ms of a repeat's 50; the builtin BLAKE2 is the same digest
    from _blake2 import blake2b
except ImportError:  # pragma: no cover (an interpreter built without it)
    from hashlib import blake2b

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeAlias

    Stamp: TypeAlias = Any  # a JSON value: a list of ints, a hex digest, or None (not there)

SCHEMA = 1
# "0": no memo is read or kept; "explain": a line on stderr says whether one was replayed, kept,
# or why not (what to look at when a repeated serve is not fast).
MEMO_ENV = "FI_CACHE_SERVE_MEMO"
STAT_EVENT = "fi_cache.stat"  # sys.audit event: a decision taken on this path's stat alone
_STORE_ENV = "FI_CACHE_DIR"  # store/paths.STORE_ENV (a test holds them equal)
KEPT_MEMOS = 32  # per user and store: the newest, one per command line and environment
_MAX_MEMO = 4 << 20
_MAX_CONTENT = 1 << 20
_SETTLED_NS = 2_000_000_000  # changed this recently: may change again within its mtime tick
# What every serve writes in its namespace: the lock, lock holder and in-use mark, and the probe
# files of the lock strategy and the writability check (store/locks, store/atomic), gone again
# before it ends. Only the first three stay, and are no entry of a dir's stamp: a temp file left
# by a killed writer is (doctor reports it).
_BOOKKEEPING = re.compile(r"\.fi-cache(\.lock|\.lock\.holder|\.inuse|-flock-.+|-.+\.tmp)\Z")
_KEPT_BOOKKEEPING = re.compile(r"\.fi-cache(\.lock|\.lock\.holder|\.inuse)\Z")
_PROCESS = re.compile(r"/proc/(\d+|self|thread-self)(/|\Z)")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = frozenset(
    {
        "os.rename",
        "os.remove",
        "os.rmdir",
        "os.chmod",
        "os.chown",
        "os.utime",
        "os.truncate",
        "os.link",
        "os.symlink",
        "shutil.copyfile",
        "shutil.copytree",
        "shutil.rmtree",
        "shutil.move",
    }
)
_CHILD_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system"})
EXPIRES_EVENT = "fi_cache.expires"  # sys.audit event: what was read holds until this time.time()
# What a serve looks for in /proc, by engine: any process whose command line holds the word takes
# the long way (`vllm preload`, versions.PRELOAD_SUBCOMMAND; SGLang's servers, sglang/live.py).
WATCHED = {"vllm": ("preload",), "sglang": ("sglang",)}


class Hit:
    """What a replayed serve does (a plain class: typing's NamedTuple costs a repeat 3 ms)."""

    __slots__ = ("command", "environ", "err", "hold", "ns_dir", "out", "stdout_to_stderr")

    def __init__(
        self,
        *,
        out: bytes,  # what the serve printed on stdout, and on stderr
        err: bytes,
        command: list[str],
        environ: dict[str, str],  # the engine's whole environment
        ns_dir: str,
        hold: bool,  # the store trusts flock: hold the in-use mark while the engine runs
        stdout_to_stderr: bool,  # --format json: the engine's log goes to stderr
    ) -> None:
        self.out, self.err, self.command, self.environ = out, err, command, environ
        self.ns_dir, self.hold, self.stdout_to_stderr = ns_dir, hold, stdout_to_stderr


# --- where, and under which key -----------------------------------------------------------------


def store_of(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The store this command line names (--store, $FI_CACHE_DIR, the default), as the full serve
    would resolve it; the full serve keeps a memo only where the two agree."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--store" and i + 1 < len(argv):
            return os.path.abspath(os.path.expanduser(argv[i + 1]))
        if arg.startswith("--store="):
            return os.path.abspath(os.path.expanduser(arg[len("--store=") :]))
    if env := environ.get(_STORE_ENV):
        return os.path.abspath(os.path.expanduser(env))
    import platformdirs

    return os.path.abspath(platformdirs.user_cache_dir("fi-cache", appauthor=False))


def memo_dir(store: str) -> str:
    return os.path.join(store, ".fi-cache", "serve", str(os.getuid()))


def key(argv: Sequence[str], environ: Mapping[str, str], cwd: str) -> str:
    """Everything a serve's decision may read that no file stamp shows."""
    from fi_cache import __version__

    parts = [
        SCHEMA,
        __version__,
        sys.executable,
        sys.version,
        cwd,
        list(argv),
        # Hashed only: the memo keeps no secret of the environment. `_` is the shell's note of
        # the last command (`time fi-cache serve` vs `fi-cache serve`): nothing reads it; nor
        # does the full serve read MEMO_ENV.
        sorted((k, v) for k, v in environ.items() if k not in ("_", MEMO_ENV)),
        os.getuid(),
        os.getgid(),
        [os.isatty(fd) for fd in (0, 1, 2)],
        _content("/proc/sys/kernel/random/boot_id"),  # another boot, another machine
    ]
    return blake2b(json.dumps(parts).encode(), digest_size=16).hexdigest()


# --- stamps -------------------------------------------------------------------------------------


def _content(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return blake2b(f.read(_MAX_CONTENT), digest_size=16).hexdigest()
    except OSError:
        return None


def _listing(path: str) -> Stamp:
    """A store dir's entries (its bookkeeping aside), and who may change them."""
    try:
        st = os.stat(path)
        names = sorted(n for n in os.listdir(path) if not _KEPT_BOOKKEEPING.match(n))
    except OSError:
        return None
    digest = blake2b("\0".join(names).encode(errors="surrogateescape"), digest_size=16).hexdigest()
    return [digest, st.st_ino, st.st_mode, st.st_uid]


def _stat(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid]


_STAMPERS: dict[str, Callable[[str], Stamp]] = {
    "stat": _stat,
    "listing": _listing,
    "content": _content,
}


def stamp(kind: str, path: str) -> Stamp:
    return _STAMPERS[kind](path)


# --- recording (the full serve) -----------------------------------------------------------------


class _Tee:
    """A text stream that keeps what is written to it (click finds it compatible as it is)."""

    def __init__(self, stream: Any, sink: list[str]) -> None:
        self._stream, self._sink = stream, sink

    def write(self, text: str) -> int:
        n: int = self._stream.write(text)  # bytes raise here, as click's probe expects
        self._sink.append(text)
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Recorder:
    """What a full serve read, listed and wrote, from sys.audit events."""

    def __init__(self, argv: Sequence[str]) -> None:
        # As the serve began: it may change its own environment on the way.
        self.environ = dict(os.environ)
        self.store = store_of(argv, self.environ)
        self.key = key(argv, self.environ, os.getcwd())
        self.on = True
        self.read: set[str] = set()
        self.listed: set[str] = set()
        self.not_kept: list[str] = []  # why no memo can be kept
        self.processes = False  # /proc was listed: daemons are looked for
        self.expires: float | None = None  # an input read holds until then (a kept failure)
        self.out: list[str] = []
        self.err: list[str] = []
        self._streams: tuple[Any, Any] = (sys.stdout, sys.stderr)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on:
            return
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return  # an fd already open (a pipe, a dup): its file was seen when opened
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and flags & _WRITE_FLAGS
            )
            if writes:
                self._wrote(path, event)
            else:
                self.read.add(_absolute(path))
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args and args[0] is not None else "."
            if isinstance(path, int):
                self.not_kept.append(f"{event} of an fd")
                return
            where = _absolute(path)
            self.processes |= where == "/proc"
            self.listed.add(where)
        elif event == STAT_EVENT:
            self.read.add(_absolute(args[0]))
        elif event == EXPIRES_EVENT:
            self.expires = min(self.expires or args[0], args[0])
        elif event == "os.mkdir":
            if not os.path.isdir(args[0]):  # exist_ok on a dir that is there changes nothing
                self._wrote(args[0], event)
        elif event in _WRITE_EVENTS:
            for path in args[:2] if event in ("os.rename", "os.link", "shutil.move") else args[:1]:
                self._wrote(path, event)
        elif event in _CHILD_EVENTS:
            self.not_kept.append(f"ran a child ({event})")

    def _wrote(self, path: Any, event: str) -> None:
        if isinstance(path, int):
            return  # through an fd: its open for writing was judged already
        name = os.fsdecode(path)
        if not _BOOKKEEPING.match(os.path.basename(name)):
            self.not_kept.append(f"{event} of {name}")

    def capture(self) -> None:
        """Keep what the serve prints from now on, as the bytes its streams write."""
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self.out)
        sys.stderr = _Tee(sys.stderr, self.err)

    def printed(self) -> tuple[bytes, bytes]:
        """(stdout, stderr) as written, each encoded as its stream encodes."""
        return tuple(  # type: ignore[return-value]
            "".join(sink).encode(s.encoding or "utf-8", s.errors or "strict")
            for s, sink in zip(self._streams, (self.out, self.err), strict=True)
        )

    def inputs(self, store: str) -> list[tuple[str, str]]:
        """(kind, path) of every input, its parents' dirs included (a stat of a path that is
        not there is seen in its dir's stamp)."""
        store_prefix = store.rstrip("/") + "/"
        paths = {p for p in self.read | self.listed if not _PROCESS.match(p)}
        in_store = {p for p in paths if p.startswith(store_prefix)}
        # A store path's dir too: a stat of a path that is not there shows only there. (Outside
        # the store, imports list the dirs they look in, and those are inputs already.)
        dirs = {os.path.dirname(p) for p in in_store} | set(self.listed)
        dirs |= {p for p in self.environ.get("PATH", "").split(os.pathsep) if p}  # which(...)
        out: list[tuple[str, str]] = []
        for p in sorted(paths | dirs):
            if _PROCESS.match(p) or p == "/proc":
                continue  # processes: looked for again at each replay
            if p.startswith(("/proc/", "/sys/")):
                out.append(("content", p) if p not in dirs else ("listing", p))
            elif p.startswith("/dev/"):
                continue
            elif p in dirs or os.path.isdir(p):
                inside = p == store or p.startswith(store_prefix)
                out.append(("listing" if inside else "stat", p))
            elif not _BOOKKEEPING.match(os.path.basename(p)):
                out.append(("stat", p))
        return out


_recorder: Recorder | None = None


def record(argv: Sequence[str]) -> Recorder:
    """Start recording this process (once; the hook cannot be removed, only turned off)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(argv)
        sys.addaudithook(_recorder.hook)
    return _recorder


def recording() -> Recorder | None:
    """The recorder __main__ started, if any (the CLI run in-process by tests has none)."""
    return _recorder if _recorder is not None and _recorder.on else None


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(MEMO_ENV, "").strip() != "0"


def explains(environ: Mapping[str, str]) -> bool:
    return environ.get(MEMO_ENV, "").strip() == "explain"


def _absolute(path: Any) -> str:
    return os.path.normpath(os.path.join(os.getcwd(), os.fsdecode(path)))


def document(
    rec: Recorder,
    engine: str,
    command: Sequence[str],
    environ: Mapping[str, str],
    ns_dir: str,
    hold: bool,
    stdout_to_stderr: bool,
) -> tuple[dict[str, Any] | None, str | None]:
    """(the memo of a finished full serve, None) or (None, why none is kept)."""
    rec.on = False
    if rec.not_kept:
        return None, rec.not_kept[0]
    try:
        out, err = rec.printed()
    except (UnicodeError, LookupError):
        return None, "its output cannot be kept as bytes"
    now = time.time_ns()
    inputs = []
    for kind, path in rec.inputs(rec.store):
        value = stamp(kind, path)
        # mtime alone: a file copied with its times kept (rsync -t, tar) has a fresh ctime only
        if kind == "stat" and value is not None and now - value[0] < _SETTLED_NS:
            return None, f"{path} changed within the last 2 s"
        inputs.append([kind, path, value])
    here = rec.environ
    doc = {
        "schema": SCHEMA,
        "key": rec.key,
        "inputs": inputs,
        "watch": list(WATCHED.get(engine, ("",))) if rec.processes else [],  # "": any process
        "expires": rec.expires,
        "out": out.decode("latin-1"),  # bytes, one char each
        "err": err.decode("latin-1"),
        "command": list(command),
        "set": {k: v for k, v in environ.items() if here.get(k) != v},
        "unset": sorted(k for k in here if k not in environ),
        "ns_dir": ns_dir,
        "hold": hold,
        "stdout_to_stderr": stdout_to_stderr,
    }
    return doc, None


# --- replaying (the fast path) ------------------------------------------------------------------


def lookup(argv: Sequence[str], environ: Mapping[str, str]) -> Hit | None:
    """The serve to replay for this command line, or None (run the full serve)."""
    if not enabled(environ) or "serve" not in argv:
        return None
    try:
        where = memo_dir(store_of(argv, environ))
        the_key = key(argv, environ, os.getcwd())
        doc = _read_private(where, f"{the_key}.json")
    except (OSError, ValueError, RecursionError):
        return None
    if doc is None or doc.get("schema") != SCHEMA or doc.get("key") != the_key:
        return None
    try:
        hit, inputs, watch, expires = _parse(doc, environ)
    except (KeyError, TypeError, ValueError):
        return None  # not a memo this fi-cache wrote
    if expires is not None and time.time() >= expires:
        return None
    for kind, path, value in inputs:
        if stamp(kind, path) != value:
            return None
    if watch and running(watch):
        return None
    if not os.access(hit.command[0], os.X_OK):
        return None  # the full serve says why it cannot be run
    return hit


def _read_private(directory: str, name: str) -> dict[str, Any] | None:
    """The memo, when it and its dir are this user's alone; else None."""
    uid = os.getuid()
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(os.path.join(directory, name), flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
            return None
        data = json.loads(f.read(_MAX_MEMO + 1)[:_MAX_MEMO])
    return data if isinstance(data, dict) else None


def _parse(
    doc: dict[str, Any], environ: Mapping[str, str]
) -> tuple[Hit, list[tuple[str, str, Stamp]], list[bytes], float | None]:
    command = doc["command"]
    if not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command")
    changed, unset = doc["set"], doc["unset"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in changed.items()):
        raise ValueError("set")
    env = {k: v for k, v in environ.items() if k not in set(unset)}
    env.update(changed)
    inputs = [(str(k), str(p), v) for k, p, v in doc["inputs"] if k in _STAMPERS]
    if len(inputs) != len(doc["inputs"]):
        raise ValueError("inputs")
    hit = Hit(
        out=str(doc["out"]).encode("latin-1"),
        err=str(doc["err"]).encode("latin-1"),
        command=command,
        environ=env,
        ns_dir=str(doc["ns_dir"]),
        hold=doc["hold"] is True,
        stdout_to_stderr=doc["stdout_to_stderr"] is True,
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


def hand_over(hit: Hit) -> None:
    """Note the serve, hold the namespace in use, exec the engine. Returns only when the exec
    failed (the full serve then says why)."""
    from fi_cache.store import in_use

    ns = hit.ns_dir
    in_use.note_served(ns)
    fd = in_use.mark(ns) if hit.hold else None
    try:
        os.execve(hit.command[0], hit.command, hit.environ)
    except OSError:
        if fd is not None:
            os.close(fd)
