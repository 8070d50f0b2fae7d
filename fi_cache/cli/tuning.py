"""plan, and warm --engine flashinfer: tune FlashInfer ops from a plan, without vLLM or weights."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fi_cache.cli import render
from fi_cache.errors import Refused

_TOKENS_HELP = (
    "Token counts each op is run at, comma-separated (FlashInfer tunes every bucket up to each)."
)


def _ctx() -> Any:
    return click.get_current_context().obj


def _tokens(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers like 1,16,128,1024") from None
    if not values:
        raise click.BadParameter("expected at least one token count")
    return values


def read_plan(path: Path) -> tuple[Any, str]:
    """(Plan, its text). Refused (exit 2) for an unreadable or invalid plan."""
    from fi_cache.errors import read_refusal
    from fi_cache.tune import plan as plans

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise Refused("not a text file (a TOML plan is UTF-8 text)", path) from None
    except OSError as exc:
        raise read_refusal(exc, path, "plan file") from None
    return plans.loads(text, str(path)), text


@click.command("plan")
@click.option(
    "--from-hf-config",
    "hf_config",
    type=click.Path(path_type=Path),
    default=None,
    help="A Hugging Face config.json (or model dir): write the cutlass_fused_moe part from it.",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Read a plan and list what `warm --engine flashinfer` would run (exit 2 if invalid).",
)
@click.option("--tokens", default="1,16,128,1024", show_default=True, help=_TOKENS_HELP)
@click.option(
    "--finalize",
    type=click.Choice(["fused", "unfused", "both"]),
    default="both",
    show_default=True,
    help="MoE finalize modes to tune (each fills its own namespace).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16"]),
    default=None,
    help="MoE dtype (default: the config's; needed for quantised models).",
)
@click.option("--tp-size", type=click.IntRange(1), default=1, show_default=True)
@click.option("--ep-size", type=click.IntRange(1), default=1, show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the plan here (default: stdout).",
)
def plan_command(
    hf_config: Path | None,
    check_path: Path | None,
    tokens: str,
    finalize: str,
    dtype: str | None,
    tp_size: int,
    ep_size: int,
    output: Path | None,
) -> int:
    """Write a tuning plan from a model's config.json, or check one."""
    from fi_cache.tune import hf_config as hf
    from fi_cache.tune import plan as plans

    ctx = _ctx()
    if (hf_config is None) == (check_path is None):
        raise Refused("give one of --from-hf-config CONFIG or --check PLAN")
    if check_path is not None:
        plan, _text = read_plan(check_path)
        _show_plan(plan, ctx.json)
        return 0
    assert hf_config is not None
    config = hf.load_config(hf_config)
    modes = ("fused", "unfused") if finalize == "both" else (finalize,)
    plan = hf.plan_from_config(
        config, str(hf_config), tokens=_tokens(tokens), dtype=dtype, finalize=modes,
        tp_size=tp_size, ep_size=ep_size,
    )  # fmt: skip
    text = plans.dumps(
        plan,
        [
            f"fi-cache tuning plan for {hf.describe(config)}, from {hf_config}",
            "Run it: fi-cache warm --engine flashinfer --plan THIS_FILE",
            "tokens: the token counts each op runs at; FlashInfer tunes every bucket up to them.",
        ],
    )
    if tp_size * ep_size > 1 and not ctx.quiet:
        from fi_cache.versions import MOE_KEY_HAS_RANKS

        render.warn(
            f"{len(plan.ops)} ops, one per rank: FlashInfer {MOE_KEY_HAS_RANKS.describe()} puts "
            "tp_rank and ep_rank in MoE keys"
        )
    if output is None:
        click.echo(text, nl=False)
        return 0
    from fi_cache import storage

    if output.is_dir():
        raise Refused("is a directory; name the plan file to write", output)
    if not output.parent.is_dir():
        raise Refused("no such directory", output.parent)
    storage.atomic_write(output, text.encode(), lock=False)
    if not ctx.quiet:
        render.warn(f"wrote {output} ({len(plan.ops)} op{'s' if len(plan.ops) > 1 else ''})")
    return 0


def _show_plan(plan: Any, as_json: bool) -> None:
    from fi_cache.tune.plan import op_to_json

    calls = {m: sum(o.n_calls for o in plan.for_mode(m)) for m in plan.modes}
    if as_json:
        render.emit_json(
            {
                "plan": plan.source,
                "modes": list(plan.modes),
                "calls": calls,
                "ops": [op_to_json(o) for o in plan.ops],
            }
        )
        return
    for op in plan.ops:
        extra = f" finalize={','.join(op.finalize)}" if hasattr(op, "finalize") else ""
        backends = f" [{', '.join(op.backends)}]" if hasattr(op, "backends") else ""
        tokens = ",".join(str(t) for t in op.tokens)
        click.echo(f"op {op.index}: {op.label}{backends}{extra} tokens={tokens}")
    for mode, n in calls.items():
        click.echo(f"{mode} namespace: {n} calls")


class _TuneStatus:
    """One live line per call on a terminal ("[tune 3/12] op [backend] 128 tokens", then the
    bucket FlashInfer is profiling); plain lines otherwise, one per finished call, so CI logs show
    where the time went, and a bucket line when a call has been quiet for QUIET_S seconds."""

    QUIET_S = 10.0  # a MoE call tunes every bucket in one call: minutes without a finished call

    def __init__(self, quiet: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet = quiet
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
        return (
            f"[tune {bar}{i}/{n}] {event.get('op')} "
            f"[{event.get('backend')}] {event.get('tokens')} tokens {took}"
        )

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
) -> int:
    """`warm --engine flashinfer --plan PLAN`: everything before tuning is checked first."""
    import os

    from fi_cache import environment
    from fi_cache.store import state_dir
    from fi_cache.tune import warm as tune_warm
    from fi_cache.warm import WarmFailed

    ctx = _ctx()
    plan, text = read_plan(plan_path)
    modes = plan.modes
    if finalize is not None:
        skipped = [o for o in plan.ops if hasattr(o, "finalize") and finalize not in o.finalize]
        if skipped:
            op = skipped[0]
            raise Refused(
                f"op {op.index} ({op.op}) lists finalize {list(op.finalize)}; --finalize "
                f"{finalize} would leave it untuned (add {finalize!r} to its finalize list)",
                plan_path,
            )
        modes = (finalize,)
    env = environment.detect(state_dir(ctx.store), exact=False)
    if problems := tune_warm.static_problems(plan, env):
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Refused(problems[0] + more, plan_path)
    python = python or os.environ.get("FI_CACHE_PYTHON") or sys.executable
    try:
        grace = max(0.0, float(os.environ.get("FI_CACHE_STOP_GRACE", "10")))
    except ValueError:
        raise Refused("FI_CACHE_STOP_GRACE must be a number of seconds") from None
    options = tune_warm.TuneOptions(python, timeout, lock_timeout, grace)
    status = _TuneStatus(ctx.quiet)
    progress = tune_warm.TuneProgress(status.waiting, status.call, status.note)
    from fi_cache.cli.serving import sigterm_as_interrupt

    sigterm_as_interrupt()
    try:
        results = tune_warm.warm_plan(ctx.store, plan, text, env, modes, options, progress)
    except tune_warm.TuneInterrupted as exc:
        for mode, ns_dir in exc.recorded:
            status.note(f"{mode} finalize was tuned and recorded before the interrupt: {ns_dir}")
        if exc.recorded and exc.not_recorded:
            [rest] = exc.not_recorded  # two modes, one recorded
            # --finalize M is refused when an MoE op does not list M; the whole plan again is
            # always right (the recorded mode's calls find their entries cached).
            alone = all(rest in op.finalize for op in plan.ops if hasattr(op, "finalize"))
            how = f"--finalize {rest}" if alone else "the same plan (tuned shapes are cached)"
            status.note(f"{rest} finalize not tuned: run again with {how}")
        raise
    except WarmFailed as exc:
        status.note("tuning failed")
        if exc.lines:
            click.echo(f"--- last {len(exc.lines)} lines of the tuning process ---", err=True)
            for line in exc.lines:
                click.echo(line, err=True)
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
        click.echo(f"  {d['file']}")
    click.echo("load it: flashinfer.autotune(False, cache=FILE) around your engine's warm-up")


COMMANDS = [plan_command]
