"""warm --engine flashinfer --plan PLAN: tune a plan's ops with FlashInfer's own autotuner into
each finalize mode's namespace, without vLLM or weights (the `warm` command is in warm.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fi_cache.cli import options, render
from fi_cache.cli.process import show_tail


class _TuneStatus:
    """One live line per call on a terminal ("[tune 3/12] op [backend] 128 tokens", then the
    bucket FlashInfer is profiling); plain lines otherwise, one per finished call, so CI logs show
    where the time went, and a bucket line when a call has been quiet for QUIET_S seconds."""

    QUIET_S = 10.0  # a MoE call tunes every bucket in one call: minutes without a finished call

    def __init__(
        self, quiet: bool, clock: Callable[[], float] = time.monotonic, verb: str = "tune"
    ) -> None:
        self.quiet, self.verb = quiet, verb  # verb: "tune" (warm), "bench" (fi-cache bench)
        self.tty = sys.stderr.isatty()
        self.current: dict[str, Any] = {}
        self.live = False
        self.clock = clock
        self.last_line = clock()

    def waiting(self, holder: Any) -> None:
        self.note(f"waiting for {holder.describe() if holder else 'another fi-cache process'}")

    def call(self, event: dict[str, Any]) -> None:
        if self.quiet:
            return
        if event["event"] == "probe":
            self.note(f"checking {event['op']} [{event['backend']}] (first calls build kernels)")
            return
        if event["event"] == "call":
            self.current = event
            self.last_line = self.clock()  # quiet counts from the call's start
            if self.tty:
                self._live(self._line(event, "…"))
            return
        if event["event"] == "op_done":  # a line of its own on a terminal and in a log
            took = f"{event['calls']} calls in {float(event['seconds']):.1f}s"
            self.note_plain(f"[op {event['op_i']}/{event['ops']}] {event['op']}: {took}")
            return
        if event["event"] == "bucket":
            where = f"bucket {event.get('bucket')} ({event.get('step')}/{event.get('total')})"
            if self.tty:
                self._live(self._line(self.current, f"{where} …"))
            elif self.clock() - self.last_line >= self.QUIET_S:
                self._plain(self._line(self.current, f"{where} …"))
            return
        line = self._line(self.current, f"{event['seconds']:.2f}s")
        if self.tty:
            self._live(line)
        else:
            self._plain(line)

    def _live(self, line: str) -> None:
        width = render.terminal_width_stderr()
        click.echo(f"\r\x1b[K{line[: width - 1]}", err=True, nl=False)
        self.live = True

    def _plain(self, line: str) -> None:
        click.echo(line, err=True)
        self.last_line = self.clock()

    def _line(self, event: dict[str, Any], took: str) -> str:
        i, n = int(event.get("i") or 0), int(event.get("n") or 0)
        bar = ""
        if self.tty and n:
            done = round(20 * i / n)
            bar = "#" * done + "-" * (20 - done) + " "
        where = f", op {event['op_i']}/{event['ops']}" if event.get("ops") else ""
        return (
            f"[{self.verb} {bar}{i}/{n}{where}] {event.get('op')} "
            f"[{event.get('backend')}] {event.get('tokens')} tokens {took}"
        )

    def note_plain(self, message: str) -> None:
        if self.live:
            click.echo(err=True)
            self.live = False
        self._plain(message)

    def note(self, message: str) -> None:
        if self.live:
            click.echo(err=True)
            self.live = False
        if not self.quiet:
            render.warn(message)


def warm_flashinfer(
    plan_path: Path,
    finalize: str | None,
    python: str | None,
    timeout: float,
    lock_timeout: float,
    repeat: int = 1,
) -> int:
    """`warm --engine flashinfer --plan PLAN` (fi_cache/lifecycle/tune.py), rendered."""
    from fi_cache.engines.api import WarmFailed
    from fi_cache.engines.flashinfer import warm as tune_warm
    from fi_cache.lifecycle import tune

    ctx = options.context()
    status = _TuneStatus(ctx.quiet)
    progress = tune_warm.TuneProgress(status.waiting, status.call, status.note)
    try:
        results = tune.warm_plan(
            ctx.store, plan_path, finalize, python, timeout, lock_timeout, progress, repeat
        )
    except tune_warm.TuneInterrupted as exc:
        for mode, ns_dir in exc.recorded:
            status.note(f"{mode} finalize was tuned and recorded before the interrupt: {ns_dir}")
        if exc.hint:
            status.note(exc.hint)
        raise
    except WarmFailed as exc:
        status.note("tuning failed")
        show_tail(exc.lines, "the tuning process")
        raise
    status.note("done")
    _report(plan_path, results, ctx.json)
    return 0


def _report(plan_path: Path, results: list[Any], as_json: bool) -> None:
    docs = [
        {
            "namespace": str(r.namespace_dir),
            "finalize": r.mode,
            "file": str(r.cache_path),
            "entries": r.record.files[0].entries,
            "size": r.record.files[0].size,
            "calls": r.calls,
            "seconds": r.seconds,
            "flashinfer_version": r.flashinfer_version,
            "device": r.device,
            "tactic_counts": r.counts,
            "robust": None
            if r.robust is None
            else {"kept_default": r.robust[0], "buckets": r.robust[1]},
        }
        for r in results
    ]
    if as_json:
        render.emit_json({"engine": "flashinfer", "plan": str(plan_path), "namespaces": docs})
        return
    for d in docs:
        counts = d["tactic_counts"]
        extra = ""
        if counts:
            g2 = counts["gemm2"]
            extra = (
                f"; MoE tactics: gemm1 {counts['gemm1']}, gemm2 fused {g2.get('fused')}"
                f" / unfused {g2.get('unfused')}"
            )
        click.echo(
            f"{d['finalize']}: {d['calls']} calls tuned in {d['seconds']:.1f}s on {d['device']} "
            f"(FlashInfer {d['flashinfer_version']}): {d['entries']} entries{extra}"
        )
        if d["robust"]:
            kept, total = d["robust"]["kept_default"], d["robust"]["buckets"]
            click.echo(
                f"  --repeat: {kept} of {total} buckets kept FlashInfer's default "
                "(no tactic won robustly)"
            )
        click.echo(f"  {d['file']}")
    click.echo("load it: flashinfer.autotune(False, cache=FILE) around your engine's warm-up")
