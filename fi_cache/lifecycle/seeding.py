"""What a warm does just before the engine starts: seed the file it will read from the
namespace's earlier files for the same model (maintenance/seed.py says why that is safe).

Which files the engine will read comes from the engine (vLLM asks its own code: engines/vllm/
predict.py; SGLang's own key code is run: engines/sglang/keydir.py), asked only when there is
something to seed; the sources are what earlier warms of the same model recorded (as far as the
engine would reuse them: seed_source), less whatever doctor's pre-flight checks flag. Nothing
here may stop a start: any failure is one note, and the engine then tunes as it would have.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fi_cache.engines.api import Run, ServerEngine
from fi_cache.errors import FiCacheError
from fi_cache.lifecycle.report import Report
from fi_cache.store.manifest import Manifest, WarmRecord

# Called under the namespace lock just before the engine starts: the entries it put into each
# file, by path relative to the namespace.
BeforeStart = Callable[[Path, Manifest], dict[str, int]]


def seeder(engine: ServerEngine, run: Run, store: Path, report: Report) -> BeforeStart:
    """The before-start hook of a warm (called under the namespace lock)."""

    def before_start(ns_dir: Path, manifest: Manifest) -> dict[str, int]:
        try:
            return _seed(engine, run, store, ns_dir, manifest, report)
        except (FiCacheError, OSError) as exc:
            report.note(f"not seeding: {exc}")
            return {}

    return before_start


def _seed(
    engine: ServerEngine,
    run: Run,
    store: Path,
    ns_dir: Path,
    manifest: Manifest | None,
    report: Report,
) -> dict[str, int]:
    from fi_cache.lifecycle.checks import namespace_findings
    from fi_cache.maintenance import seed

    def usable(warm: WarmRecord) -> bool:
        return engine.seed_source(run, warm)

    warms = manifest.warms if manifest else ()
    earlier = [w for w in warms if w.engine == engine.name and w.files
               and engine.same_model(run, w.argv)]  # fmt: skip
    if not earlier or run.args.model is None:
        return {}  # nothing to carry: asking the engine is not worth its seconds
    targets, why = engine.seed_targets(run, ns_dir, store)
    if why:
        report.note(why)
        return {}
    findings = namespace_findings(engine, run, ns_dir, manifest)
    flagged = [Path(f.path) for f in findings if f.path and f.severity != "info"]
    seeds, notes = seed.plan(ns_dir, manifest, usable, targets, flagged, engine.name)
    for line in notes:
        report.note(line)
    done: dict[str, int] = {}
    for s in seeds:
        seed.write(s)
        done[str(s.target.relative_to(ns_dir))] = s.entries
        report.note(f"seeded {s.entries} entries from {len(s.sources)} earlier file(s): {s.target}")
    return done
