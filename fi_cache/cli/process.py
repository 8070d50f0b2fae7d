"""How commands that run an engine (warm, serve) show it: the live status line, the lifecycle's
Report rendered, and a failed warm's last lines and kept log."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from fi_cache.cli import render

if TYPE_CHECKING:
    from fi_cache.doctor.findings import Finding
    from fi_cache.engines.api import WarmFailed
    from fi_cache.lifecycle.report import Report


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


def say_finding(f: Finding) -> None:
    """A pre-flight finding: -q keeps the errors."""
    say = render.error if f.severity == "error" else render.warn
    say(f"{f.severity} {f.check}: {f.path}: {f.message}\n    fix: {f.fix}")


def reporter(quiet: bool) -> tuple[Report, Status]:
    """The lifecycle's Report, rendered on stderr, and the status line it drives."""
    from fi_cache.lifecycle.report import Report

    status = Status(quiet)
    report = Report(
        warn=render.warn,
        finding=say_finding,
        waiting=status.waiting,
        tick=status.tick,
        note=status.note,
        quiet=quiet,
    )
    return report, status


def say_failed_warm(exc: WarmFailed, who: str, status: Status) -> None:
    """The engine's last lines, then what its kept log says (the reason is the last line)."""
    status.note("warm failed")
    show_tail(exc.lines, f"{who}'s output")
    if exc.root_cause:
        status.note(f"root cause, {exc.root_cause}")
    if exc.saved_log is None:
        return  # a read-only store: the tail above is all there is
    if exc.crash:
        status.note(
            f"{who} died replaying a cached MoE tactic its kernels do not have ({exc.crash}): a "
            "file tuned in the other finalize mode is where this start looked"
        )
    log = exc.saved_log
    status.note(f"{who}'s whole output: {log} (explain it: fi-cache doctor --log {log})")
