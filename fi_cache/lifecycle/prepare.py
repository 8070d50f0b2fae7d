"""Before anything starts: the command line read once, the namespace a start will use (resolve),
then what will start on it (bind). Everything that refuses a command line refuses here, before the
engine runs."""

from __future__ import annotations

import os
from pathlib import Path

from fi_cache.engines.api import (
    CommandLine,
    LauncherT,
    Request,
    Run,
    ServedT,
    ServerEngine,
    Target,
)
from fi_cache.errors import Refused
from fi_cache.lifecycle.report import Report


def resolve(
    engine: ServerEngine[ServedT, LauncherT], request: Request, store: Path, report: Report
) -> Target[ServedT, LauncherT]:
    """The engine's namespace for `request`, with what deciding it found said; a finalize mode
    the engine would not run is refused unless --force."""
    line = engine.read(request)  # a bad command line is refused before detection says anything
    _check_model(engine, line)
    target = engine.resolve(request, line, store)
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


def _check_model(engine: ServerEngine[ServedT, LauncherT], line: CommandLine[ServedT]) -> None:
    """A model given as a local path that is not there: the engine would take it for a Hugging
    Face repo id and fail only after loading (vLLM 0.32's CPU build: 12 s)."""
    model = line.args.model or ""
    if model.startswith(("/", "./", "../")) and not os.path.exists(model):
        raise Refused(
            f"no such model directory ({engine.display} would take it for a Hugging Face "
            "repo id and fail after loading)",
            model,
        )


def bind(
    engine: ServerEngine[ServedT, LauncherT],
    target: Target[ServedT, LauncherT],
    store: Path,
    report: Report,
) -> Run[ServedT, LauncherT]:
    """What will start on `target` (Refused where the engine would reject it), then what a user
    may not expect said once."""
    run = engine.bind(target)  # its refusals come before any warning
    if not report.quiet:
        for line in engine.announce(target, target.ns.path(store), os.environ):
            report.warn(line)
    return run
