"""What a warm does around the engine's start: seed the files it will read from the namespace's
earlier files for the same model (maintenance/seed.py says why that is safe).

Which files the engine will read comes from the engine (vLLM asks its own code: engines/vllm/
predict.py; SGLang's own key code is run: engines/sglang/keydir.py), asked only when there is
something to seed; the sources are what earlier warms of the same model recorded (as far as the
engine would reuse them: seed_source), less whatever doctor's pre-flight checks flag.

When the engine knows the answer at once, the seeds are written before it starts. When the
answer takes seconds (vLLM's child imports vLLM: ~25 s on the H200's host, as long as the tuning
it saves on a small model), it is asked while the engine starts: the engine reads its file only
at its kernel warm-up, after its own imports and model load (~40 s there), and a seed is placed
only where the engine has written nothing yet. Either way the engine's own rules decide
(vLLM 0.32+'s ranks load their files only when every rank has one), and afterwards `settle`
says whether each seed was read or the engine got there first and tuned its own.

Nothing here may stop a start: any failure is one note, and the engine then tunes as it would
have.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fi_cache.caches import daemon
from fi_cache.engines.api import Run, ServerEngine
from fi_cache.errors import FiCacheError
from fi_cache.lifecycle.report import Report
from fi_cache.maintenance import seed
from fi_cache.store.files import Stamp
from fi_cache.store.manifest import Manifest, WarmRecord
from fi_cache.store.paths import Unconfined, within


@dataclass(frozen=True)
class Placed:
    seed: seed.Seed
    rel: str  # the target, relative to the namespace
    stamp: Stamp | None  # as written (None: unknown)
    late: bool  # placed while the engine ran: it may have looked before


Say = Callable[[str], None]
Work = Callable[[threading.Event, Say, float], list[Placed]]


class Seeding:
    """One start's seeds: written before it (`placed`), or still being worked out in a thread
    started with the engine (`work`), whose notes reach the report on the warm's own thread."""

    def __init__(
        self, placed: list[Placed] | None = None, work: Work | None = None, who: str = "the engine"
    ) -> None:
        self._placed = list(placed or [])
        self._work, self._who = work, who
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._notes: list[str] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """The engine has just been launched: work out its files meanwhile."""
        if self._work is None or self._thread is not None:
            return
        work, since = self._work, time.time()

        def run() -> None:
            try:
                self._placed += work(self._stop, self._say, since)
            except (FiCacheError, OSError) as exc:
                self._say(f"not seeding: {self._who} {self._late(exc)}")
            except Exception as exc:  # a thread's traceback would reach the user's terminal
                self._say(f"not seeding: {type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=run, name="fi-cache-seed", daemon=True)
        self._thread.start()

    def _late(self, exc: FiCacheError | OSError) -> str:
        if self._stop.is_set():
            return "was healthy before fi-cache knew which file it reads (it tuned without one)"
        return f"is starting without a seed: {exc}"

    def _say(self, message: str) -> None:
        with self._lock:
            self._notes.append(message)

    def flush(self, report: Report) -> None:
        with self._lock:
            notes, self._notes = self._notes, []
        for line in notes:
            report.note(line)

    def ticking(self, report: Report) -> Report:
        """`report`, its progress ticks also passing on the seeding thread's notes."""

        def tick(elapsed: float, line: str) -> None:
            self.flush(report)
            report.tick(elapsed, line)

        return replace(report, tick=tick)

    def cancel(self) -> None:
        """The start failed or was stopped: no seed placed from now on, no child left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def settle(self, report: Report, named: set[str] | None = None) -> dict[str, int]:
        """Once the engine is healthy: the entries each file was seeded with, by path relative
        to the namespace, leaving out a seed the engine replaced with its own tuning, and
        removing one it never read (`named`: the files its log says it used, when it says:
        a hash dir its GPU worker resolved otherwise than vLLM's own code predicted)."""
        if self._thread is not None:
            self._stop.set()  # still asking: too late for this start
            self._thread.join()
        self.flush(report)
        used_dirs = {Path(n).resolve().parent for n in named or ()}
        out: dict[str, int] = {}
        for p in self._placed:
            if used_dirs and p.seed.target.resolve().parent not in used_dirs:
                report.note(self._unused(p, sorted(named or ())))
                continue
            if p.late and p.stamp is not None and not seed.kept(p.seed, p.stamp):
                report.note(
                    f"{self._who} tuned {p.seed.target} itself: it looked for the file before "
                    "the seed landed, then saved its own (not counted as seeded)"
                )
                continue
            out[p.rel] = p.seed.entries
        return out

    def _unused(self, p: Placed, named: list[str]) -> str:
        removed = p.stamp is not None and seed.remove_unread(p.seed, p.stamp)
        return (
            f"{self._who} used {named[0]}, not the seeded {p.seed.target} (its worker resolved "
            "the file otherwise than predicted; `fi-cache doctor -- ARGS` names what it can't know)"
            + (": the unread seed is removed" if removed else "")
        )


def seeder(
    engine: ServerEngine[Any, Any], run: Run[Any, Any], store: Path, report: Report
) -> Callable[[Path, Manifest], Seeding]:
    """The before-start hook of a warm (called under the namespace lock, which the warm holds
    until the engine has stopped: the seeding thread writes under it too)."""

    def before_start(ns_dir: Path, manifest: Manifest) -> Seeding:
        warms = manifest.warms if manifest else ()
        earlier = [
            w
            for w in warms
            if w.engine == engine.name and w.files and engine.same_model(run, w.argv)
        ]
        if not earlier or run.args.model is None:
            return Seeding()  # nothing to carry: asking the engine is not worth its seconds
        try:
            known = engine.seed_targets_known(run, ns_dir, store)
            if known is not None:
                placed = _place(engine, run, ns_dir, manifest, known, report.note)
                return Seeding(placed, who=engine.display)
        except (FiCacheError, OSError) as exc:
            report.note(f"not seeding: {exc}")
            return Seeding()

        def work(stop: threading.Event, say: Say, since: float) -> list[Placed]:
            answer = engine.seed_targets(run, ns_dir, store, stop)
            return _place(engine, run, ns_dir, manifest, answer, say, (stop, since))

        return Seeding(work=work, who=engine.display)

    return before_start


def _place(
    engine: ServerEngine[Any, Any],
    run: Run[Any, Any],
    ns_dir: Path,
    manifest: Manifest | None,
    answer: tuple[list[Path], str | None],
    say: Say,
    running: tuple[threading.Event, float] | None = None,
) -> list[Placed]:
    """Plan and write the seeds for `answer`'s targets; `running`: the engine is starting
    (its stop event and launch time, time.time()), so a seed goes only where it has written
    nothing."""
    from fi_cache.lifecycle.checks import namespace_findings

    targets, why = answer
    if why:
        say(why)
        return []
    if outside := [t for t in targets if not _inside(ns_dir, t)]:  # a planted saved answer
        say(f"not seeding {outside[0]}: not inside the namespace {ns_dir} (nothing written there)")
        targets = [t for t in targets if t not in outside]
    if (busy := _daemon_on(targets)) is not None:
        say(f"not seeding: {busy.describe()} (its tuning and D2D seeding write these files)")
        return []

    def usable(warm: WarmRecord) -> bool:
        return engine.seed_source(run, warm)

    findings = namespace_findings(engine, run, ns_dir, manifest)
    flagged = [Path(f.path) for f in findings if f.path and f.severity != "info"]
    seeds, notes = seed.plan(ns_dir, manifest, usable, targets, flagged, engine.name)
    for line in notes:
        say(line)
    if seeds and (gap := engine.seed_gap(run, [(s.target, s.file) for s in seeds])):
        say(gap)  # the engine would take them as complete and tune nothing they lack
        return []
    if running is not None:
        for t in targets:  # plan leaves out what exists: the engine's own save, if it is new
            with contextlib.suppress(OSError):
                if t.stat().st_mtime >= running[1]:
                    say(_first(t, engine, running))
    placed: list[Placed] = []
    for s in seeds:
        stamp, when = None, ""
        if running is not None:
            if running[0].is_set():
                break
            stamp = seed.create(s)
            if stamp is None:
                say(_first(s.target, engine, running))
                continue
            when = f" ({_after(engine, running)})"
        else:
            stamp = seed.write(s)
        say(f"seeded {s.entries} entries from {len(s.sources)} earlier file(s): {s.target}{when}")
        placed.append(Placed(s, str(s.target.relative_to(ns_dir)), stamp, running is not None))
    return placed


def _daemon_on(targets: list[Path]) -> daemon.Daemon | None:
    """A running `vllm preload` writing a target's dir: fi-cache leaves its files to it."""
    found = daemon.running() if targets else []
    return next((d for t in targets if (d := daemon.writing(t.parent, found))), None)


def _inside(ns_dir: Path, target: Path) -> bool:
    try:
        within(ns_dir, target)
    except Unconfined:
        return False
    return True


def _after(engine: ServerEngine[Any, Any], running: tuple[threading.Event, float]) -> str:
    return f"{time.time() - running[1]:.1f}s after {engine.display} started"


def _first(
    target: Path, engine: ServerEngine[Any, Any], running: tuple[threading.Event, float]
) -> str:
    return f"not seeding {target}: {engine.display} wrote it first ({_after(engine, running)})"
