"""Timing tactics with FlashInfer's own runners and profiler, in the tuning child (driver.py).

Two uses, both by wrapping this process's `AutoTuner.choose_one` (every FlashInfer op calls it,
tuning or not; the wrapper sees the op's runners, its TuningConfig and the caller's inputs):
- bench (`fi-cache bench`): for every bucket FlashInfer would tune for a call, the cached tactic
  of that key (sent by the parent; FlashInfer's own loader is not used, so nothing is saved and a
  file from another environment can still be read), the default (runners[0], tactic -1: what
  FlashInfer runs on a miss) and the nearest other tactics of the cached runner are timed, one
  sample per candidate per round, with `AutoTuner._profile_single_kernel` on inputs made by
  `_prepare_input_tensors`: the path FlashInfer's tuning takes. The op then runs its fallback.
- repeat (`warm --engine flashinfer --repeat K`): under autotune(True), each bucket not yet cached
  gets every valid tactic of every runner, and the default, timed K rounds; the tactic kept is
  fi_cache.tuning.verdict.robust_winner's, written into FlashInfer's in-memory cache, so
  FlashInfer's own save writes it.
Private AutoTuner methods used (0.6.17 - 0.7.x): _generate_optimization_profiles,
_prepare_input_tensors, _profile_single_kernel, _get_cache_key, _get_input_sizes, search_cache,
profiling_cache.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fi_cache.tuning.verdict import MIN_ROUNDS, Candidate, robust_winner

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class BenchSettings:
    entries: dict[str, Any]  # file key -> [runner class name, tactic], as in the cache file
    rounds: int = 5
    budget_ms: float = 2000.0  # per entry: no more rounds once spent (MIN_ROUNDS always run)
    alternatives: int = 3  # other tactics of the cached runner, nearest ids first

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchSettings:
        entries = dict(data.get("entries") or {})
        budget = float(data.get("budget_ms", 2000.0))
        return cls(entries, int(data.get("rounds", 5)), budget, int(data.get("alternatives", 3)))

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "rounds": self.rounds,
            "budget_ms": self.budget_ms,
            "alternatives": self.alternatives,
        }


@dataclass
class _Slot:
    """A candidate being timed: where it sits in the op's runner list, and its samples."""

    runner_id: int
    runner: Any
    tactic: Any
    role: str  # "cached" | "default" | "alternative" | "candidate"
    order: int
    samples: list[float] = field(default_factory=list)
    error: str = ""

    def candidate(self) -> Candidate:
        return Candidate(
            type(self.runner).__name__,
            self.tactic,
            tuple(self.samples),
            self.order,
            self.role == "default",
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runner": type(self.runner).__name__,
            "tactic": _jsonable(self.tactic),
            "role": self.role,
            "samples": [round(s, 6) if s < float("inf") else "inf" for s in self.samples],
        }
        if self.error:
            out["error"] = self.error
        return out


def _jsonable(tactic: Any) -> Any:
    return [_jsonable(t) for t in tactic] if isinstance(tactic, tuple) else tactic


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


def _key(tuner: Any, op: str, runner: Any, shapes: Any, config: Any, inputs: Any) -> str:
    """The string FlashInfer's save_configs writes for (op, runner, bucket)."""
    cache_key = tuner._get_cache_key(
        op, runner, shapes, config, runner.get_cache_key_extras(inputs)
    )
    return str(getattr(cache_key, "file_key", cache_key))


def _time(
    tuner: Any,
    slots: list[_Slot],
    tensors: Any,
    config: Any,
    kwargs: dict[str, Any],
    rounds: int,
    budget_s: float,
) -> int:
    """One sample per slot per round, rounds interleaved; a failing tactic records inf.
    Returns the rounds made."""
    started = time.perf_counter()
    done = 0
    for _ in range(rounds):
        for s in slots:
            if s.error:
                s.samples.append(float("inf"))
                continue
            try:
                ms = float(
                    tuner._profile_single_kernel(s.runner, tensors, s.tactic, config, **kwargs)
                )
            except Exception as exc:  # a tactic that cannot run this shape: FlashInfer skips it too
                s.error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                _clear_cuda_error()
                ms = float("inf")
            s.samples.append(ms)
        done += 1
        if done >= MIN_ROUNDS and time.perf_counter() - started > budget_s:
            break
    return done


def _clear_cuda_error() -> None:
    """As FlashInfer does after a failed tactic: a sticky CUDA error would fail the next one."""
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaGetLastError()
    except Exception:  # best effort, as FlashInfer's own
        pass


def _prepare(
    tuner: Any, runners: Any, profile: Any, inputs: Any, config: Any, kwargs: dict[str, Any]
) -> Any:
    tensors = tuner._prepare_input_tensors(profile, inputs)
    hook = getattr(config, "inputs_pre_hook", None)
    if hook is not None:
        tensors = list(hook(tensors))
    for r in runners:  # the MoE runner prepares its workspace once per profile (do_preparation)
        if "do_preparation" in inspect.signature(r.forward).parameters:
            r(tensors, tactic=-1, do_preparation=True, **kwargs)
    return tensors


def _valid(tuner: Any, op: str, runner: Any, tensors: Any, profile: Any) -> list[Any]:
    tactics = list(runner.get_valid_tactics(tensors, profile))
    blocklist = getattr(tuner, "_blocklist", None)  # 0.6.18+: tactics known to fail
    return list(blocklist.filter(op, runner, tactics)) if blocklist is not None else tactics


def _store_winner(tuner: Any, key: Any, tactic: Any, profile: Any, config: Any) -> None:
    """Where choose_one looks first: `profiling_cache` (0.6.x); 0.7.x's winner partition of this
    context (the plain `profiling_cache` for v1 flows) with the measurement policy it checks."""
    winners = getattr(tuner, "_winner_cache", None)
    cache = winners() if callable(winners) else tuner.profiling_cache
    cache[key] = (tactic, profile)
    policies = getattr(tuner, "_profiling_cache_policies", None)
    policy = getattr(tuner, "_profiling_policy", None)
    identity = getattr(tuner, "_winner_cache_identity", None)
    if isinstance(policies, dict) and callable(policy) and callable(identity):
        policies[(identity(), key)] = policy(config)


def _bucket(profile: Any) -> int | None:
    try:
        return int(profile.get_opt_shapes()[0][0])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def install_bench(tuner: Any, settings: BenchSettings, emit: Emit) -> None:
    """Wrap `tuner.choose_one` to time the cached entries each call reaches (module docstring)."""
    timed: set[str] = set()
    budget_s = settings.budget_ms / 1000

    def choose_one(op: str, runners: Any, config: Any, inputs: Any, **kwargs: Any) -> Any:
        served = tuner._get_input_sizes(inputs)
        for r in runners:  # the key this call itself looks up: how often each entry is served
            key = _key(tuner, op, r, served, config, inputs)
            if key in settings.entries:
                emit({"event": "served", "key": key})
        for profile in tuner._generate_optimization_profiles(config, inputs):
            shapes = profile.get_opt_shapes()
            for rid, r in enumerate(runners):
                key = _key(tuner, op, r, shapes, config, inputs)
                if key in timed or key not in settings.entries:
                    continue
                timed.add(key)
                try:
                    _bench_one(op, runners, rid, profile, config, inputs, kwargs, key)
                except Exception as exc:  # one entry untimed; the call and the run go on
                    error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                    emit({"event": "timed", "key": key, "op": op, "error": error})
        return runners[0], -1  # the fallback: nothing here is cached in FlashInfer itself

    def _bench_one(
        op: str,
        runners: Any,
        rid: int,
        profile: Any,
        config: Any,
        inputs: Any,
        kwargs: dict[str, Any],
        key: str,
    ) -> None:
        name, raw = settings.entries[key][:2]  # 0.7.x adds the measurement policy
        runner = runners[rid]
        if name != type(runner).__name__:
            return  # FlashInfer would not use it either (search_cache checks the name)
        cached = _from_json(raw)
        base = {"event": "timed", "key": key, "op": op, "bucket": _bucket(profile)}
        try:
            tensors = _prepare(tuner, runners, profile, inputs, config, kwargs)
            valid = _valid(tuner, op, runner, tensors, profile)
        except Exception as exc:  # one entry skipped, the run goes on
            emit({**base, "error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"})
            return
        slots = [_Slot(rid, runner, cached, "cached", 1 + rid * 10_000 + _index(valid, cached))]
        if not (rid == 0 and cached == -1):
            slots.append(_Slot(0, runners[0], -1, "default", 0))
        near = [t for t in valid if t != cached and isinstance(t, int) and isinstance(cached, int)]
        near.sort(key=lambda t: (abs(t - cached), t))
        for t in near[: settings.alternatives]:
            slots.append(_Slot(rid, runner, t, "alternative", 1 + rid * 10_000 + valid.index(t)))
        t0 = time.perf_counter()
        rounds = _time(tuner, slots, tensors, config, kwargs, settings.rounds, budget_s)
        emit(
            {
                **base,
                "runner": name,
                "tactic": raw,
                "rounds": rounds,
                "valid": len(valid),
                "cached_valid": cached in valid or cached == -1,
                "seconds": round(time.perf_counter() - t0, 4),
                "candidates": [s.to_json() for s in slots],
            }
        )

    tuner.choose_one = choose_one


def _index(valid: list[Any], tactic: Any) -> int:
    return valid.index(tactic) if tactic in valid else len(valid)


def install_repeat(tuner: Any, rounds: int, emit: Emit) -> None:
    """Wrap `tuner.choose_one` so each uncached bucket keeps its robust winner over `rounds`
    rounds (module docstring); FlashInfer's own choose_one then finds every bucket cached."""
    original = tuner.choose_one

    def choose_one(op: str, runners: Any, config: Any, inputs: Any, **kwargs: Any) -> Any:
        skip: frozenset[str] = getattr(tuner, "_effective_skip_ops", frozenset())
        if not tuner.is_tuning_mode or op in skip:
            return original(op, runners, config, inputs, **kwargs)
        for profile in tuner._generate_optimization_profiles(config, inputs):
            hit = tuner.search_cache(op, runners, profile.get_opt_shapes(), config, inputs=inputs)
            if not hit[0]:
                _keep_robust(op, runners, profile, config, inputs, kwargs)
        return original(op, runners, config, inputs, **kwargs)

    def _keep_robust(
        op: str, runners: Any, profile: Any, config: Any, inputs: Any, kwargs: dict[str, Any]
    ) -> None:
        tensors = _prepare(tuner, runners, profile, inputs, config, kwargs)
        slots = [_Slot(0, runners[0], -1, "default", 0)]
        for rid, r in enumerate(runners):
            for k, t in enumerate(_valid(tuner, op, r, tensors, profile)):
                slots.append(_Slot(rid, r, t, "candidate", 1 + rid * 10_000 + k))
        made = _time(tuner, slots, tensors, config, kwargs, rounds, float("inf"))
        candidates = [s.candidate() for s in slots]
        win = robust_winner(candidates)
        slot = slots[candidates.index(win)]
        fastest = min(slots, key=lambda s: (s.candidate().median, s.order))
        key = tuner._get_cache_key(
            op,
            slot.runner,
            profile.get_opt_shapes(),
            config,
            slot.runner.get_cache_key_extras(tensors),
        )
        _store_winner(tuner, key, slot.tactic, profile, config)
        tuner._dirty = True
        if hasattr(tuner, "_dirty_seq"):
            tuner._dirty_seq += 1
        emit(
            {
                "event": "robust",
                "op": op,
                "bucket": _bucket(profile),
                "rounds": made,
                "candidates": len(slots),
                "runner": type(slot.runner).__name__,
                "tactic": _jsonable(slot.tactic),
                "default": slot.role == "default",
                "fastest": [type(fastest.runner).__name__, _jsonable(fastest.tactic)],
            }
        )

    tuner.choose_one = choose_one
