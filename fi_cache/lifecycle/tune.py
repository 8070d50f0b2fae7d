"""`warm --engine flashinfer --plan PLAN`: FlashInfer's own autotuner on a plan's ops, one
namespace per finalize mode, with no serving engine (the tuning itself is engines/flashinfer/
warm.py's: its namespace is known only once the tuning child reports FlashInfer's metadata).
Everything that can refuse the plan is checked before any tuning starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.errors import Refused
from fi_cache.lifecycle import signals

if TYPE_CHECKING:
    from fi_cache.engines.flashinfer.plan import Plan
    from fi_cache.engines.flashinfer.warm import TuneInterrupted, TuneProgress, TuneResult


def warm_plan(
    store: Path,
    plan_path: Path,
    finalize: str | None,
    python: str | None,
    timeout: float,
    lock_timeout: float,
    progress: TuneProgress,
    repeat: int = 1,
) -> list[TuneResult]:
    """Tune the plan at `plan_path` into each of its modes' namespaces (`finalize`: that mode
    only). Raises Refused, TuneInterrupted (with how to resume), WarmFailed or FiCacheError."""
    from fi_cache import environment
    from fi_cache.engines import get
    from fi_cache.engines.flashinfer import warm as tune_warm
    from fi_cache.store.paths import state_dir

    engine = get("flashinfer")
    read = engine.read_args([str(plan_path)])
    plan, text = read.plan, read.text
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
    env = environment.detect(state_dir(store), exact=False)
    if problems := tune_warm.static_problems(plan, env):
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Refused(problems[0] + more, plan_path)
    python = engine.find_executable(python)
    options = tune_warm.TuneOptions(python, timeout, lock_timeout, signals.stop_grace(), repeat)
    signals.sigterm_as_interrupt()
    try:
        return tune_warm.warm_plan(store, plan, text, env, modes, options, progress)
    except tune_warm.TuneInterrupted as exc:
        exc.hint = resume_hint(plan, exc)
        raise


def resume_hint(plan: Plan, exc: TuneInterrupted) -> str | None:
    """How to tune the mode an interrupt left untuned, when the other one was recorded."""
    if not (exc.recorded and exc.not_recorded):
        return None
    [rest] = exc.not_recorded  # two modes, one recorded
    # --finalize M is refused when an MoE op does not list M; the whole plan again is always
    # right (the recorded mode's calls find their entries cached).
    alone = all(rest in op.finalize for op in plan.ops if hasattr(op, "finalize"))
    how = f"--finalize {rest}" if alone else "the same plan (tuned shapes are cached)"
    return f"{rest} finalize not tuned: run again with {how}"
