"""warm --engine flashinfer: tune a plan into this machine's namespaces with FlashInfer itself.

One tuning child per finalize mode (fi_cache/tune/driver.py), so nothing tuned for one mode can
leak into the other through FlashInfer's in-memory cache (0.6.17's MoE keys cannot tell them
apart). The child reports FlashInfer's own `_metadata` first; the namespace is chosen from it and
locked before any tuning starts. FlashInfer writes the file (its own temp file + rename); this
module records the warm, the entries and the MoE tactic counts in the namespace manifest.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import fi_cache
from fi_cache import manifest as manifests
from fi_cache import storage
from fi_cache.discover import classify_file
from fi_cache.environment import Environment, with_flashinfer_metadata
from fi_cache.errors import FiCacheError, Refused
from fi_cache.inventory import read
from fi_cache.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.model.fingerprint import compare_metadata
from fi_cache.namespace import FinalizeMode, Namespace, slug
from fi_cache.store import state_dir
from fi_cache.tune.driver import Job
from fi_cache.tune.plan import GemmOp, MoeOp, Plan
from fi_cache.versions import GEMM_BACKEND_CCS, GEMM_CCS_ASKED, MOE_ARCH_MODULES
from fi_cache.warm import WarmFailed

ENGINE = "flashinfer"
CACHE_SUBDIR = "flashinfer"  # inside a namespace: files FlashInfer wrote for `autotune(cache=)`
CACHE_FILE = "autotune_configs.json"
_REFUSALS = {"no-gpu", "unsupported", "flashinfer", "job", "stopped"}
_TAIL = 30  # lines of the child's stderr kept for a failure report


@dataclass
class TuneProgress:
    """How the caller hears about a tuning run (the CLI renders; tests record)."""

    waiting: Callable[[storage.Holder | None], None] = lambda holder: None
    call: Callable[[dict[str, Any]], None] = lambda event: None
    note: Callable[[str], None] = lambda message: None


@dataclass(frozen=True)
class TuneOptions:
    python: str = sys.executable  # the interpreter with FlashInfer (a serving venv's python)
    timeout: float = 7200.0  # one mode: a fresh box compiles the CUTLASS MoE module for ~30 min
    lock_timeout: float = 3600.0
    grace: float = 10.0


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

    @property
    def cache_path(self) -> Path:
        return self.namespace_dir / self.record.files[0].path


def cache_file(ns_dir: Path) -> Path:
    return ns_dir / CACHE_SUBDIR / CACHE_FILE


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


def plan_key(plan_text: str, mode: str) -> str:
    """What makes two flashinfer-engine warms "the same" (like vLLM's argv key)."""
    return "flashinfer:" + hashlib.sha256(f"{mode}\0{plan_text}".encode()).hexdigest()[:16]


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
        with _gpu_lock(store, env, options, progress):
            _check_first(plan, modes[0], options, progress)
            results = []
            for mode in modes:
                ops = plan.for_mode(mode)
                progress.note(f"{mode} finalize: {sum(o.n_calls for o in ops)} calls")
                results.append(
                    _one_mode(store, plan, plan_text, env, mode, options, progress, attempts)
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


def _recorded(
    attempts: list[tuple[FinalizeMode, Path, float]],
) -> list[tuple[FinalizeMode, Path]]:
    out = []
    for mode, ns_dir, started in attempts:
        with contextlib.suppress(FiCacheError):
            m = manifests.load(ns_dir)
            if m and any(w.started == started for w in m.warms):
                out.append((mode, ns_dir))
    return out


@contextlib.contextmanager
def _gpu_lock(
    store: Path, env: Environment, options: TuneOptions, progress: TuneProgress
) -> Iterator[None]:
    """One tuning at a time on a GPU (for warms sharing this store): a warm measuring kernels
    while another runs on the same GPU would record the other's load. Taken before any namespace
    lock, always in that order. Without a GPU UUID from nvidia-smi there is nothing to key on."""
    uuid = env.gpus[0].uuid if env.gpus else ""
    if not uuid:
        yield
        return
    gpu_dir = state_dir(store) / "gpus" / slug(uuid)

    def waiting(holder: storage.Holder | None) -> None:
        who = holder.describe() if holder else "another fi-cache process"
        progress.note(f"waiting for the GPU: {who} is tuning on it")

    with storage.namespace_lock(gpu_dir, "tune", options.lock_timeout, waiting):
        yield


def _check_first(
    plan: Plan, mode: FinalizeMode, options: TuneOptions, progress: TuneProgress
) -> None:
    """Every op and backend called once, untuned, in a process of its own (driver.py says why):
    a missing library or a failed kernel build is refused here, and JIT builds happen here."""
    with _Child(options) as child:
        child.send(Job(mode, plan.ops, stage="check").to_json())
        child.close_input()  # it needs nothing more; a child that waits for input ends here
        for _event in child.until("checked", progress):
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
) -> TuneResult:
    job = Job(mode, plan.for_mode(mode))
    with _Child(options) as child:
        child.send(job.to_json())
        ready = list(child.until("ready"))[-1]
        fp = with_flashinfer_metadata(env, dict(ready.get("metadata") or {})).fingerprint
        if not fp.flashinfer_version:
            fp = fp.replace(flashinfer_version=str(ready.get("flashinfer_version")))
        ns = Namespace(fp, mode)
        ns_dir = ns.path(store)
        child.disarm()  # waiting for the lock is --lock-timeout's business, not --timeout's
        with storage.namespace_lock(ns_dir, "warm", options.lock_timeout, progress.waiting), \
                child.stopped_on_error():  # fmt: skip
            child.arm()
            target = cache_file(ns_dir)
            storage.ensure_dir(target.parent)
            _refuse_foreign(target, fp)
            started = time.time()
            attempts.append((mode, ns_dir, started))
            child.send({"cache": str(target)})
            events = list(child.until("done", progress))
            done = events[-1]
            counts = _counts(events)
            record = WarmRecord(
                started=started,
                seconds=round(time.time() - started, 3),
                vllm_version=None,
                argv=["--plan", plan.source],
                argv_key=plan_key(plan_text, mode),
                files=[_file_record(target, ns_dir)],
                supports_finalize_env=True,  # the mode went to FlashInfer directly
                engine=ENGINE,
            )
            storage.share_like_store([target], store)
            m = manifests.load(ns_dir) or Manifest.new(ns, started)
            manifests.save(ns_dir, _with_counts(m.with_warm(record), counts))
    return TuneResult(
        mode, ns_dir, record, counts, str(ready.get("flashinfer_version")),
        str(ready.get("device")), sum(1 for e in events if e["event"] == "called"),
        float(done.get("seconds", 0.0)),
    )  # fmt: skip


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


class _Child:
    """The tuning child: `python -m fi_cache.tune`, in its own session so Ctrl-C here stops it
    (and whatever it started) cleanly; JSON lines both ways."""

    def __init__(self, options: TuneOptions) -> None:
        self.options = options
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> _Child:
        env = dict(os.environ)
        # The child imports fi_cache from where this one lives, even in another interpreter.
        here = str(Path(fi_cache.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [self.options.python, "-m", "fi_cache.tune"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",  # a native library's bytes must not kill the reader
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise Refused(f"cannot run {exc.strerror}", self.options.python) from None
        self.reader = threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)
        self.reader.start()
        self.expired = False
        self.watchdog: threading.Timer | None = None
        self.arm()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()
        self.stop()

    def arm(self) -> None:
        """(Re)start the watchdog: a timer, not a check between lines, since a child stuck in a
        kernel prints nothing."""
        self.disarm()
        self.watchdog = threading.Timer(self.options.timeout, self._expire)
        self.watchdog.daemon = True
        self.watchdog.start()

    def disarm(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()

    @contextlib.contextmanager
    def stopped_on_error(self) -> Iterator[None]:
        """Stop the child before leaving the lock's scope when anything goes wrong."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def _expire(self) -> None:
        self.expired = True
        self.stop()  # its stdout closes, so the reader sees the end and reports the timeout

    def _drain(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            self.tail.append(line.rstrip("\n"))

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it died or was stopped; its exit status and the events tell why

    def _read(self) -> Iterator[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.tail.append(line.rstrip("\n"))
                continue
            if isinstance(event, dict) and "event" in event:
                yield event

    def close_input(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def until(self, name: str, progress: TuneProgress | None = None) -> Iterator[dict[str, Any]]:
        """Events up to and including the one called `name` (probe, call and bucket events also
        go to `progress`); raises on `error` or death."""
        for event in self._read():
            self._fail_on(event)
            if progress is not None and event["event"] in ("probe", "call", "bucket", "called"):
                progress.call(event)
            yield event
            if event["event"] == name:
                return
        self._died()

    def _fail_on(self, event: dict[str, Any]) -> None:
        if event["event"] != "error":
            return
        message = str(event.get("message", "the tuning process failed"))
        if event.get("kind") in _REFUSALS:
            raise Refused(message)
        self._settle()
        raise WarmFailed(message, list(self.tail))

    def _settle(self) -> None:
        """Let the child exit and its stderr be read to the end: the report shows its last words."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)
        self.reader.join(5.0)

    def _died(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        self.reader.join(5.0)
        if self.expired:
            raise WarmFailed(
                f"tuning took over {self.options.timeout:.0f}s (--timeout); stopped it",
                list(self.tail),
            )
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise WarmFailed(f"the tuning process {how} without a result", list(self.tail))

    def stop(self) -> None:
        """Close its stdin (a child waiting for a cache path exits); then SIGINT, SIGTERM and
        SIGKILL to its process group, `grace` seconds apart."""
        proc = self.proc
        if proc is None:
            return
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for sig in (None, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
            try:
                proc.wait(2.0 if sig is None else self.options.grace)
                return
            except subprocess.TimeoutExpired:
                continue
