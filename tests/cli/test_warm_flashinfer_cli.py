"""`fi-cache warm --engine flashinfer` as a user runs it: `python -m fi_cache`
in a real process, with a fake `nvidia-smi` reporting an H200 on PATH.

The tuning child is tests/engines/flashinfer/cpu_tune_child.py (FlashInfer's real AutoTuner and
fi-cache's real driver on CPU; see its docstring) behind `$FI_CACHE_PYTHON`, except where the REAL
child (`python -m fi_cache.engines.flashinfer`) must refuse on this GPU-less host, and where tiny
fake children misbehave on purpose. Refused runs point `$FI_CACHE_PYTHON` at a script that leaves a
marker file, to show the child never started.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.flashinfer.warm import plan_key
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import NAMESPACES_DIR, Namespace
from tests.conftest import (
    FI_VERSIONS,
    FLASHINFER_INSTALLS,
    ROOT,
    SMALL_PLAN,
    TuneRig,
    flashinfer_dir,
    h200_metadata,
    no_hang,
    one_line,
    run_parallel,
    seed_flashinfer_probe,
    start_if_needed,
    write_script,
)

CPU_CHILD = ROOT / "tests" / "engines" / "flashinfer" / "cpu_tune_child.py"


FAKE_VLLM = ROOT / "tests" / "fake_vllm.py"


PLAN = SMALL_PLAN


COUNTS = {"gemm1": 45, "gemm2": {"fused": 81, "unfused": 36}}  # the fake MoE module's


ENTRIES = 15  # 5 buckets (1..16) x (the GEMM, MoE GEMM1, MoE GEMM2)


MODES = ("fused", "unfused")


def _tune_python(root: Path) -> Path:
    """What `--python`/`$FI_CACHE_PYTHON` names: here, the CPU stand-in for the child."""
    text = f'#!/bin/sh\nexec "{sys.executable}" "{CPU_CHILD}" "$@"\n'
    return write_script(root / "tune-python", text)


def _ns_dir(store: Path, version: str, mode: str) -> Path:
    """Where the child's metadata (the H200's) puts `mode`'s namespace."""
    fp = Fingerprint.from_metadata(h200_metadata(version), "90a")
    return Namespace(fp, mode).path(store)  # type: ignore[arg-type]


def _manifest(ns: Path) -> dict[str, Any]:
    return json.loads((ns / "manifest.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def refusing(tmp_path: Path) -> TuneRig:
    """A rig whose tuning "python" only leaves a marker: it must never run."""
    marker = tmp_path / "child-started"
    python = write_script(tmp_path / "python", f'#!/bin/sh\ntouch "{marker}"\nexit 3\n')
    return TuneRig.make(tmp_path, python=python)


def _never_started(rig: TuneRig) -> bool:
    return not (rig.root / "child-started").exists() and not (rig.store / NAMESPACES_DIR).exists()


def test_the_marker_child_does_start_when_nothing_is_refused(refusing: TuneRig) -> None:
    """The check the refusal tests rely on can fail: a valid plan does start the child."""
    p = refusing.run("warm", "--engine", "flashinfer", "--plan", refusing.plan())
    assert p.returncode == 1 and "exited with code 3" in p.stderr
    assert (refusing.root / "child-started").exists()


_MOE = """
[[ops]]
op = "cutlass_fused_moe"
hidden_size = 256
intermediate_size = 128
"""


@pytest.mark.parametrize(
    "plan, words",
    [
        ('[[ops]]\nop = "mm_int4"\nn = 64\nk = 64\n', "unknown op 'mm_int4'"),
        (_MOE + "num_experts = 2\ntop_k = 4\n", "top_k = 4 is more than num_experts = 2"),
        ("tokens = [1, 16\n", "not valid TOML"),
        # The fake GPU is an H200 (SM90).
        (
            '[[ops]]\nop = "mm_fp8"\nn = 128\nk = 128\n',
            "trtllm_low_latency backend does not run on NVIDIA H200 (SM90)",
        ),
        (
            '[[ops]]\nop = "mm_bf16"\nn = 64\nk = 64\nbackends = ["cutlass"]\n',
            "cutlass backend does not run on NVIDIA H200 (SM90)",
        ),
    ],
    ids=["unknown-op", "top-k-over-experts", "invalid-toml", "mm-fp8-on-sm90", "cutlass-on-sm90"],
)
def test_a_plan_that_cannot_run_is_refused_naming_the_plan(
    refusing: TuneRig, plan: str, words: str
) -> None:
    path = refusing.plan(plan)
    p = refusing.run("warm", "--engine", "flashinfer", "--plan", path)
    assert p.returncode == 2, p.stderr
    line = one_line(p)
    assert line.startswith(f"fi-cache: {path}: ") and words in line
    assert _never_started(refusing)


def test_finalize_a_moe_op_does_not_list_is_refused(refusing: TuneRig) -> None:
    path = refusing.plan(_MOE + 'num_experts = 8\ntop_k = 2\nfinalize = ["fused"]\n')
    p = refusing.run("warm", "--engine", "flashinfer", "--plan", path, "--finalize", "unfused")
    assert p.returncode == 2, p.stderr
    line = one_line(p)
    assert line.startswith(f"fi-cache: {path}: ") and "would leave it untuned" in line
    assert _never_started(refusing)


def test_a_missing_plan_file_is_refused(refusing: TuneRig) -> None:
    missing = refusing.root / "nope.toml"
    p = refusing.run("warm", "--engine", "flashinfer", "--plan", missing)
    assert p.returncode == 2
    assert one_line(p) == f"fi-cache: {missing}: no such file"
    assert _never_started(refusing)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "flashinfer"], "--engine flashinfer needs --plan PLAN"),
        (["--engine", "flashinfer", "--plan", "PLAN", "--port", "8000"], "--port applies to"),
        (["--engine", "flashinfer", "--plan", "PLAN", "--vllm", "/bin/true"], "--vllm applies to"),
        (
            ["--engine", "flashinfer", "--plan", "PLAN", "--", "Qwen/Qwen3-30B-A3B"],
            "VLLM_SERVE_ARGS applies to --engine vllm only",
        ),
        (
            ["--plan", "PLAN", "--", "Qwen/Qwen3-30B-A3B"],
            "--plan and --python apply to --engine flashinfer only",
        ),
        (
            ["--engine", "vllm", "--plan", "PLAN", "--", "Qwen/Qwen3-30B-A3B"],
            "--plan and --python apply",
        ),
    ],
    ids=["no-plan", "port", "vllm", "vllm-args", "plan-default-engine", "plan-engine-vllm"],
)
def test_options_of_the_other_engine_are_refused(
    refusing: TuneRig, args: list[str], words: str
) -> None:
    plan = str(refusing.plan())
    p = refusing.run("warm", *[plan if a == "PLAN" else a for a in args])
    assert p.returncode == 2, p.stderr
    assert words in one_line(p)
    assert _never_started(refusing)


FAKE_CHILD = """\
import json, os, sys, time
job = json.loads(sys.stdin.readline())
meta = json.loads(os.environ["FAKE_CHILD_METADATA"])
ready = {"event": "ready", "flashinfer_version": meta["flashinfer_version"],
         "device": "NVIDIA H200", "cc": 90, "metadata": meta}
if job.get("stage") == "check":  # the untuned check calls pass; the tuning child then fails
    print(json.dumps({**ready, "event": "checked"}), flush=True)
    sys.exit(0)
print(json.dumps(ready), flush=True)
sys.stdin.readline()  # {"cache": PATH}
print("CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
time.sleep(0.5)  # fi-cache reads the child's stderr in a thread: let it see that line first
if os.environ["FAKE_CHILD"] == "crash":
    sys.exit(3)
print(json.dumps({"event": "call", "i": 1, "n": 4, "op": "mm_bf16 n=64 k=64",
                  "backend": "cudnn", "tokens": 1}), flush=True)
print(json.dumps({"event": "error", "kind": "failed",
                  "message": "mm_bf16 n=64 k=64 [cudnn] at 1 tokens: RuntimeError: CUDA error"}))
sys.exit(1)
"""


@pytest.mark.parametrize(
    "how, last",
    [
        ("crash", "fi-cache: the tuning process exited with code 3 without a result"),
        ("failed", "fi-cache: mm_bf16 n=64 k=64 [cudnn] at 1 tokens: RuntimeError: CUDA error"),
    ],
)
def test_a_child_that_fails_after_ready_is_a_failed_warm(
    tmp_path: Path, how: str, last: str
) -> None:
    child = tmp_path / "fake_child.py"
    child.write_text(FAKE_CHILD)
    python = write_script(tmp_path / "python", f'#!/bin/sh\nexec "{sys.executable}" "{child}"\n')
    rig = TuneRig.make(tmp_path, python=python)
    meta = json.dumps(h200_metadata("0.6.17"))
    p = rig.run(
        "warm",
        "--engine",
        "flashinfer",
        "--plan",
        rig.plan(),
        FAKE_CHILD=how,
        FAKE_CHILD_METADATA=meta,
    )
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines()[-1] == last
    assert "--- last 1 lines of the tuning process ---" in p.stderr
    assert "CUDA error: an illegal memory access" in p.stderr  # the child's own words
    # The namespace was chosen and locked, but no warm is recorded and no file left.
    ns = _ns_dir(rig.store, "0.6.17", "fused")
    assert ns.is_dir() and not (ns / "manifest.json").exists()
    assert not (ns / "flashinfer" / "autotune_configs.json").exists()
    assert rig.namespaces() == []


@dataclass
class Warm:
    rig: TuneRig
    plan: Path
    result: subprocess.CompletedProcess[str]
    # after it: `verify STORE`, `--format json doctor` and `... doctor --finalize unfused`
    checks: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    @property
    def doc(self) -> dict[str, Any]:
        assert self.result.returncode == 0, self.result.stderr[-3000:]
        return json.loads(self.result.stdout)  # type: ignore[no-any-return]


@dataclass
class VllmAlsoWarmed:
    """0.6.17 keys cannot say their finalize mode. After `warm --engine flashinfer` filled the
    unfused namespace (and recorded the MoE tactic counts), a vLLM warms it too, through
    `fi-cache warm --finalize unfused`; every vLLM release tunes fused, and the stand-in vLLM
    (tests/fake_vllm.py) writes the fused 0.6.17 file. Then `doctor --finalize unfused`."""

    store: Path
    fused_file: Path  # what the stand-in vLLM wrote into the unfused namespace
    warm: subprocess.CompletedProcess[str]
    doctor: subprocess.CompletedProcess[str]  # JSON

    def findings(self, under: str) -> list[dict[str, Any]]:
        """stale-gemm2-profile findings for the unfused namespace's `under` dir."""
        ns = _ns_dir(self.store, "0.6.17", "unfused")
        return [
            f
            for f in json.loads(self.doctor.stdout)["findings"]
            if f["check"] == "stale-gemm2-profile" and f["path"].startswith(f"{ns / under}/")
        ]


@dataclass
class Warms:
    by_version: dict[str, Warm] = field(default_factory=dict)
    no_gpu: Warm | None = None  # the real child, 0.6.18, with an nvidia-smi that lists nothing
    again: Warm | None = None  # 0.6.17 warmed again, --finalize unfused, in a copy of its store
    vllm_also: VllmAlsoWarmed | None = None  # 0.6.17, in another copy

    def get(self, version: str) -> Warm:
        flashinfer_dir(version)  # skips (or fails under scripts/test.sh) without this version
        return self.by_version[version]


def _again(root: Path, first: Warm) -> Warm:
    rig = TuneRig(root, root / "store", first.rig.env)
    shutil.copytree(first.rig.store, rig.store)
    args = ("warm", "--engine", "flashinfer", "--plan", first.plan, "--finalize", "unfused")
    return Warm(rig, first.plan, rig.run(*args))


def _vllm_also(root: Path, first: Warm) -> VllmAlsoWarmed:
    store = root / "store"
    shutil.copytree(first.rig.store, store)
    fused_file = _ns_dir(store, "0.6.17", "fused") / "flashinfer" / "autotune_configs.json"
    vllm = write_script(root / "vllm", f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n')
    rig = TuneRig(root, store, first.rig.env)
    warm = rig.run(
        "warm",
        "--finalize",
        "unfused",
        "--",
        "Qwen/Qwen3-30B-A3B",
        FI_CACHE_VLLM=str(vllm),
        FAKE_VLLM_CACHE_SOURCE=str(fused_file),
    )
    doctor = rig.run("--format", "json", "doctor", "--finalize", "unfused")
    return VllmAlsoWarmed(store, fused_file, warm, doctor)


def _warm_all(base: Path) -> Warms:
    """In parallel: `warm --engine flashinfer --plan` per installed version, then what looks at
    its store (0.6.17's store also copied, warmed again, and warmed by a vLLM); and the
    GPU-less real child."""
    versions = [v for v in FI_VERSIONS if v in FLASHINFER_INSTALLS]
    python = _tune_python(base)
    out = Warms()

    def warm(version: str) -> None:
        rig = TuneRig.make(base / version, version=version, python=python)
        plan = rig.plan()
        result = rig.run("--format", "json", "warm", "--engine", "flashinfer", "--plan", plan)
        first = out.by_version[version] = Warm(rig, plan, result)
        if result.returncode != 0:
            return
        # doctor's target: the H200 the child reported (see seed_flashinfer_probe)
        seed_flashinfer_probe(rig.store, rig.env, h200_metadata(version))
        with ThreadPoolExecutor(3) as pool:
            if version == "0.6.17":
                again = pool.submit(_again, base / "again", first)
                also = pool.submit(_vllm_also, base / "vllm-also", first)
            checks = {
                "verify": rig.job("verify", rig.store),
                "doctor": rig.job("--format", "json", "doctor"),
                "doctor-unfused": rig.job("--format", "json", "doctor", "--finalize", "unfused"),
            }
            first.checks = dict(zip(checks, run_parallel(*checks.values()), strict=True))
            if version == "0.6.17":
                out.again, out.vllm_also = again.result(), also.result()

    def no_gpu() -> None:
        rig = TuneRig.make(base / "no-gpu", version="0.6.18", gpus=())
        plan = rig.plan()
        out.no_gpu = Warm(rig, plan, rig.run("warm", "--engine", "flashinfer", "--plan", plan))

    tasks = [partial(warm, v) for v in versions]
    if "0.6.18" in versions:
        tasks.append(no_gpu)
    with ThreadPoolExecutor(len(tasks) or 1) as pool:
        for done in [pool.submit(t) for t in tasks]:
            done.result()
    return out


@pytest.fixture(scope="module", autouse=True)
def _warming(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Future[Warms] | None]:
    """Start the shared warms when the module starts (if a selected test needs them), so that
    the tests before them, each a short `fi-cache` process, run meanwhile."""

    def warm_all() -> Warms:
        return _warm_all(tmp_path_factory.mktemp("tuning-cli"))  # only when a test needs it

    yield from start_if_needed(request, "warms", warm_all)


@pytest.fixture(scope="module")
def warms(_warming: Future[Warms] | None) -> Warms:
    assert _warming is not None
    return _warming.result()


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_warm_fills_one_namespace_per_finalize_mode(warms: Warms, version: str) -> None:
    warm = warms.get(version)
    doc = warm.doc  # one JSON document on stdout
    assert doc["engine"] == "flashinfer" and doc["plan"] == str(warm.plan)
    assert [n["finalize"] for n in doc["namespaces"]] == list(MODES)
    store = warm.rig.store
    assert warm.rig.namespaces() == sorted(_ns_dir(store, version, m) for m in MODES)
    for ns, mode in zip(doc["namespaces"], MODES, strict=True):
        ns_dir = _ns_dir(store, version, mode)
        assert ns["namespace"] == str(ns_dir)
        assert ns["file"] == str(ns_dir / "flashinfer" / "autotune_configs.json")
        saved = json.loads(Path(ns["file"]).read_text())
        assert saved["_metadata"] == h200_metadata(version)
        assert ns["entries"] == ENTRIES == len([k for k in saved if not k.startswith("_")])
        assert ns["size"] == Path(ns["file"]).stat().st_size
        assert ns["calls"] == 4 and ns["flashinfer_version"] == version
        assert ns["tactic_counts"] == COUNTS
    # The human progress lines went to stderr, one per call (and one per bucket of a call that
    # is quiet for 10 s, which a loaded machine may see).
    lines = warm.result.stderr.splitlines()
    assert len([x for x in lines if x.startswith("[tune ") and "bucket" not in x]) == 8


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_each_manifest_records_the_flashinfer_warm(warms: Warms, version: str) -> None:
    warm = warms.get(version)
    assert warm.result.returncode == 0, warm.result.stderr[-3000:]
    for mode in MODES:
        ns_dir = _ns_dir(warm.rig.store, version, mode)
        raw = _manifest(ns_dir)
        assert raw["tactic_counts"] == COUNTS
        m = manifests.load(ns_dir)
        assert m is not None and m.finalize == mode
        assert m.fingerprint == Fingerprint.from_metadata(h200_metadata(version), "90a")
        [w] = m.warms
        assert w.engine == "flashinfer" and w.ok and w.vllm_version is None
        assert w.argv == ["--plan", str(warm.plan)]
        assert w.argv_key == plan_key(PLAN, mode)
        assert w.supports_finalize_env is True  # FlashInfer got the mode directly
        [f] = w.files
        assert (f.path, f.entries) == ("flashinfer/autotune_configs.json", ENTRIES)


@pytest.mark.flashinfer
@pytest.mark.parametrize("version", FI_VERSIONS)
def test_verify_and_doctor_accept_the_warmed_store(warms: Warms, version: str) -> None:
    warm = warms.get(version)
    assert warm.result.returncode == 0, warm.result.stderr[-3000:]
    verify = warm.checks["verify"]
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "2 ok, 0 with problems" in verify.stdout
    doctor = warm.checks["doctor"]
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    # The target is the H200 the child reported: doctor looked at the fused namespace.
    assert report["target"]["gpu"] == "NVIDIA H200" and report["target"]["finalize"] == "fused"
    assert report["findings"] == []
    unfused = warm.checks["doctor-unfused"]
    assert unfused.returncode == 0, unfused.stdout + unfused.stderr
    # Only that no vLLM is installed here to say whether it reads the finalize variable.
    assert [f["check"] for f in json.loads(unfused.stdout)["findings"]] == ["finalize-unsupported"]


@pytest.mark.flashinfer
def test_warming_again_appends_a_warm_and_touches_only_the_asked_mode(warms: Warms) -> None:
    first = warms.get("0.6.17")
    again = warms.again
    assert again is not None and again.result.returncode == 0, again.result.stderr[-3000:]
    assert "unfused finalize: 4 calls" in again.result.stderr
    assert again.result.stderr.count("[tune ") == 4  # the unfused child's calls only
    assert "fi-cache: fused finalize" not in again.result.stderr
    unfused = _manifest(_ns_dir(again.rig.store, "0.6.17", "unfused"))
    w1, w2 = unfused["warms"]
    assert w1["argv_key"] == w2["argv_key"] == plan_key(PLAN, "unfused")
    assert w1["files"][0]["entries"] == w2["files"][0]["entries"] == ENTRIES
    assert w2["started"] > w1["started"]
    # The fused namespace is exactly as the first warm left it.
    for name in ("manifest.json", "flashinfer/autotune_configs.json"):
        before = _ns_dir(first.rig.store, "0.6.17", "fused") / name
        after = _ns_dir(again.rig.store, "0.6.17", "fused") / name
        assert after.read_bytes() == before.read_bytes(), name


@pytest.fixture
def vllm_also_warmed(warms: Warms) -> VllmAlsoWarmed:
    warms.get("0.6.17")
    assert warms.vllm_also is not None
    assert warms.vllm_also.warm.returncode == 0, warms.vllm_also.warm.stderr
    return warms.vllm_also


@pytest.mark.flashinfer
def test_doctor_splits_stale_gemm2_ids_with_the_recorded_tactic_counts(
    vllm_also_warmed: VllmAlsoWarmed,
) -> None:
    """The ids past the unfused list (g1 + g2 unfused = 45 + 36) crash start-up; doctor counts
    them exactly, from the tactic counts the flashinfer warm recorded in the manifest."""
    w = vllm_also_warmed
    ids = [v[1] for k, v in json.loads(w.fused_file.read_text()).items() if "gemm2" in k]
    crash = sum(t >= 45 + 36 for t in ids)
    assert 0 < crash < len(ids)  # the stand-in's timings pick some of each, deterministically
    assert w.doctor.returncode == 1, w.doctor.stdout + w.doctor.stderr
    [finding] = w.findings("vllm")
    assert finding["severity"] == "error"
    assert (
        f"{crash} are beyond the unfused list (ids < 81) and crash start-up, "
        f"{len(ids) - crash} silently pick another kernel" in finding["message"]
    )


@pytest.mark.flashinfer
def test_doctor_trusts_the_unfused_file_flashinfer_tuned_next_to_a_vllm_warm(
    vllm_also_warmed: VllmAlsoWarmed,
) -> None:
    """The flashinfer/ file was tuned by FlashInfer told `use_fused_finalize=False` (its GEMM2
    ids are all below 81); the vLLM warm wrote only under vllm/."""
    assert vllm_also_warmed.findings("flashinfer") == []


@pytest.mark.flashinfer
def test_no_gpu_the_real_child_refuses_and_no_namespace_is_made(warms: Warms) -> None:
    flashinfer_dir("0.6.18")
    warm = warms.no_gpu
    assert warm is not None
    p = warm.result
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.splitlines()[-1]
    assert last.startswith("fi-cache: torch has no CUDA"), p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert not (warm.rig.store / NAMESPACES_DIR).exists()


SLOW_CHILD = """\
import json, os, shutil, sys, time
job = json.loads(sys.stdin.readline())
meta = json.loads(os.environ["FAKE_CHILD_METADATA"])
about = {"flashinfer_version": meta["flashinfer_version"], "device": "NVIDIA H200", "cc": 90,
         "metadata": meta}
record = os.environ["FAKE_CHILD_RECORD"]
def note(what):
    with open(record, "a") as f:
        f.write(f"{job.get('stage', 'tune')} {what} {os.getpid()} {time.time()}\\n")
note("start")
time.sleep(0.5)  # "using the GPU"
if job.get("stage") == "check":
    note("end")
    print(json.dumps({"event": "checked", **about}), flush=True)
    sys.exit(0)
print(json.dumps({"event": "ready", **about}), flush=True)
cache = json.loads(sys.stdin.readline())["cache"]
shutil.copyfile(os.environ["FAKE_CHILD_CACHE"], cache)
note("end")
print(json.dumps({"event": "done", "seconds": 0.5, "save_seconds": 0.0}), flush=True)
"""


def _fake_child_rig(tmp_path: Path, source: str) -> tuple[TuneRig, Path, dict[str, str]]:
    """A rig whose tuning child is `source` (SLOW_CHILD or a variant); the file where the child
    records its stages; the environment that stamps the H200's metadata and copies the real
    H200 file as "what it tuned"."""
    child = tmp_path / "fake_child.py"
    child.write_text(source)
    python = write_script(tmp_path / "python", f'#!/bin/sh\nexec "{sys.executable}" "{child}"\n')
    record = tmp_path / "record.txt"
    env = {
        "FAKE_CHILD_METADATA": json.dumps(h200_metadata("0.6.18")),
        "FAKE_CHILD_RECORD": str(record),
        "FAKE_CHILD_CACHE": str(
            ROOT / "tests/fixtures/h200-tuned/fi-0.6.18/flashinfer/autotune_configs.json"
        ),
    }
    return TuneRig.make(tmp_path, python=python), record, env


def test_two_warms_on_one_gpu_take_turns(tmp_path: Path) -> None:
    """Tuning measures kernel times: two warms sharing a GPU (and a store) must not overlap,
    even into different namespaces (here: one fused, one unfused)."""
    rig, record, env = _fake_child_rig(tmp_path, SLOW_CHILD)
    fused = rig.job(
        "warm", "--engine", "flashinfer", "--finalize", "fused", "--plan", rig.plan(), **env
    )
    unfused = rig.job(
        "warm", "--engine", "flashinfer", "--finalize", "unfused", "--plan", rig.plan(), **env
    )
    a, b = run_parallel(fused, unfused)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "waiting for the GPU: " in a.stderr + b.stderr
    spans: dict[str, list[float]] = {}
    for line in record.read_text().splitlines():
        _stage, _what, pid, t = line.split()
        spans.setdefault(pid, []).append(float(t))
    windows = sorted((min(ts), max(ts)) for ts in spans.values())
    assert len(windows) == 4  # a check child and a tuning child per warm
    # No child starts before the previous one (of either warm) has ended.
    for first, second in itertools.pairwise(windows):
        assert first[1] <= second[0], windows


FUSED_ONLY_MOE = """
[[ops]]
op = "cutlass_fused_moe"
hidden_size = 512
intermediate_size = 128
num_experts = 8
top_k = 2
finalize = ["fused"]
"""


@pytest.mark.parametrize(
    "extra, advice",
    [
        ("", "--finalize unfused"),
        # --finalize unfused would be refused: an op lists fused only.
        (FUSED_ONLY_MOE, "the same plan (tuned shapes are cached)"),
    ],
    ids=["both-modes", "an-op-fused-only"],
)
def test_an_interrupt_says_which_modes_were_recorded(
    tmp_path: Path, extra: str, advice: str
) -> None:
    """SIGTERM (or Ctrl-C) while the second mode tunes: the first mode's warm is on disk and
    the user is told so, and how to tune the other."""
    import signal
    import time

    # The unfused child hangs once it has the cache path: "tuning" until it is stopped.
    hanging = SLOW_CHILD.replace(
        'cache = json.loads(sys.stdin.readline())["cache"]\n',
        'cache = json.loads(sys.stdin.readline())["cache"]\n'
        'if job["mode"] == "unfused":\n    note("hang"); time.sleep(300)\n',
    )
    rig, record, env = _fake_child_rig(tmp_path, hanging)
    env["FI_CACHE_STOP_GRACE"] = "2"
    job = rig.job("warm", "--engine", "flashinfer", "--plan", rig.plan(PLAN + extra), **env)
    proc = subprocess.Popen(**job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while " hang " not in (record.read_text() if record.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    fused, unfused = (_ns_dir(rig.store, "0.6.18", m) for m in MODES)
    assert f"fused finalize was tuned and recorded before the interrupt: {fused}" in err
    assert f"unfused finalize not tuned: run again with {advice}" in err
    assert err.splitlines()[-1] == "fi-cache: interrupted" and "Traceback" not in err
    assert [w["engine"] for w in _manifest(fused)["warms"]] == ["flashinfer"]
    assert not (unfused / "manifest.json").exists()


def _status_lines(
    events: list[tuple[float, dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """What a log (no terminal) shows for `events`, each at its second on a fake clock that
    starts at 0 with fi-cache (the check child and imports come before the first call)."""
    from fi_cache.cli.warm_flashinfer import _TuneStatus

    now = [0.0]
    status = _TuneStatus(quiet=False, clock=lambda: now[0])
    status.tty = False
    for at, e in events:
        now[0] = at
        status.call(e)
    return capsys.readouterr().err.splitlines()


_MOE_CALL = [
    {
        "event": "call",
        "i": 3,
        "n": 4,
        "op": "cutlass_fused_moe bf16 h=256 i=128 e=8 top_k=2",
        "backend": "cutlass, fused finalize",
        "tokens": 1,
    },
    {"event": "bucket", "i": 3, "step": 1, "total": 3, "bucket": 1},
    {"event": "bucket", "i": 3, "step": 2, "total": 3, "bucket": 2},
    {"event": "bucket", "i": 3, "step": 3, "total": 3, "bucket": 4},
    {"event": "called", "i": 3, "seconds": 61.5},
]


LINE = (
    "[tune 3/4] cutlass_fused_moe bf16 h=256 i=128 e=8 top_k=2 [cutlass, fused finalize] 1 tokens"
)


def test_a_log_shows_one_line_per_quick_call(capsys: pytest.CaptureFixture[str]) -> None:
    """A call that starts 30 s in (imports, the check child) but runs 5 s: one line."""
    timed = list(zip([30.0, 31.0, 32.0, 33.0, 35.0], _MOE_CALL, strict=True))
    assert _status_lines(timed, capsys) == [f"{LINE} 61.50s"]


def test_a_log_shows_the_bucket_of_a_call_that_has_been_quiet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A MoE call tunes every bucket at once: a log shows where it is every 10 s or more."""
    timed = list(zip([30.0, 35.0, 41.0, 45.0, 92.0], _MOE_CALL, strict=True))
    assert _status_lines(timed, capsys) == [
        f"{LINE} bucket 2 (2/3) …",
        f"{LINE} 61.50s",
    ]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_fifo_or_device_as_the_plan_is_refused_at_once(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, kind: str
) -> None:
    plan = Path(kind) if kind.startswith("/") else tmp_path / "plan.toml"
    if kind == "fifo":
        os.mkfifo(plan)
    with no_hang():
        r = run("warm", "--engine", "flashinfer", "--plan", plan)
    assert r.code == 2 and r.err.startswith(f"fi-cache: {plan}: is a "), r.err
    assert r.err.count("\n") == 1
