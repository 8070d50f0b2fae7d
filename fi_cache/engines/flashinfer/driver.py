"""The tuning child: import FlashInfer, check every op against this GPU, then run the plan under
`flashinfer.autotune(True, cache=FILE)` so FlashInfer's own autotuner writes FILE.

Protocol (JSON lines): first a `stage: "check"` child makes the untuned first call of every op
and backend (reporting `probe` events, then `checked`) and exits. Then, per finalize mode, a tuning
child: the parent sends the job; the child imports FlashInfer, checks the GPU and every op, and
answers `ready` with FlashInfer's own `_metadata`; the parent picks the namespace
from it, takes its lock and sends `{"cache": PATH}` (or `{"stop": true}`); the child tunes and
reports `call`/`bucket`/`called`/`counts`/`done`, or `error`. FlashInfer's logs and tqdm bars
go to stderr.
Refusals (no GPU, an op this GPU or FlashInfer cannot run, inputs that do not fit) come before
the first tuning call and exit 2; a failure while tuning exits 1.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fi_cache.engines.flashinfer.plan import MoeOp, Op, op_from_json, op_to_json

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
EXIT_INTERRUPTED = 130
MEMORY_HEADROOM = 0.8  # leave a fifth of free memory to FlashInfer's workspaces and cuBLAS

Emit = Callable[[dict[str, Any]], None]


Receive = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Job:
    mode: str  # finalize mode of the namespace: MoE ops tune with this mode
    ops: tuple[Op, ...]
    tune: bool = True  # False: replay (autotune(False, cache=...)) and count cache hits
    device: str = "cuda"
    # "check": the untuned first call of every op and backend, then `checked` and exit. It runs in
    # a process of its own because FlashInfer <= 0.7.3 keys GEMMs by the size of a workspace that
    # the first cuDNN call grows: tuning must start from the sizes a fresh engine starts with.
    stage: str = "tune"
    repeat: int = 1  # tune: > 1 keeps each bucket's robust winner over that many rounds (bench.py)
    bench: dict[str, Any] | None = None  # stage "bench": bench.BenchSettings as JSON

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        ops = tuple(op_from_json(o) for o in data["ops"])
        bench = data.get("bench")
        return cls(
            str(data["mode"]),
            ops,
            bool(data.get("tune", True)),
            str(data.get("device", "cuda")),
            str(data.get("stage", "tune")),
            int(data.get("repeat", 1)),
            dict(bench) if bench else None,
        )

    def to_json(self) -> dict[str, Any]:
        ops = [op_to_json(o) for o in self.ops]
        out = {
            "mode": self.mode,
            "ops": ops,
            "tune": self.tune,
            "device": self.device,
            "stage": self.stage,
            "repeat": self.repeat,
        }
        if self.bench is not None:
            out["bench"] = self.bench
        return out


class _OpClock:
    """`op_done` (op k of N, its calls, its seconds) as the calls move to the next op."""

    def __init__(self, ops: tuple[Op, ...], emit: Emit) -> None:
        self.order = {id(op): k for k, op in enumerate(ops, 1)}
        self.total, self.emit = len(ops), emit
        self.op: Op | None = None
        self.position, self.calls, self.started = 0, 0, 0.0

    def starts(self, op: Op) -> None:
        if op is not self.op:
            self.finish()
            self.op, self.position = op, self.order.get(id(op), 0)
            self.calls, self.started = 0, time.perf_counter()
        self.calls += 1

    def finish(self) -> None:
        if self.op is not None:
            self.emit(
                {
                    "event": "op_done",
                    "op_i": self.position,
                    "ops": self.total,
                    "op": self.op.label,
                    "calls": self.calls,
                    "seconds": round(time.perf_counter() - self.started, 3),
                }
            )
        self.op = None


class Stop(Exception):
    def __init__(self, kind: str, message: str, code: int) -> None:
        super().__init__(message)
        self.kind, self.message, self.code = kind, message, code


@dataclass
class _Lookups:
    """Cache hits and misses while replaying (FlashInfer keeps no such count itself)."""

    hits: int = 0
    misses: list[str] = field(default_factory=list)


def run(job: Job, emit: Emit, receive: Receive, adapters: dict[str, Any] | None = None) -> int:
    """Run `job`; every outcome is an event. Returns the exit code."""
    try:
        _run(job, emit, receive, adapters)
    except Stop as stop:
        emit({"event": "error", "kind": stop.kind, "message": stop.message})
        return stop.code
    except KeyboardInterrupt:  # the parent stops us (SIGINT, then SIGTERM): no traceback
        return EXIT_INTERRUPTED
    return EXIT_OK


def _run(job: Job, emit: Emit, receive: Receive, adapters: dict[str, Any] | None) -> None:
    try:
        import torch

        from fi_cache.engines.flashinfer import ops as ops_mod

        version = ops_mod.flashinfer_version()
    except ImportError as exc:
        raise Stop("flashinfer", f"cannot import FlashInfer here: {exc}", EXIT_REFUSED) from None
    adapters = adapters if adapters is not None else dict(ops_mod.ADAPTERS)
    device = torch.device(job.device)
    cc, name = _device(torch, device)
    if job.stage == "bench":
        job = _runnable(job, adapters, cc, device, emit)
    _check(job, adapters, cc, torch, device)
    from flashinfer.autotuner import autotuner as fi_autotuner

    metadata = fi_autotuner._collect_metadata()  # what FlashInfer stamps into the file
    about = {"flashinfer_version": version, "device": name, "cc": cc, "metadata": metadata}
    if job.stage == "check":
        _probe(job, adapters, device, torch, emit)
        emit({"event": "checked", **about})
        return
    emit({"event": "ready", **about})
    answer = receive()
    if job.stage == "bench" and answer.get("bench"):
        _bench(job, adapters, device, torch, emit)
        return
    if "cache" not in answer:
        raise Stop("stopped", "the parent stopped the run before tuning", EXIT_REFUSED)
    cache = str(answer["cache"])
    partial = str(answer["partial"]) if answer.get("partial") else None
    if partial:
        _sigterm_as_interrupt()

    import flashinfer

    n = sum(op.n_calls for op in job.ops)
    lookups = _count_lookups() if not job.tune else None
    current = {"i": 0}
    if job.tune:
        _report_buckets(emit, lambda: current["i"])
    if job.tune and job.repeat > 1:
        from flashinfer.autotuner import AutoTuner

        from fi_cache.engines.flashinfer.bench import install_repeat

        install_repeat(AutoTuner.get(), job.repeat, emit)
    parent = os.getppid()
    started = time.perf_counter()
    with flashinfer.autotune(job.tune, cache=cache):
        try:
            ops = _OpClock(job.ops, emit)
            for i, call in enumerate(_calls(job, adapters, device), 1):
                current["i"] = i
                ops.starts(call.op)
                emit(_call_event(i, n, call.op.label, call, ops.position, len(job.ops)))
                t0 = time.perf_counter()
                try:
                    _run_synced(call, torch, device)
                except Exception as exc:  # a kernel or FlashInfer failure: name the call
                    what = f"{call.label} at {call.tokens} tokens: {_first_line(exc)}"
                    raise Stop("failed", what, EXIT_FAILED) from None
                emit({"event": "called", "i": i, "seconds": round(time.perf_counter() - t0, 4)})
                if os.getppid() != parent:  # fi-cache was killed: nobody holds the lock now
                    raise Stop("orphaned", "fi-cache went away; stopping", EXIT_FAILED)
            ops.finish()
        except KeyboardInterrupt:
            if partial:
                _save_partial(partial, emit)
            _discard_unsaved()
            raise
        except BaseException:
            _discard_unsaved()
            raise
        calls_done = time.perf_counter()
    finished = time.perf_counter()  # leaving autotune() saved the file (tune mode)
    for op in job.ops:
        counts = adapters[op.op].tactic_counts(op, cc) if isinstance(op, MoeOp) else None
        if counts:
            emit({"event": "counts", "index": op.index, "op": op.label, **counts})
    done: dict[str, Any] = {
        "event": "done",
        "seconds": round(finished - started, 3),
        "save_seconds": round(finished - calls_done, 3),
    }
    if lookups is not None:
        done.update(hits=lookups.hits, misses=lookups.misses)
    emit(done)


def _runnable(job: Job, adapters: dict[str, Any], cc: int, device: Any, emit: Emit) -> Job:
    """bench: an op this GPU or FlashInfer cannot run is one `op_skipped` line, not a refusal."""
    keep = []
    for op in job.ops:
        adapter = adapters.get(op.op)
        why = [f"op {op.index}: no tuner for {op.op!r}"] if adapter is None else []
        if adapter is not None and device.type == "cuda":
            why = adapter.problems(op, cc)
        if why:
            emit({"event": "op_skipped", "op": op.label, "why": "; ".join(why)})
        else:
            keep.append(op)
    return Job(job.mode, tuple(keep), job.tune, job.device, job.stage, job.repeat, job.bench)


def _bench(job: Job, adapters: dict[str, Any], device: Any, torch: Any, emit: Emit) -> None:
    """Time the cached entries the plan's calls reach (bench.py); a call that fails is one
    `call_failed` line and the run goes on."""
    from flashinfer.autotuner import AutoTuner

    from fi_cache.engines.flashinfer.bench import BenchSettings, install_bench

    install_bench(AutoTuner.get(), BenchSettings.from_json(job.bench or {}), emit)
    started = time.perf_counter()
    n = sum(op.n_calls for op in job.ops)
    i = 0
    for k, op in enumerate(job.ops, 1):
        calls = adapters[op.op].calls(op, device, job.mode)
        while True:
            try:
                call = next(calls)
            except StopIteration:
                break
            except Exception as exc:  # the op's inputs or function cannot be made here
                emit({"event": "op_skipped", "op": op.label, "why": _first_line(exc)})
                break
            i += 1
            emit(_call_event(i, n, op.label, call, k, len(job.ops)))
            t0 = time.perf_counter()
            try:
                _run_synced(call, torch, device)
            except Exception as exc:  # this call's entries stay untimed; the others go on
                emit(
                    {
                        "event": "call_failed",
                        "op": call.label,
                        "tokens": call.tokens,
                        "message": _first_line(exc),
                    }
                )
            emit({"event": "called", "i": i, "seconds": round(time.perf_counter() - t0, 4)})
    emit({"event": "done", "seconds": round(time.perf_counter() - started, 3)})


def _call_event(i: int, n: int, op: str, call: Any, op_i: int, ops: int) -> dict[str, Any]:
    """The line the parent shows as progress before call `i` of `n` runs (tune and bench)."""
    return {
        "event": "call",
        "i": i,
        "n": n,
        "op": op,
        "backend": call.backend,
        "tokens": call.tokens,
        "op_i": op_i,
        "ops": ops,
    }


def _run_synced(call: Any, torch: Any, device: Any) -> None:
    """One call, finished on the GPU before it returns (a timing counts the kernel, not its
    launch)."""
    call.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(torch: Any, device: Any) -> tuple[int, str]:
    if device.type != "cuda":
        return 0, str(device)  # tests: CPU runners under FlashInfer's real AutoTuner
    if not torch.cuda.is_available():
        why = "torch has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise Stop(
            "no-gpu",
            f"{why} (torch {torch.__version__}): tuning needs the GPU the cache is for",
            EXIT_REFUSED,
        )
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor, str(torch.cuda.get_device_name(device))


def _check(job: Job, adapters: dict[str, Any], cc: int, torch: Any, device: Any) -> None:
    """Everything that would fail later, refused now: before the first tuning call."""
    problems: list[str] = []
    for op in job.ops:
        adapter = adapters.get(op.op)
        if adapter is None:
            problems.append(f"op {op.index}: no tuner for {op.op!r}")
            continue
        if device.type == "cuda":
            problems += adapter.problems(op, cc)
    if device.type == "cuda" and not problems:
        free, _total = torch.cuda.mem_get_info(device)
        for op in job.ops:
            need = adapters[op.op].bytes_needed(op)
            if need > free * MEMORY_HEADROOM:
                problems.append(
                    f"{op.label}: its inputs need {need / 2**30:.1f} GiB, the GPU has "
                    f"{free / 2**30:.1f} GiB free (shard it: tp_size / ep_size)"
                )
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Stop(
            "unsupported",
            "; ".join(problems) if len(problems) <= 3 else problems[0] + more,
            EXIT_REFUSED,
        )


def _probe(job: Job, adapters: dict[str, Any], device: Any, torch: Any, emit: Emit) -> None:
    """Call each op and backend once, untuned, at its smallest token count: a missing library,
    a shape the kernel rejects or a failed JIT build is refused here, before any tuning. (The
    first call also builds FlashInfer's kernels, so this is where compilation time goes.)"""
    for op in job.ops:
        seen: set[str] = set()
        for call in adapters[op.op].calls(op, device, job.mode):
            if call.backend in seen:
                break  # calls come smallest token count first, one per backend
            seen.add(call.backend)
            emit({"event": "probe", "op": op.label, "backend": call.backend})
            try:
                call.run()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as exc:
                raise Stop(
                    "unsupported", f"{call.label} cannot run here: {_first_line(exc)}", EXIT_REFUSED
                ) from None


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:400]
    return f"{type(exc).__name__}: {text}"


def _calls(job: Job, adapters: dict[str, Any], device: Any) -> Iterator[Any]:
    """Every call in plan order; an op's inputs are made when its turn comes, then dropped."""
    for op in job.ops:
        yield from adapters[op.op].calls(op, device, job.mode)


def _sigterm_as_interrupt() -> None:
    """SIGTERM (the parent's second signal) interrupts like SIGINT, so what was tuned is saved."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _save_partial(path: str, emit: Emit) -> None:
    """Interrupted: FlashInfer's own save of what this process has (the file's entries and the
    buckets tuned so far) to `path`, beside the cache; the parent moves it into place with the
    store's writer, under the namespace lock it still holds."""
    from flashinfer.autotuner import AutoTuner

    tuner = AutoTuner.get()
    tuner.save_configs(path)
    with contextlib.suppress(OSError, ValueError):  # the parent may have stopped reading
        emit({"event": "partial", "path": path, "tuned": len(tuner.profiling_cache)})


def _discard_unsaved() -> None:
    """A run that did not finish saves nothing: FlashInfer's autotune() saves whatever is new
    on the way out, even on an exception (autotuner.py: `if cache and tune_mode and _dirty`)."""
    from flashinfer.autotuner import AutoTuner

    AutoTuner.get()._dirty = False


def _count_lookups() -> _Lookups:
    """Wrap this process's AutoTuner.search_cache to count hits (replay only)."""
    from flashinfer.autotuner import AutoTuner

    tuner = AutoTuner.get()
    original = tuner.search_cache
    seen = _Lookups()

    def counting(custom_op: str, *args: Any, **kwargs: Any) -> Any:
        result = original(custom_op, *args, **kwargs)
        if result[0]:
            seen.hits += 1
        else:
            seen.misses.append(custom_op)
        return result

    tuner.search_cache = counting
    return seen


def _report_buckets(emit: Emit, call_index: Callable[[], int]) -> None:
    """A `bucket` event as FlashInfer starts profiling each bucket inside a call: one MoE call
    tunes every bucket up to tune_max_num_tokens, minutes with no other sign of life. Wraps two
    private AutoTuner methods (0.6.17 - 0.7.4); without them, calls still report, buckets not."""
    from flashinfer.autotuner import AutoTuner

    tuner = AutoTuner.get()
    generate = getattr(tuner, "_generate_optimization_profiles", None)
    prepare = getattr(tuner, "_prepare_input_tensors", None)
    if not callable(generate) or not callable(prepare):
        return
    state: dict[str, Any] = {"profiles": [], "where": None}

    def generating(tuning_config: Any, inputs: Any) -> Any:
        profiles = generate(tuning_config, inputs)
        state.update(profiles=list(profiles), where=_tuned_dim(tuning_config))
        return profiles

    def preparing(profile: Any, inputs: Any) -> Any:
        step = next((k for k, q in enumerate(state["profiles"], 1) if q is profile), None)
        bucket = _bucket(profile, state["where"])
        total = len(state["profiles"])
        emit({"event": "bucket", "i": call_index(), "step": step, "total": total, "bucket": bucket})
        return prepare(profile, inputs)

    tuner._generate_optimization_profiles = generating
    tuner._prepare_input_tensors = preparing


def _tuned_dim(tuning_config: Any) -> tuple[int, int] | None:
    """(input, dim) of the first dimension FlashInfer buckets (the token count)."""
    try:
        spec = tuning_config.dynamic_tensor_specs[0]
        return int(spec.input_idx[0]), int(spec.dim_idx[0])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def _bucket(profile: Any, where: tuple[int, int] | None) -> int | None:
    if where is None:
        return None
    try:
        return int(profile.get_opt_shapes()[where[0]][where[1]])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
