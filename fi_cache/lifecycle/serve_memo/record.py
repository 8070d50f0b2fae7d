"""Recording a full serve: what it read (sys.audit's open and listdir events, and os.stat,
os.lstat and os.access watched), what it wrote, whether it started a child; what it printed;
and, at its end, the memo of it, or why none can be kept."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time

from fi_cache.lifecycle.serve_memo import (
    EXPIRES_EVENT,
    SCHEMA,
    STAT_EVENT,
    key,
    store_of,
)
from fi_cache.lifecycle.serve_memo.stamps import bookkeeping, settled_before, stamp

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from fi_cache.lifecycle.serve_memo.stamps import Stamp

_SETTLED_NS = 2_000_000_000  # changed this recently: may change again within its mtime tick
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
_WRITES_SECOND = frozenset({"os.rename", "os.link", "os.symlink", "shutil.move"})  # (src, dst)
_CHILD_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "os.system"}
)
_real_stat, _real_lstat, _real_access = os.stat, os.lstat, os.access


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
    """What a full serve read, listed and wrote. Raises OSError when the working dir is gone."""

    def __init__(self, argv: Sequence[str]) -> None:
        # As the serve began: it may change its own environment on the way.
        self.environ = dict(os.environ)
        self.started = time.time()
        self.cwd = os.getcwd()
        self.store = store_of(argv, self.environ)
        self._stores = {self.store, os.path.realpath(self.store)}
        self._store_dirs = tuple(s.rstrip("/") + "/" for s in self._stores)
        self.key = key(argv, self.environ, self.cwd)
        self.on = True
        self.seen: dict[tuple[str, str], Stamp] = {}  # (kind, path): its stamp when first read
        self.not_kept: list[str] = []  # why no memo can be kept
        self.processes = False  # /proc was listed: daemons are looked for
        self.expires: float | None = None  # an input read holds until then (a kept failure)
        self.out: list[str] = []
        self.err: list[str] = []
        self._streams: tuple[Any, Any] = (sys.stdout, sys.stderr)
        for module in list(sys.modules.values()):  # imported before recording began
            for path in (getattr(module, "__file__", None), getattr(module, "__cached__", None)):
                if isinstance(path, str):
                    self._note("stat", path)
        for site_dir in _site_dirs():  # site ran their .pth files before recording began
            self._note("dir", site_dir)
            with contextlib.suppress(OSError):
                for name in os.listdir(site_dir):
                    if name.endswith(".pth"):
                        self._note("stat", os.path.join(site_dir, name))

    # --- what was read -------------------------------------------------------------------------

    def _saw(self, kind: str, path: Any) -> None:
        """An input, stamped as it was first read (a change before the serve ends is seen)."""
        if self.on and not isinstance(path, int):  # an fd: its file was seen when opened
            self._note(kind, path)

    def _abs(self, path: Any) -> str:
        return os.path.normpath(os.path.join(self.cwd, os.fsdecode(path)))

    def _note(self, kind: str, path: Any) -> None:
        p = self._abs(path)
        if p == "/proc" or _PROCESS.match(p):
            return  # processes: looked for again at each replay
        if p.startswith("/dev/") and not p.startswith("/dev/shm/"):
            return  # a device (/dev/null, a tty): no input; /dev/shm is a filesystem
        if p.startswith(("/proc/", "/sys/")):
            kind = "listing" if kind in ("dir", "listing") else "content"
        elif kind == "dir" and self._in_store(p):
            kind = "listing"  # by its entries: the serve's own probe files come and go there
        if (kind, p) not in self.seen:
            on, self.on = self.on, False  # stamping lists and opens too: not the serve's
            try:
                self.seen[(kind, p)] = stamp(kind, p)
            finally:
                self.on = on

    def _in_store(self, p: str) -> bool:
        return p in self._stores or p.startswith(self._store_dirs)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on:
            return
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and flags & _WRITE_FLAGS
            )
            if writes:
                self._wrote(path, event)
            else:
                self._saw("stat", path)
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args and args[0] is not None else "."
            if isinstance(path, int):
                self.not_kept.append(f"{event} of an fd")
                return
            self.processes |= self._abs(path) == "/proc"
            self._saw("dir", path)
        elif event == STAT_EVENT:
            self._saw("stat", args[0])
        elif event == EXPIRES_EVENT:
            self.expires = min(self.expires or args[0], args[0])
        elif event == "os.mkdir":
            try:  # exist_ok on a dir that is there changes nothing
                there = os.path.isdir(self._abs(args[0]))
            except (OSError, TypeError, ValueError):
                there = False
            if not there:
                self._wrote(args[0], event)
        elif event in _WRITE_EVENTS:
            self._wrote(args[1] if event in _WRITES_SECOND else args[0], event)
            if event == "os.rename":
                self._wrote(args[0], event)  # a rename removes its source too
        elif event in _CHILD_EVENTS:
            self.not_kept.append(f"ran a child ({event})")

    def _wrote(self, path: Any, event: str) -> None:
        if isinstance(path, int):
            return  # through an fd: its open for writing was judged already
        name = os.fsdecode(path)
        if not bookkeeping(os.path.basename(name)):
            self.not_kept.append(f"{event} of {name}")

    def watch_stats(self) -> None:
        """os.stat, os.lstat and os.access note their paths while recording: a decision on a
        stat alone (a model dir there or not, a link, a dir that cannot be written) is an input.
        (The import system keeps its own posix.stat: its files are opened, and are inputs.)"""
        rec = self

        def stat_(path: Any, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
            rec._stat_call(path, dir_fd, "stat" if follow_symlinks else "lstat")
            return _real_stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

        def lstat_(path: Any, *, dir_fd: int | None = None) -> Any:
            rec._stat_call(path, dir_fd, "lstat")
            return _real_lstat(path, dir_fd=dir_fd)

        def access_(path: Any, mode: int, **kw: Any) -> bool:
            rec._stat_call(path, kw.get("dir_fd"), "access")
            return _real_access(path, mode, **kw)

        os.stat, os.lstat, os.access = stat_, lstat_, access_

    def _stat_call(self, path: Any, dir_fd: int | None, kind: str) -> None:
        if not self.on:
            return
        if dir_fd is not None:
            self.not_kept.append("a stat relative to a dir fd")
            return
        with contextlib.suppress(TypeError, ValueError):  # not a path: the call raises itself
            self._saw(kind, path)

    # --- what was printed ----------------------------------------------------------------------

    def capture(self) -> None:
        """Keep what the serve prints from now on, as the bytes its streams write."""
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self.out)
        sys.stderr = _Tee(sys.stderr, self.err)

    def printed(self) -> tuple[bytes, bytes]:
        """(stdout, stderr) as written, each encoded as its stream encodes."""
        out, err = (
            "".join(sink).encode(s.encoding or "utf-8", s.errors or "strict")
            for s, sink in zip(self._streams, (self.out, self.err), strict=True)
        )
        return out, err

    # --- the memo ------------------------------------------------------------------------------

    def inputs(self) -> list[tuple[str, str, Stamp]]:
        """Every input with its stamp now, the sources of compiled modules added (the import
        system reads a .py's stat alone when its .pyc is current). Raises ValueError naming an
        input that changed while the serve read it."""
        from importlib.util import source_from_cache

        for kind, path in list(self.seen):
            if kind == "stat" and path.endswith(".pyc"):
                with contextlib.suppress(ValueError):  # not a PEP 3147 name: no source to stat
                    self._note("stat", source_from_cache(path))
        self.on = False
        out = []
        for (kind, path), first in sorted(self.seen.items()):
            now = stamp(kind, path)
            if now != first:
                raise ValueError(f"{path} changed while this serve read it")
            out.append((kind, path, now))
        return out


def watched(engine: str) -> tuple[list[list[str]], list[str]]:
    """What the full serve looked for in /proc, as replay.running matches it: word sequences
    (the first by its basename) anywhere in a command line, and prefixes of its first word.
    vLLM: its `vllm preload` daemons (caches/daemon.is_preload); SGLang: its servers and their
    processes (engines/sglang/live.is_sglang); another engine: any process at all."""
    from fi_cache.versions import PRELOAD_SUBCOMMAND, SGLANG_LAUNCH_MODULE, VLLM_CLI_MODULE

    if engine == "vllm":
        return [["vllm", PRELOAD_SUBCOMMAND], ["-m", VLLM_CLI_MODULE, PRELOAD_SUBCOMMAND]], []
    if engine == "sglang":
        return [["sglang", "serve"], ["-m", SGLANG_LAUNCH_MODULE]], ["sglang::"]
    return [], [""]


def _site_dirs() -> list[str]:
    import site

    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    return [d for d in [*site.getsitepackages(), *user] if os.path.isdir(d)]


_recorder: Recorder | None = None


def record(argv: Sequence[str]) -> Recorder | None:
    """Start recording this process (once; the hook cannot be removed, only turned off). None
    where no memo can be kept (the working dir is gone)."""
    global _recorder
    if _recorder is None:
        try:
            _recorder = Recorder(argv)
        except OSError:
            return None
        sys.addaudithook(_recorder.hook)
        _recorder.watch_stats()
    return _recorder


def recording() -> Recorder | None:
    """The recorder __main__ started, if any (the CLI run in-process by tests has none)."""
    return _recorder if _recorder is not None and _recorder.on else None


def document(
    rec: Recorder,
    engine: str,
    display: str,
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
    try:
        inputs = rec.inputs()
    except ValueError as exc:
        return None, str(exc)
    since = time.time_ns() - _SETTLED_NS
    for _kind, path, value in inputs:
        if not settled_before(value, since):  # mtime alone: a file copied with its times kept
            return None, f"{path} changed within the last 2 s"
    here = rec.environ
    doc = {
        "schema": SCHEMA,
        "key": rec.key,
        "inputs": [list(i) for i in inputs],
        "watch": watched(engine) if rec.processes else None,
        "expires": rec.expires,
        "recorded": rec.started,  # a clock stepped back before it: the full serve
        "out": out,
        "err": err,
        "command": list(command),
        "display": display,
        "set": {k: v for k, v in environ.items() if here.get(k) != v},
        "unset": sorted(k for k in here if k not in environ),
        "ns_dir": ns_dir,
        "hold": hold,
        "stdout_to_stderr": stdout_to_stderr,
    }
    return doc, None
