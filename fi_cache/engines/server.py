"""An engine's HTTP server as a child process: started in a session of its own (its whole group
is stopped together, by a guard too when fi-cache dies first, running before the engine does),
`GET /health` polled until 200, stopped with SIGINT, then SIGTERM, then SIGKILL. vLLM and SGLang
both answer /health 200 only after warm-up, FlashInfer autotuning and the cache save
(docs/serving.md)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from fi_cache.engines.guard import Guard, holding_lock, start_guarded
from fi_cache.errors import Refused

# Lines that name the autotune file a start read or wrote: vLLM's own (kernel_warmup.py 0.32:460
# "Using FlashInfer autotune cache file: %s") and FlashInfer's load/save lines (autotuner.py
# 0.6.18:2652 "Saved %d configs to %s", :2789 "Loaded %d configs from %s"), which SGLang prints
# too. A start that loads a file and finds nothing new to save leaves it untouched.
CACHE_FILE_LINE = re.compile(
    r"(?:Using FlashInfer autotune cache file: |\[Auto[Tt]uner\]: (?:Loaded|Saved) \d+ configs "
    r"(?:from|to) )(\S+)"
)


def named_cache_file(line: str) -> str | None:
    """The path a vLLM/FlashInfer log line says this start used, if any."""
    m = CACHE_FILE_LINE.search(line)
    return m.group(1) if m else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Is something listening there? Bound as the engines bind (uvicorn sets SO_REUSEADDR):
    the TIME_WAIT a just-stopped warm leaves on its port is no listener, and the next warm
    on that --port must not be refused (two of three on the H200, 2026-12-04)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class Server:
    """An engine's server child in its own session, with its last log lines kept."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        keep_lines: int = 30,
        lock_dir: Path | None = None,
        grace: float = 10.0,
        name: str = "vLLM",
    ) -> None:
        """`lock_dir`: the namespace whose lock this process holds; a guard then stops the
        engine's group, and keeps the lock held until it has, if this process dies first."""
        self.log: deque[str] = deque(maxlen=50_000)  # for the log file a failed warm leaves
        self._keep = keep_lines
        self.named_files: set[str] = set()  # autotune files its log says it read or wrote

        def guard(pid: int) -> Guard | None:
            return None if lock_dir is None else holding_lock(pid, grace, lock_dir)

        try:  # the engine runs only once its guard does: a SIGKILL in between starts nothing
            self.proc, self._guard = start_guarded(
                cmd,
                guard,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise Refused(f"cannot start {name}: {exc.strerror}", cmd[0]) from None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))
            if (path := named_cache_file(line)) is not None:
                self.named_files.add(path)  # every line, not only the kept tail

    @property
    def last_line(self) -> str:
        return self.log[-1] if self.log else ""

    @property
    def lines(self) -> list[str]:
        """Its last `keep_lines` lines: what a failure shows."""
        return list(self.log)[-self._keep :]

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float = 10.0) -> int:
        """SIGINT, then SIGTERM, then SIGKILL to the whole process group; returns the exit code."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, grace / 2), (signal.SIGKILL, 5)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        # Workers left in the group after the leader exited: no orphans.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=2)
        code = self.proc.wait()
        if self._guard is not None:
            self._guard.release()
        return code


def health_ok(port: int, host: str = "127.0.0.1", timeout: float = 2.0) -> bool:
    import urllib.error  # deferred: only a warm polls, serve's exec path never does
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    server: Server,
    port: int,
    timeout: float,
    tick: float = 0.5,
    on_tick: Callable[[float, str], None] | None = None,
) -> str:
    """'healthy', 'exited' or 'timeout'; calls on_tick(elapsed, last_line) while waiting."""
    start = time.monotonic()
    while True:
        if server.poll() is not None:
            return "exited"
        if health_ok(port):
            return "healthy"
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            return "timeout"
        if on_tick is not None:
            on_tick(elapsed, server.last_line)
        time.sleep(tick)
