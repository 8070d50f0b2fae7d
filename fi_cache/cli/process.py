"""What commands that run a child process (warm, serve) share: SIGTERM handled like Ctrl-C, the
grace between stop signals, and the child's last lines when it failed."""

from __future__ import annotations

import os
import signal

import click

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
