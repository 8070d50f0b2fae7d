"""warm --engine flashinfer: tune a plan into this machine's namespaces with FlashInfer itself.

One tuning child per finalize mode (fi_cache/engines/flashinfer/driver.py), so nothing tuned for one
mode can leak into the other through FlashInfer's in-memory cache (0.6.17's MoE keys cannot tell
them apart). The child reports FlashInfer's own `_metadata` first; the namespace is chosen from it
and locked before any tuning starts. FlashInfer writes the file (its own temp file + rename); this
module records the warm, the entries and the MoE tactic counts in the namespace manifest.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fi_cache.caches.discover import classify_file
from fi_cache.caches.inventory import read
from fi_cache.engines.api import WarmFailed
from fi_cache.engines.flashinfer.driver import Job
from fi_cache.engines.flashinfer.engine import ENGINE, plan_key
from fi_cache.engines.flashinfer.launch import TuningChild
from fi_cache.engines.flashinfer.plan import GemmOp, MoeOp, Plan
from fi_cache.environment import Environment, with_flashinfer_metadata
from fi_cache.errors import FiCacheError, Refused
from fi_cache.model import v1
from fi_cache.model.fingerprint import compare_metadata
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store import pin as pins
from fi_cache.store.files import atomic_write, ensure_dir, remove_file, share_like_store
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import FinalizeMode, Namespace, slug
from fi_cache.store.paths import state_dir
from fi_cache.versions import GEMM_BACKEND_CCS, GEMM_CCS_ASKED, MOE_ARCH_MODULES

CACHE_FILE = "autotune_configs.json"
PARTIAL_SUFFIX = ".partial"  # beside the cache: an interrupted tune's save (_keep_partial)


@dataclass
class TuneProgress:
    """How the caller hears about a tuning run (the CLI renders; tests record)."""

    waiting: Callable[[locks.Holder | None], None] = lambda holder: None
    call: Callable[[dict[str, Any]], None] = lambda event: None
    note: Callable[[str], None] = lambda message: None


@dataclass(frozen=True)
class TuneOptions:
    python: str = sys.executable  # the interpreter with FlashInfer (a serving venv's python)
    timeout: float = 7200.0  # one mode: a fresh box compiles the CUTLASS MoE module for ~30 min
    lock_timeout: float = 3600.0
    grace: float = 10.0
    repeat: int = 1  # > 1: every tactic timed this many rounds, the robust winner kept (bench.py)


@dataclass(frozen=True)
class TuneResult:
    mode: FinalizeMode
    namespace_dir: Path
    record: WarmRecord
    counts: dict[str, Any] | None
    flashinfer_version: str
    device: str
    calls: int
    seconds: float  # the tuning calls and FlashInfer's save, not imports or compilation checks
    robust: tuple[int, int] | None = None  # --repeat: (buckets kept at the default, buckets)

    @property
    def cache_path(self) -> Path:
        return self.namespace_dir / self.record.files[0].path


def cache_file(ns_dir: Path) -> Path:
    return ENGINE.cache_dir(ns_dir) / CACHE_FILE


def static_problems(plan: Plan, env: Environment) -> list[str]:
    """What the GPU nvidia-smi shows cannot run, known without FlashInfer (the child asks
    FlashInfer again). Empty when no GPU is listed: the child gives the reason."""
    if not env.gpus:
        return []
    try:
        major, _, minor = env.gpus[0].compute_cap.partition(".")
        cc = int(major) * 10 + int(minor or 0)
    except ValueError:
        return []
    gpu = f"{env.gpus[0].name} (SM{cc})"
    out = []
    for op in plan.ops:
        if isinstance(op, MoeOp):
            if cc not in MOE_ARCH_MODULES:
                out.append(
                    f"op {op.index} ({op.op}): FlashInfer's CUTLASS MoE does not run on {gpu}"
                )
            continue
        assert isinstance(op, GemmOp)
        for backend in op.backends:
            ccs = GEMM_BACKEND_CCS.get((op.op, backend))
            if ccs is not None and cc in GEMM_CCS_ASKED and cc not in ccs:
                runs_on = ", ".join(f"SM{c}" for c in sorted(ccs))
                out.append(
                    f"op {op.index} ({op.op}): the {backend} backend does not run on {gpu} "
                    f"(runs on {runs_on})"
                )
    return out


def warm_plan(
    store: Path,
    plan: Plan,
    plan_text: str,
    env: Environment,
    modes: tuple[FinalizeMode, ...],
    options: TuneOptions = TuneOptions(),
    progress: TuneProgress | None = None,
) -> list[TuneResult]:
    """Tune `plan` into one namespace per mode. Raises Refused, WarmFailed or FiCacheError."""
    progress = progress or TuneProgress()
    attempts: list[tuple[FinalizeMode, Path, float]] = []
    try:
        with _gpu_lock(store, env, options, progress) as gpu_dir:
            _check_first(plan, modes[0], options, progress, gpu_dir)
            results = []
            for mode in modes:
                ops = plan.for_mode(mode)
                progress.note(f"{mode} finalize: {sum(o.n_calls for o in ops)} calls")
                results.append(
                    _one_mode(
                        store, plan, plan_text, env, mode, options, progress, attempts, gpu_dir
                    )
                )
    except KeyboardInterrupt:
        raise TuneInterrupted(_recorded(attempts), modes) from None
    return results


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a plan: `recorded` are the modes whose warm the manifests hold
    (read back from disk, so an interrupt just after a save still counts it)."""

    def __init__(self, recorded: list[tuple[FinalizeMode, Path]], modes: tuple[str, ...]):
        super().__init__()
        self.recorded = recorded
        self.not_recorded = [m for m in modes if m not in {r[0] for r in recorded}]
        self.hint: str | None = None  # how to tune what is left (the lifecycle says)


def _recorded(
    attempts: list[tuple[FinalizeMode, Path, float]],
) -> list[tuple[FinalizeMode, Path]]:
    out = []
    for mode, ns_dir, started in attempts:
        with contextlib.suppress(FiCacheError):
            m = manifests.load(ns_dir)
            if m and any(w.started == started and w.ok for w in m.warms):
                out.append((mode, ns_dir))
    return out


@contextlib.contextmanager
def _gpu_lock(
    store: Path, env: Environment, options: TuneOptions, progress: TuneProgress
) -> Iterator[Path | None]:
    """One tuning at a time on a GPU (for warms sharing this store): a warm measuring kernels
    while another runs on the same GPU would record the other's load. Taken before any namespace
    lock, always in that order. Without a GPU UUID from nvidia-smi there is nothing to key on."""
    uuid = env.gpus[0].uuid if env.gpus else ""
    if not uuid:
        yield None
        return
    gpu_dir = state_dir(store) / "gpus" / slug(uuid)

    def waiting(holder: locks.Holder | None) -> None:
        who = holder.describe() if holder else "another fi-cache process"
        progress.note(f"waiting for the GPU: {who} is tuning on it")

    with locks.namespace_lock(gpu_dir, "tune", options.lock_timeout, waiting):
        yield gpu_dir


def _check_first(
    plan: Plan,
    mode: FinalizeMode,
    options: TuneOptions,
    progress: TuneProgress,
    gpu_dir: Path | None = None,
) -> None:
    """Every op and backend called once, untuned, in a process of its own (driver.py says why):
    a missing library or a failed kernel build is refused here, and JIT builds happen here."""
    with TuningChild(options.python, options.timeout, options.grace, gpu_dir) as child:
        child.send(Job(mode, plan.ops, stage="check").to_json())
        child.close_input()  # it needs nothing more; a child that waits for input ends here
        for _event in child.until("checked", progress.call):
            pass


def _one_mode(
    store: Path,
    plan: Plan,
    plan_text: str,
    env: Environment,
    mode: FinalizeMode,
    options: TuneOptions,
    progress: TuneProgress,
    attempts: list[tuple[FinalizeMode, Path, float]],
    gpu_dir: Path | None = None,
) -> TuneResult:
    job = Job(mode, plan.for_mode(mode), repeat=options.repeat)
    with TuningChild(options.python, options.timeout, options.grace, gpu_dir) as child:
        child.send(job.to_json())
        ready = list(child.until("ready"))[-1]
        fp = with_flashinfer_metadata(env, dict(ready.get("metadata") or {})).fingerprint
        if not fp.flashinfer_version:
            fp = fp.replace(flashinfer_version=str(ready.get("flashinfer_version")))
        ns = Namespace(fp, mode)
        ns_dir = ns.path(store)
        child.disarm()  # waiting for the lock is --lock-timeout's business, not --timeout's
        with (
            locks.namespace_lock(ns_dir, "warm", options.lock_timeout, progress.waiting),
            child.stopped_on_error(),
        ):
            child.arm()
            if pins.pinned(ns_dir) is not None:
                raise pins.refusal(ns_dir, "a warm (FlashInfer saves its tuning there)")
            target = cache_file(ns_dir)
            ensure_dir(target.parent)
            _refuse_foreign(target, fp)
            started = time.time()
            attempts.append((mode, ns_dir, started))
            partial = target.with_name(target.name + PARTIAL_SUFFIX)
            remove_file(partial)  # a killed run's leftover: FlashInfer would merge it
            child.send({"cache": str(target), "partial": str(partial)})
            try:
                events = list(child.until("done", progress.call))
            except KeyboardInterrupt:
                child.stop()  # SIGINT: the child saves what it tuned to `partial`, then exits
                _keep_partial(
                    partial,
                    target,
                    ns,
                    ns_dir,
                    store,
                    started,
                    plan,
                    plan_text,
                    mode,
                    options,
                    progress,
                )
                raise
            done = events[-1]
            counts = _counts(events)
            record = _record(started, plan, plan_text, mode, options, target, ns_dir)
            share_like_store([target], store)
            m = manifests.load(ns_dir) or Manifest.new(ns, started)
            manifests.save(ns_dir, _with_counts(m.with_warm(record), counts))
    return TuneResult(
        mode,
        ns_dir,
        record,
        counts,
        str(ready.get("flashinfer_version")),
        str(ready.get("device")),
        sum(1 for e in events if e["event"] == "called"),
        float(done.get("seconds", 0.0)),
        _robust(events),
    )


def _record(
    started: float,
    plan: Plan,
    plan_text: str,
    mode: FinalizeMode,
    options: TuneOptions,
    target: Path,
    ns_dir: Path,
    ok: bool = True,
) -> WarmRecord:
    return WarmRecord(
        started=started,
        seconds=round(time.time() - started, 3),
        vllm_version=None,
        argv=["--plan", plan.source, *_repeat_args(options.repeat)],
        argv_key=plan_key(plan_text, mode),
        files=[_file_record(target, ns_dir)],
        supports_finalize_env=True,  # the mode went to FlashInfer directly
        ok=ok,
        engine=ENGINE.name,
    )


def _keep_partial(
    partial: Path,
    target: Path,
    ns: Namespace,
    ns_dir: Path,
    store: Path,
    started: float,
    plan: Plan,
    plan_text: str,
    mode: FinalizeMode,
    options: TuneOptions,
    progress: TuneProgress,
) -> None:
    """An interrupted tune: what the child saved beside the cache (FlashInfer's save_configs:
    the file's entries and the buckets tuned so far) becomes the cache, written by the store's
    writer under the namespace lock still held, and the manifest records the warm as not ok (a
    later warm of the plan tunes only what is missing). Nothing saved: nothing changes."""
    try:
        if not partial.is_file():
            return
        try:
            saved = read(classify_file(partial)).file
        except FiCacheError:
            return  # a save cut short by SIGKILL: the cache stays as it was
        if not isinstance(saved, v1.CacheFile) or not saved.entries:
            return
        old = _readable(target)
        entries = {**(old.entries if old is not None else {}), **saved.entries}
        merged = replace(saved, entries=entries)
        atomic_write(target, v1.dumps(merged).encode(), mode=0o644)
        share_like_store([target], store)
        record = _record(started, plan, plan_text, mode, options, target, ns_dir, ok=False)
        m = manifests.load(ns_dir) or Manifest.new(ns, started)
        manifests.save(ns_dir, m.with_warm(record))
        progress.note(
            f"interrupted: kept {len(entries)} entries tuned so far in {target}; "
            "run the same warm again to tune the rest"
        )
    finally:
        remove_file(partial)


def _readable(path: Path) -> v1.CacheFile | None:
    if not path.is_file():
        return None
    try:
        cf = read(classify_file(path)).file
    except FiCacheError:
        return None
    return cf if isinstance(cf, v1.CacheFile) else None


def _robust(events: list[dict[str, Any]]) -> tuple[int, int] | None:
    kept = [bool(e.get("default")) for e in events if e["event"] == "robust"]
    return (sum(kept), len(kept)) if kept else None


def _repeat_args(repeat: int) -> list[str]:
    return ["--repeat", str(repeat)] if repeat > 1 else []


def _refuse_foreign(target: Path, fp: Any) -> None:
    """FlashInfer would refuse to save over a file from another environment; say so first."""
    if not target.is_file():
        return
    try:
        cache = read(classify_file(target))
    except FiCacheError:
        return  # unreadable: FlashInfer overwrites it (it cannot load it either)
    hard = [m for m in compare_metadata(cache.file.metadata, fp) if m.hard]
    if hard:
        what = ", ".join(f"{m.field}: file {m.saved!r} vs here {m.target!r}" for m in hard)
        raise Refused(
            f"this namespace's cache was written elsewhere ({what}); FlashInfer would not save "
            "into it. Check it with `fi-cache doctor`, then move it away",
            target,
        )


def _file_record(target: Path, ns_dir: Path) -> CacheFileRecord:
    """Parse what FlashInfer wrote: a warm that left no readable file failed."""
    if not target.is_file():
        raise WarmFailed("FlashInfer finished but wrote no cache file", [])
    try:
        cache = read(classify_file(target))
    except FiCacheError as exc:
        raise WarmFailed(f"FlashInfer wrote a cache fi-cache cannot read: {exc}", []) from None
    return CacheFileRecord(str(target.relative_to(ns_dir)), len(cache.file.entries), cache.size)


def _counts(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One set of MoE tactic counts for the namespace when every MoE op agrees on it."""
    found = [{"gemm1": e["gemm1"], "gemm2": e["gemm2"]} for e in events if e["event"] == "counts"]
    if not found or any(c != found[0] for c in found):
        return None  # different dtypes: doctor falls back to its general wording
    return found[0]


def _with_counts(m: Manifest, counts: dict[str, Any] | None) -> Manifest:
    if counts is None:
        return m
    return replace(m, unknown={**m.unknown, "tactic_counts": counts})
