"""The tuning child: `python -m fi_cache.engines.flashinfer` in its own session, so Ctrl-C here
stops it (and whatever it started) cleanly; JSON lines both ways (driver.py is the other end)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import fi_cache
from fi_cache.engines.api import WarmFailed
from fi_cache.engines.guard import Guard, holding_lock, start_guarded
from fi_cache.errors import Refused

_REFUSALS = {"no-gpu", "unsupported", "flashinfer", "job", "stopped"}
_PROGRESS = ("probe", "call", "bucket", "called", "op_done")  # events the progress line shows
_TAIL = 30  # lines of the child's stderr kept for a failure report


class TuningChild:
    """One tuning child; a context manager that stops it (its whole group) on the way out."""

    def __init__(
        self, python: str, timeout: float, grace: float, lock_dir: Path | None = None
    ) -> None:
        """`lock_dir`: a lock this process holds (the GPU's); its guard keeps it held until the
        child is stopped, if this process dies first (engines/guard.py)."""
        self.python, self.timeout, self.grace, self.lock_dir = python, timeout, grace, lock_dir
        self.guard: Guard | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> TuningChild:
        env = dict(os.environ)
        # The child imports fi_cache from where this one lives, even in another interpreter.
        here = str(Path(fi_cache.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:  # the child runs only once its guard does: a SIGKILL in between starts nothing
            self.proc, self.guard = start_guarded(
                [self.python, "-m", "fi_cache.engines.flashinfer"],
                self._guard,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",  # a native library's bytes must not kill the reader
                env=env,
            )
        except OSError as exc:
            raise Refused(f"cannot run {exc.strerror}", self.python) from None
        self.reader = threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)
        self.reader.start()
        self.expired = False
        self.watchdog: threading.Timer | None = None
        self.arm()
        return self

    def _guard(self, pid: int) -> Guard:
        return holding_lock(pid, self.grace, self.lock_dir)

    def __exit__(self, *exc: object) -> None:
        self.disarm()
        self.stop()
        if self.guard is not None:
            self.guard.release()

    def arm(self) -> None:
        """(Re)start the watchdog: a timer, not a check between lines, since a child stuck in a
        kernel prints nothing."""
        self.disarm()
        self.watchdog = threading.Timer(self.timeout, self._expire)
        self.watchdog.daemon = True
        self.watchdog.start()

    def disarm(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()

    @contextlib.contextmanager
    def stopped_on_error(self) -> Iterator[None]:
        """Stop the child before leaving the lock's scope when anything goes wrong."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def _expire(self) -> None:
        self.expired = True
        self.stop()  # its stdout closes, so the reader sees the end and reports the timeout

    def _drain(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            self.tail.append(line.rstrip("\n"))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it died or was stopped; its exit status and the events tell why

    def _read(self) -> Iterator[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.tail.append(line.rstrip("\n"))
                continue
            if isinstance(event, dict) and "event" in event:
                yield event

    def close_input(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def until(
        self, name: str, on_call: Callable[[dict[str, Any]], None] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Events up to and including the one called `name` (_PROGRESS events also go to
        `on_call`); raises on `error` or death."""
        for event in self._read():
            self._fail_on(event)
            if on_call is not None and event["event"] in _PROGRESS:
                on_call(event)
            yield event
            if event["event"] == name:
                return
        self._died()

    def _fail_on(self, event: dict[str, Any]) -> None:
        if event["event"] != "error":
            return
        message = str(event.get("message", "the tuning process failed"))
        if event.get("kind") in _REFUSALS:
            raise Refused(message)
        self._settle()
        raise WarmFailed(message, list(self.tail))

    def _settle(self) -> None:
        """Let the child exit and its stderr be read to the end: the report shows its last words."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)
        self.reader.join(5.0)

    def _died(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        self.reader.join(5.0)
        if self.expired:
            raise WarmFailed(
                f"tuning took over {self.timeout:.0f}s (--timeout); stopped it",
                list(self.tail),
            )
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise WarmFailed(f"the tuning process {how} without a result", list(self.tail))

    def stop(self) -> None:
        """Close its stdin (a child waiting for a cache path exits); then SIGINT, SIGTERM and
        SIGKILL to its process group, `grace` seconds apart."""
        proc = self.proc
        if proc is None:
            return
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for sig in (None, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
            try:
                proc.wait(2.0 if sig is None else self.grace)
                return
            except subprocess.TimeoutExpired:
                continue
