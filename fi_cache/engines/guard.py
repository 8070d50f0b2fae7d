"""A guard for an engine's process group: when fi-cache dies first (SIGKILL included, which no
handler sees), the group is stopped too, and the namespace lock stays held until it is.

Why a process and not PR_SET_PDEATHSIG: a parent-death signal reaches only the direct child (the
vLLM API server), and a SIGKILLed fi-cache leaves nobody to escalate when vLLM ignores SIGTERM or
its engine core and workers outlive it. The guard is a small Python process in a session of its
own (a terminal's Ctrl-C is fi-cache's to handle), reading a pipe only fi-cache can write to:
end of file means fi-cache is gone or done. It then signals the whole group (SIGTERM, then
SIGKILL after the grace) and exits, which closes the lock descriptor it inherited.

Nothing of the guarded child runs before its guard does (`start_guarded`): the child starts as a
shim that execs the command only on a go-ahead sent once the guard is running, so a fi-cache
killed in between leaves the shim an end of file, and it exits having started nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fi_cache.store import locks

_GUARD = r"""
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
while os.read(0, 4096):
    pass


def gone():
    # No live member left (zombies are dead: an init that never reaps keeps them forever).
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return False  # no /proc: the group exists
    for name in names:
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return False
    return True


for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
    if gone():
        break
    try:
        os.killpg(pgid, sig)
    except OSError:
        break
    deadline = time.monotonic() + wait
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


# The child's first program: waits for the go-ahead on fd argv[1], then execs argv[3:] (same pid,
# session and group), or writes exec's errno to fd argv[2], which an exec closes (as Popen's own).
_SHIM = r"""
import os, sys
go, err = int(sys.argv[1]), int(sys.argv[2])
os.set_inheritable(err, False)
if not os.read(go, 16).startswith(b"go"):
    os._exit(125)
os.close(go)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    os.write(err, str(exc.errno).encode())
os._exit(127)
"""


def start_guarded(
    cmd: Sequence[str], guard: Callable[[int], Guard | None], **popen: Any
) -> tuple[subprocess.Popen[str], Guard | None]:
    """Popen(cmd, start_new_session=True, **popen), with `guard(pid)` (which starts the child's
    guard, or returns None for none) called before anything of `cmd` runs. Raises OSError as
    Popen does when `cmd` cannot be executed; then nothing is left running."""
    go_read, go_write = os.pipe()  # non-inheritable: the shim gets them by pass_fds only
    err_read, err_write = os.pipe()
    try:
        proc: subprocess.Popen[str] = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SHIM, str(go_read), str(err_write), *cmd],
            pass_fds=(go_read, err_write),
            start_new_session=True,
            **popen,
        )
    except BaseException:
        os.close(go_write)
        os.close(err_read)
        raise
    finally:
        os.close(go_read)
        os.close(err_write)
    guarding: Guard | None = None
    try:
        guarding = guard(proc.pid)
        os.write(go_write, b"go\n")
    except BaseException:
        os.close(go_write)  # no go-ahead: the shim reads end of file and exits, having run nothing
        os.close(err_read)
        _reap(proc, guarding)
        raise
    os.close(go_write)
    with os.fdopen(err_read, "rb") as f:
        failed = f.read()  # end of file at the exec: the command runs
    if failed:
        _reap(proc, guarding)
        code = int(failed)
        raise OSError(code, os.strerror(code), cmd[0])
    return proc, guarding


def holding_lock(pid: int, grace: float, lock_dir: Path | None) -> Guard:
    """A guard of group `pid` that keeps `lock_dir`'s lock (held by this process) until then."""
    guard = Guard(pid, grace, locks.guard_fds(lock_dir) if lock_dir is not None else [])
    if lock_dir is not None:
        try:
            locks.share_with_guard(lock_dir, guard.pid)
        except BaseException:
            guard.release(0)
            raise
    return guard


def _reap(proc: subprocess.Popen[str], guarding: Guard | None) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if guarding is not None:
        guarding.release()


class Guard:
    """Stops process group `pgid` when this process exits without calling `release` first."""

    def __init__(self, pgid: int, grace: float, keep_fds: Sequence[int] = ()) -> None:
        read_end, write_end = os.pipe()  # both non-inheritable: the engine never holds them
        self._write_end: int | None = write_end
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _GUARD, str(pgid), str(grace)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=tuple(keep_fds),
                start_new_session=True,
            )
        finally:
            os.close(read_end)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self, timeout: float = 5.0) -> None:
        """The engine is stopped: let the guard go (it finds the group gone and exits)."""
        if self._write_end is not None:
            with contextlib.suppress(OSError):
                os.close(self._write_end)
            self._write_end = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
