"""What a command that runs an engine does with signals: SIGTERM handled like Ctrl-C while it
warms, and the grace between the stop signals it sends."""

from __future__ import annotations

import os
import signal

from fi_cache.errors import Refused

STOP_GRACE_ENV = "FI_CACHE_STOP_GRACE"


def sigterm_as_interrupt() -> None:
    """SIGTERM (kubectl delete, systemd stop) stops a warm like Ctrl-C: the child is stopped too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def sigterm_default() -> None:
    """After a warm, before serve hands over: SIGTERM is the engine's again."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_grace() -> float:
    """Seconds between SIGINT, SIGTERM and SIGKILL ($FI_CACHE_STOP_GRACE, default 10)."""
    try:
        return max(0.0, float(os.environ.get(STOP_GRACE_ENV, "10")))
    except ValueError:
        raise Refused(f"{STOP_GRACE_ENV} must be a number of seconds") from None
