"""Before anything starts: the namespace a start will use (resolve), then what will start on it
(bind). Everything that refuses a command line refuses here, before the engine runs."""

from __future__ import annotations

import os
from pathlib import Path

from fi_cache.engines.api import Request, Run, ServerEngine, Target
from fi_cache.errors import Refused
from fi_cache.lifecycle.report import Report


def resolve(engine: ServerEngine, request: Request, store: Path, report: Report) -> Target:
    """The engine's namespace for `request`, with what deciding it found said; a finalize mode
    the engine would not run is refused unless --force."""
    _check_args(engine, request)  # a bad command line is refused before detection says anything
    target = engine.resolve(request, store)
    for note in target.notes:
        report.warn(note)
    problem = engine.mode_problem(target, "tune" if request.warm else "serve")
    if problem is not None and problem.refusal:
        if not request.force:
            raise Refused(problem.refusal + " (--force to go on anyway)")
        report.warn(problem.refusal + " (going on: --force)")
    if problem is not None and problem.warning:
        report.warn(problem.warning)
    return target


def _check_args(engine: ServerEngine, request: Request) -> None:
    """The engine's arguments as bind will read them, and a model given as a local path that is
    not there: the engine would take it for a Hugging Face repo id and fail only after loading
    (vLLM 0.32's CPU build: 12 s)."""
    _, argv = engine.command_line(request.path, request.argv)
    model = str(getattr(engine.read_args(argv), "model", None) or "")
    if model.startswith(("/", "./", "../")) and not os.path.exists(model):
        raise Refused(
            f"no such model directory ({engine.display} would take it for a Hugging Face "
            "repo id and fail after loading)",
            model,
        )


def bind(engine: ServerEngine, target: Target, store: Path, report: Report) -> Run:
    """The engine's arguments and launcher read (Refused where the engine would reject them),
    then what a user may not expect said once."""
    run = engine.bind(target)  # its refusals come before any warning
    if not report.quiet:
        for line in engine.announce(target, target.ns.path(store), os.environ):
            report.warn(line)
    return run
