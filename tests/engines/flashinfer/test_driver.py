"""The tuning child's protocol (fi_cache/engines/flashinfer/driver.py), driven directly, with real
FlashInfer.

tests/engines/flashinfer/cpu_tune_child.py runs fi-cache's driver with FlashInfer 0.6.17 / 0.6.18's
own AutoTuner on CPU (its docstring says what stands in for the GPU). Each child gets its whole
input at once: the job line and the parent's answer to `ready` (`{"cache": PATH}` or `{"stop":
true}`); the child reads the answer only after it has sent `ready`. The children of both versions
run in parallel in one module fixture, because each one imports torch and FlashInfer (seconds of
CPU).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.flashinfer import plan as plans
from fi_cache.engines.flashinfer.driver import Job
from fi_cache.engines.flashinfer.plan import GemmOp
from fi_cache.model.keys import parse_key
from tests.conftest import (
    FI_VERSIONS,
    FLASHINFER_INSTALLS,
    ROOT,
    SMALL_PLAN,
    fi_load_argv,
    fi_load_result,
    flashinfer_dir,
    h200_metadata,
    run_parallel,
)

CHILD = Path(__file__).with_name("cpu_tune_child.py")
PLAN = plans.loads(
    SMALL_PLAN,
    "test-plan.toml",
)
MODES = ("fused", "unfused")
# FlashInfer's token buckets up to the largest token count (16): powers of two below 256.
BUCKETS = [1, 2, 4, 8, 16]
GEMM_OP = "fi_cache_test::cpu_gemm"  # the CPU stand-in's op for mm_bf16 (cpu_tune_child.py)
GEMM1, GEMM2 = "trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"
G1, G2 = 45, {"fused": 81, "unfused": 36}  # the fake compiled MoE module's tactic counts
CALLS = 4  # 2 token counts x (mm_bf16 + cutlass_fused_moe), in each mode
# Replay (`"tune": false`) is fi-cache's driver code; on 0.6.17 the same lookups hit the same
# keys (test_0617_keys_cannot_tell_the_modes_apart), so one version is enough.
REPLAYED = "0.6.18"


def _job(mode: str, tune: bool = True) -> str:
    """The job line the parent (fi_cache/engines/flashinfer/warm.py) sends for `mode`."""
    return json.dumps(Job(mode, PLAN.for_mode(mode), tune).to_json())


def _child_env(version: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FLASHINFER_INSTALLS[version]), str(ROOT)]),
        **extra,
    }


def _cpu_child(version: str, lines: list[str], cwd: Path, **env: str) -> dict[str, Any]:
    return {
        "args": [sys.executable, str(CHILD)],
        "input": "".join(line + "\n" for line in lines),
        "env": _child_env(version, **env),
        "cwd": cwd,
    }


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    stderr: str

    @classmethod
    def of(cls, p: Any) -> Run:
        events = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
        return cls(p.returncode, events, p.stderr)

    @property
    def names(self) -> list[str]:
        """Event names, progress inside a call (`bucket`) left out."""
        return [e["event"] for e in self.events if e["event"] != "bucket"]

    def only(self, name: str) -> dict[str, Any]:
        [event] = [e for e in self.events if e["event"] == name]
        return event


@dataclass
class Version:
    """Everything one FlashInfer version's children did."""

    tuned: dict[str, Run] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    inits: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # init() calls
    fi_load: Any = None  # fi_load.py's process, on the fused file
    replay: Run | None = None  # `"tune": false` on the unfused file


@dataclass
class Runs:
    versions: dict[str, Version]
    stop_dir: Path
    stopped: Run | None = None  # 0.6.18, answered `{"stop": true}`
    probe_failed: Run | None = None  # 0.6.18, a backend that raises on every call
    tune_failed: Run | None = None  # 0.6.18, the same backend met while tuning, after a good one
    no_gpu: Run | None = None  # the real child, 0.6.18, on this CPU-only torch


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """In parallel, per installed version and mode: a tuning child, then FlashInfer loading what
    it saved: fi_load.py the fused file; 0.6.18 replays the unfused one. Once (0.6.18): a child
    stopped at `ready`, one whose probe fails, and the real child on this GPU-less host. (Each
    child imports torch: about 4 s of CPU; only what adds coverage runs twice.)"""
    versions = [v for v in FI_VERSIONS if v in FLASHINFER_INSTALLS]
    out = Runs({v: Version() for v in versions}, tmp_path_factory.mktemp("stop"))

    def tune_then_load(v: str, mode: str, base: Path) -> None:
        ver = out.versions[v]
        cache = ver.files[mode] = base / mode / "autotune_configs.json"
        cache.parent.mkdir()
        record = base / f"{mode}-inits.jsonl"
        answer = json.dumps({"cache": str(cache)})
        [p] = run_parallel(
            _cpu_child(v, [_job(mode), answer], base, FI_CACHE_TEST_RECORD=str(record))
        )
        ver.tuned[mode] = Run.of(p)
        lines = record.read_text().splitlines() if record.exists() else []
        ver.inits[mode] = [json.loads(line) for line in lines]
        if not cache.exists():
            return
        if mode == "fused":
            [ver.fi_load] = run_parallel({"args": fi_load_argv(cache), "env": _child_env(v)})
        elif v == REPLAYED:
            [p] = run_parallel(_cpu_child(v, [_job(mode, tune=False), answer], ROOT))
            ver.replay = Run.of(p)

    def stop() -> None:
        [p] = run_parallel(_cpu_child("0.6.18", [_job("fused"), '{"stop": true}'], out.stop_dir))
        out.stopped = Run.of(p)

    def probe_fails() -> None:
        op = GemmOp("mm_bf16", 64, 64, (1, 16), ("cudnn", "no-cudnn"), index=1)
        job = json.dumps(Job("fused", (op,), stage="check").to_json())
        [p] = run_parallel(_cpu_child("0.6.18", [job], out.stop_dir))
        out.probe_failed = Run.of(p)

    def tune_fails() -> None:
        op = GemmOp("mm_bf16", 64, 64, (1, 16), ("cudnn", "no-cudnn"), index=1)
        job = json.dumps(Job("fused", (op,)).to_json())
        cache = json.dumps({"cache": str(out.stop_dir / "failed.json")})
        [p] = run_parallel(_cpu_child("0.6.18", [job, cache], out.stop_dir))
        out.tune_failed = Run.of(p)

    def no_gpu() -> None:
        [p] = run_parallel(_real_child(_job("fused"), FLASHINFER_INSTALLS["0.6.18"]))
        out.no_gpu = Run.of(p)

    tasks: list[Callable[[], None]] = []
    for v in versions:
        base = tmp_path_factory.mktemp(f"driver-{v}")
        tasks += [partial(tune_then_load, v, mode, base) for mode in MODES]
    if "0.6.18" in versions:
        tasks += [stop, probe_fails, tune_fails, no_gpu]
    with ThreadPoolExecutor(max(1, len(tasks))) as pool:
        for future in [pool.submit(task) for task in tasks]:
            future.result()
    return out


def _get(runs: Runs, version: str) -> Version:
    flashinfer_dir(version)  # skips (or fails under scripts/test.sh) without this version
    return runs.versions[version]


def _saved(v: Version, mode: str) -> dict[str, Any]:
    return json.loads(v.files[mode].read_text())  # type: ignore[no-any-return]


def _by_bucket(entries: dict[str, Any], op: str) -> dict[int, tuple[Any, Any]]:
    """bucket -> (parsed key, value) of `op`'s entries (a file's, or what FlashInfer loaded)."""
    out = {}
    for raw, value in entries.items():
        if raw.startswith("_"):
            continue
        key = parse_key(raw)
        if key.op == op:
            first_input = key.profile[0]
            assert isinstance(first_input, tuple)
            out[first_input[0]] = (key, value)
    return out


def _tactics(entries: dict[str, Any], op: str) -> dict[int, int]:
    return {bucket: value[1] for bucket, (_, value) in _by_bucket(entries, op).items()}


# --- the protocol ------------------------------------------------------------------------------


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_events_come_in_protocol_order(runs: Runs, version: str, mode: str) -> None:
    run = _get(runs, version).tuned[mode]
    assert run.code == 0, run.stderr[-3000:]
    # ready (no untuned call first: that is the check stage's, in its own process), one
    # call/called pair per call, op_done after each op's calls, the MoE tactic counts, done.
    per_op = ["call", "called"] * (CALLS // 2) + ["op_done"]  # two ops, two calls each
    assert run.names == ["ready", *per_op * 2, "counts", "done"]
    assert [e["seconds"] >= 0 and e["calls"] for e in run.events if e["event"] == "op_done"] == [
        2,
        2,
    ]
    ready = run.only("ready")
    assert ready["flashinfer_version"] == version
    assert ready["metadata"] == h200_metadata(version)  # FlashInfer's own, from the H200 file
    calls = [e for e in run.events if e["event"] == "call"]
    called = [e for e in run.events if e["event"] == "called"]
    assert [(e["i"], e["n"]) for e in calls] == [(i, CALLS) for i in range(1, CALLS + 1)]
    assert [e["i"] for e in called] == [1, 2, 3, 4]
    assert [e["tokens"] for e in calls] == [1, 16, 1, 16]
    assert [e["op"] for e in calls] == [op.label for op in PLAN.ops for _ in (1, 16)]
    assert calls[2]["backend"] == f"cutlass, {mode} finalize"
    assert all(e["seconds"] >= 0 for e in called)
    done = run.only("done")
    assert done["seconds"] >= done["save_seconds"] >= 0
    assert "hits" not in done  # only a replay counts lookups


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_buckets_report_what_flashinfer_profiles_inside_each_call(
    runs: Runs, version: str, mode: str
) -> None:
    """A call tunes every bucket up to its size that the cache lacks; a MoE call tunes GEMM1's
    and GEMM2's buckets up to tune_max_num_tokens at once. Each gets a `bucket` event, between
    its call's `call` and `called`."""
    run = _get(runs, version).tuned[mode]
    seen: dict[int, list[tuple[int, int, int]]] = {}
    open_call = 0
    for e in run.events:
        if e["event"] == "call":
            open_call = e["i"]
        elif e["event"] == "called":
            open_call = 0
        elif e["event"] == "bucket":
            assert e["i"] == open_call != 0
            seen.setdefault(e["i"], []).append((e["bucket"], e["step"], e["total"]))
    assert seen == {
        1: [(1, 1, 1)],  # mm_bf16 at 1 token
        2: [(2, 2, 5), (4, 3, 5), (8, 4, 5), (16, 5, 5)],  # at 16: bucket 1 is cached already
        3: [(b, k, 5) for k, b in enumerate(BUCKETS, 1)] * 2,  # MoE: GEMM1, then GEMM2
    }  # call 4 (MoE at 16 tokens): everything cached, no bucket


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_counts_event_reports_the_compiled_runners_tactic_counts(
    runs: Runs, version: str, mode: str
) -> None:
    counts = _get(runs, version).tuned[mode].only("counts")
    moe = PLAN.ops[1]
    assert (counts["index"], counts["op"]) == (moe.index, moe.label)
    assert counts["gemm1"] == G1 and counts["gemm2"] == G2


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_fi_cache_inits_the_moe_runner_as_flashinfer_does(
    runs: Runs, version: str, mode: str
) -> None:
    """fi-cache asks the compiled module for tactic counts with `init` flags it builds from
    versions.moe_init_flags; FlashInfer's own MoERunner made the same call for this mode."""
    inits = _get(runs, version).inits[mode]
    flashinfer = {tuple(c["args"]) for c in inits if c["caller"] == "flashinfer"}
    ours = [tuple(c["args"]) for c in inits if c["caller"] == "fi-cache"]
    assert len(flashinfer) == 1, inits
    assert len(ours) == 2 and ours[0] != ours[1]  # fused, then unfused
    assert flashinfer == {ours[MODES.index(mode)]}


# --- what FlashInfer saved ---------------------------------------------------------------------


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
@pytest.mark.parametrize("mode", MODES)
def test_the_saved_file_has_every_bucket_of_every_op(runs: Runs, version: str, mode: str) -> None:
    saved = _saved(_get(runs, version), mode)
    assert saved["_metadata"] == h200_metadata(version)  # FlashInfer stamped the H200's
    assert ("_generation" in saved) == (version == "0.6.18")
    assert len(saved) - 1 - ("_generation" in saved) == 3 * len(BUCKETS)
    for op in (GEMM_OP, GEMM1, GEMM2):
        assert sorted(_by_bucket(saved, op)) == BUCKETS, op
    # GEMM2 ids come after GEMM1's, from this mode's own list.
    assert all(G1 <= t < G1 + G2[mode] for t in _tactics(saved, GEMM2).values())
    assert all(0 <= t < G1 for t in _tactics(saved, GEMM1).values())


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_flashinfer_loads_the_fused_file_whole(runs: Runs, version: str) -> None:
    v = _get(runs, version)
    loaded, saved = fi_load_result(v.fi_load), _saved(v, "fused")
    assert "error" not in loaded, loaded.get("error")
    assert loaded["flashinfer_version"] == version and loaded["returned"] is True
    assert loaded["loaded"] == 3 * len(BUCKETS)
    assert loaded["keys"] == sorted(k for k in saved if not k.startswith("_"))
    assert loaded["values"] == {k: saved[k][:2] for k in loaded["keys"]}


@pytest.mark.flashinfer
def test_replay_finds_every_lookup_in_the_unfused_file(runs: Runs) -> None:
    v = _get(runs, REPLAYED)
    replay = v.replay
    assert replay is not None and replay.code == 0, replay and replay.stderr[-3000:]
    assert f"Loaded {3 * len(BUCKETS)} configs from {v.files['unfused']}" in replay.stderr
    per_op = ["call", "called"] * (CALLS // 2) + ["op_done"]  # two ops, two calls each
    assert replay.names == ["ready", *per_op * 2, "counts", "done"]
    done = replay.only("done")
    # AutoTuner.search_cache: one lookup per GEMM call, two (GEMM1, GEMM2) per MoE call.
    assert done["misses"] == []
    assert done["hits"] == 2 * 1 + 2 * 2


@pytest.mark.flashinfer
@pytest.mark.parametrize("mode", MODES)
def test_0618_moe_keys_end_with_the_finalize_mode(runs: Runs, mode: str) -> None:
    saved = _saved(_get(runs, "0.6.18"), mode)
    for op in (GEMM1, GEMM2):
        extras = [key.extras for key, _ in _by_bucket(saved, op).values()]
        assert all(isinstance(e, tuple) and len(e) == 20 for e in extras)
        assert {e[-1] for e in extras} == {mode == "fused"}  # type: ignore[index]


@pytest.mark.flashinfer
def test_0617_keys_cannot_tell_the_modes_apart(runs: Runs) -> None:
    """Why each mode gets its own process and namespace: on 0.6.17 the fused and unfused files
    have the same keys; only GEMM2's tactics differ (fused ids run past the unfused list)."""
    v = _get(runs, "0.6.17")
    fused, unfused = _saved(v, "fused"), _saved(v, "unfused")
    assert list(fused) == list(unfused)
    assert all(parse_key(k).extras == () for k in fused if not k.startswith("_"))
    assert _tactics(fused, GEMM1) == _tactics(unfused, GEMM1)
    assert _tactics(fused, GEMM2) != _tactics(unfused, GEMM2)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.flashinfer
def test_stop_instead_of_a_cache_path_tunes_nothing(runs: Runs) -> None:
    flashinfer_dir("0.6.18")
    stopped = runs.stopped
    assert stopped is not None and stopped.code == 2, stopped and stopped.stderr[-2000:]
    assert stopped.names == ["ready", "error"]
    assert stopped.events[-1]["kind"] == "stopped"
    assert list(runs.stop_dir.iterdir()) == []  # nothing written where it ran


@pytest.mark.flashinfer
def test_an_op_that_cannot_run_here_is_refused_at_its_probe(runs: Runs) -> None:
    """The check stage calls each op and backend once, untuned, in a process of its own: one
    that fails (here as FlashInfer's cuDNN GEMM does without cuDNN's frontend) is refused
    before any tuning process starts."""
    flashinfer_dir("0.6.18")
    run = runs.probe_failed
    assert run is not None and run.code == 2, run and run.stderr[-2000:]
    assert run.names == ["probe", "probe", "error"]  # no `checked`: no tuning child follows
    assert [e["backend"] for e in run.events[:2]] == ["cudnn", "no-cudnn"]
    error = run.events[-1]
    assert error["kind"] == "unsupported"
    assert error["message"] == (
        "mm_bf16 n=64 k=64 [no-cudnn] cannot run here: "
        "RuntimeError: cuDNN is not available. Please install cuDNN"
    )
    assert list(runs.stop_dir.iterdir()) == []


def _real_child(line: str, flashinfer: Path | None = None) -> dict[str, Any]:
    """`python -m fi_cache.engines.flashinfer`, as the parent starts it."""
    path = [str(flashinfer)] if flashinfer else []
    return {
        "args": [sys.executable, "-m", "fi_cache.engines.flashinfer"],
        "input": line + "\n",
        "env": {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])},
    }


@pytest.mark.parametrize(
    "line",
    [
        "this is not JSON",
        "[1, 2]",
        '{"ops": []}',  # no mode
        '{"mode": "fused", "ops": [{"op": "mm_bf16", "n": 64}]}',  # an op missing fields
    ],
)
def test_a_bad_job_line_is_refused(line: str) -> None:
    [p] = run_parallel(_real_child(line))
    run = Run.of(p)
    assert run.code == 2, run.stderr
    assert run.names == ["error"] and run.events[0]["kind"] == "job"
    assert run.events[0]["message"].startswith("bad job on stdin")


@pytest.mark.flashinfer
def test_real_child_without_cuda_refuses_before_any_tuning(runs: Runs) -> None:
    flashinfer_dir("0.6.18")
    run = runs.no_gpu
    assert run is not None and run.code == 2, run and run.stderr[-3000:]
    assert run.names == ["error"]  # no probe, no ready, no call
    assert run.events[0]["kind"] == "no-gpu"
    assert "torch has no CUDA" in run.events[0]["message"]


@pytest.mark.flashinfer
def test_a_failed_tuning_saves_nothing(runs: Runs) -> None:
    """FlashInfer's autotune() saves whatever is new on any exit; the driver discards it when a
    call fails, so no half-tuned file lands in the namespace."""
    flashinfer_dir("0.6.18")
    run = runs.tune_failed
    assert run is not None and run.code == 1, run and run.stderr[-2000:]
    assert run.names == ["ready", "call", "called", "call", "error"]  # the cudnn call tuned first
    assert run.events[-1]["kind"] == "failed"
    assert "Saved" not in run.stderr
    assert not (runs.stop_dir / "failed.json").exists()
