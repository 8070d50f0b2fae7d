"""What commands that run a child process (warm, serve) share: SIGTERM handled like Ctrl-C, the
grace between stop signals, the live status line, and the child's last lines and whole log when
it failed."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from fi_cache.cli import render
from fi_cache.errors import Refused

STOP_GRACE_ENV = "FI_CACHE_STOP_GRACE"


def sigterm_as_interrupt() -> None:
    """SIGTERM (kubectl delete, systemd stop) stops a warm like Ctrl-C: the child is stopped too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def stop_grace() -> float:
    """Seconds between SIGINT, SIGTERM and SIGKILL ($FI_CACHE_STOP_GRACE, default 10)."""
    try:
        return max(0.0, float(os.environ.get(STOP_GRACE_ENV, "10")))
    except ValueError:
        raise Refused(f"{STOP_GRACE_ENV} must be a number of seconds") from None


def show_tail(lines: list[str], what: str) -> None:
    """A failed child's last output lines, before the one-line reason."""
    if lines:
        click.echo(f"--- last {len(lines)} lines of {what} ---", err=True)
        for line in lines:
            click.echo(line, err=True)


class Status:
    """Elapsed time and the engine's last log line: one live line on a terminal, plain lines
    else."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last_plain = 0.0
        self.live = False

    def waiting(self, holder: Any) -> None:
        who = holder.describe() if holder else "another fi-cache process"
        self.note(f"waiting for {who}")

    def tick(self, elapsed: float, line: str) -> None:
        if self.quiet:
            return
        if self.tty:
            width = max(20, render.terminal_width_stderr() - 12)
            click.echo(f"\r\x1b[K[warm {elapsed:5.0f}s] {line[-width:]}", err=True, nl=False)
            self.live = True
        elif elapsed - self.last_plain >= 15:
            self.last_plain = elapsed
            click.echo(f"[warm {elapsed:.0f}s] {line}", err=True)

    def note(self, message: str) -> None:
        if self.live:
            click.echo(err=True)
            self.live = False
        if not self.quiet:
            click.echo(f"fi-cache: {message}", err=True)


def keep_log(store: Path, lines: list[str], note: Any, who: str = "vLLM") -> None:
    """Save a failed warm's whole output and say what a gemm profile-id crash means."""
    from fi_cache.doctor.logs import PROFILE_ID
    from fi_cache.errors import FiCacheError
    from fi_cache.store.logs import save_failed_warm

    if not lines:
        return
    try:
        log = save_failed_warm(store, lines)
    except (FiCacheError, OSError):
        return  # a read-only store: the tail above is all there is
    crash = next((m.group(0) for line in lines if (m := PROFILE_ID.search(line))), None)
    if crash:
        note(
            f"{who} died replaying a cached MoE tactic its kernels do not have ({crash}): a file "
            "tuned in the other finalize mode is where this start looked"
        )
    note(f"{who}'s whole output: {log} (explain it: fi-cache doctor --log {log})")
