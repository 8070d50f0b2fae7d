"""`fi-cache bench CACHE`: re-time a cache's entries on this GPU in a tuning child (bench.py runs
there) and judge each against FlashInfer's default (fi_cache/tuning/); evicting the entries
slower than the default is maintenance/slower.py's. Nothing here imports torch or FlashInfer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fi_cache.caches.discover import classify_file
from fi_cache.caches.inventory import read
from fi_cache.engines.flashinfer.bench import BenchSettings
from fi_cache.engines.flashinfer.driver import Job
from fi_cache.engines.flashinfer.launch import TuningChild
from fi_cache.engines.flashinfer.plan import Plan
from fi_cache.engines.flashinfer.warm import TuneOptions, TuneProgress, _gpu_lock
from fi_cache.environment import Environment, with_flashinfer_metadata
from fi_cache.errors import Refused
from fi_cache.model import v1
from fi_cache.model.fingerprint import compare_metadata
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import FinalizeMode, namespace_parts
from fi_cache.tuning.report import EntryResult, assemble
from fi_cache.tuning.verdict import NOISE


@dataclass(frozen=True)
class BenchOptions:
    tune: TuneOptions  # the child: python, timeout, grace, the GPU lock's timeout
    rounds: int = 5
    budget_ms: float = 2000.0
    alternatives: int = 3
    noise: float = NOISE


@dataclass(frozen=True)
class BenchRun:
    cache: Path
    plan: str
    mode: str
    device: str
    flashinfer_version: str
    results: list[EntryResult]
    notes: list[str] = field(default_factory=list)  # ops and calls that could not run here
    seconds: float = 0.0


def read_cache(path: Path) -> v1.CacheFile:
    """The v1 file at `path` (bench judges v1 files: FlashInfer's `autotune(cache=FILE)`)."""
    cache = read(classify_file(path))
    if not isinstance(cache.file, v1.CacheFile):
        raise Refused("not a v1 autotune cache file (bench re-times v1 files)", path)
    return cache.file


def recorded_plan(cache_path: Path, store: Path) -> tuple[Path | None, str | None]:
    """The plan of the `warm --engine flashinfer` that wrote a namespace's file, and the
    namespace's finalize mode (None outside the store)."""
    parts = namespace_parts(cache_path, store)
    if parts is None:
        return None, None
    m = manifests.load(Path(parts["dir"]))
    plans = [
        w.argv[1]
        for w in (m.warms if m else [])
        if w.engine == "flashinfer" and len(w.argv) >= 2 and w.argv[0] == "--plan"
    ]
    return (Path(plans[-1]) if plans else None), parts["finalize"]


def selected(cf: v1.CacheFile, ops: Sequence[str]) -> dict[str, Any]:
    """The entries to time: every one, or those whose op contains one of `ops` (as evict --op)."""
    out: dict[str, Any] = {}
    for raw, key, value in v1.iter_entries(cf):
        if not ops or (key is not None and any(o in key.op for o in ops)):
            out[raw] = value
    return out


def run_bench(
    store: Path,
    cache_path: Path,
    plan: Plan,
    mode: FinalizeMode,
    ops: Sequence[str],
    env: Environment,
    options: BenchOptions,
    progress: TuneProgress,
) -> BenchRun:
    """Time the entries in a tuning child; per entry a result (timed or why not)."""
    cf = read_cache(cache_path)
    entries = selected(cf, ops)
    if not entries:
        raise Refused(f"no entry of op {' / '.join(ops)} here" if ops else "no entries", cache_path)
    settings = BenchSettings(entries, options.rounds, options.budget_ms, options.alternatives)
    job = Job(mode, plan.for_mode(mode), stage="bench", bench=settings.to_json())
    t = options.tune
    started = time.monotonic()
    with (
        _gpu_lock(store, env, t, progress) as gpu_dir,
        TuningChild(t.python, t.timeout, t.grace, gpu_dir) as child,
    ):
        child.send(job.to_json())
        before = list(child.until("ready"))
        ready = before[-1]
        notes = _notes(before)
        fp = with_flashinfer_metadata(env, dict(ready.get("metadata") or {})).fingerprint
        hard = [m for m in compare_metadata(cf.metadata, fp) if m.hard]
        about = (str(ready.get("device")), str(ready.get("flashinfer_version")))
        if hard:
            child.send({"stop": True})
            what = ", ".join(f"{m.field}: file {m.saved!r} vs here {m.target!r}" for m in hard)
            why = f"written for another environment ({what}); FlashInfer ignores it here"
            return BenchRun(
                cache_path, plan.source, mode, *about, assemble(entries, [], not_reached=why), notes
            )
        child.send({"bench": True})
        events = list(child.until("done", progress.call))
    results = assemble(entries, events, options.noise)
    return BenchRun(
        cache_path,
        plan.source,
        mode,
        *about,
        results,
        notes + _notes(events),
        round(time.monotonic() - started, 1),
    )


def _notes(events: Sequence[dict[str, object]]) -> list[str]:
    out = []
    for e in events:
        if e["event"] == "op_skipped":
            out.append(f"{e['op']}: skipped: {e['why']}")
        elif e["event"] == "call_failed":
            out.append(f"{e['op']} at {e['tokens']} tokens failed: {e['message']}")
    return out
