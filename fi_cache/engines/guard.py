"""A guard for an engine's process group: when fi-cache dies first (SIGKILL included, which no
handler sees), the group is stopped too, and the namespace lock stays held until it is.

Why a process and not PR_SET_PDEATHSIG: a parent-death signal reaches only the direct child (the
vLLM API server), and a SIGKILLed fi-cache leaves nobody to escalate when vLLM ignores SIGTERM or
its engine core and workers outlive it. The guard is a small Python process in a session of its
own (a terminal's Ctrl-C is fi-cache's to handle), reading a pipe only fi-cache can write to:
end of file means fi-cache is gone or done. It then signals the whole group (SIGTERM, then
SIGKILL after the grace) and exits, which closes the lock descriptor it inherited.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence

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
