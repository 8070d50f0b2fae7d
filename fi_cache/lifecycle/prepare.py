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


def bind(engine: ServerEngine, target: Target, store: Path, report: Report) -> Run:
    """What a user may not expect is said once, then the engine's arguments and launcher are
    read (Refused where the engine would reject them)."""
    if not report.quiet:
        for line in engine.announce(target, target.ns.path(store), os.environ):
            report.warn(line)
    return engine.bind(target)
