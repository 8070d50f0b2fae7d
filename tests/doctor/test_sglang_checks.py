"""doctor's SGLang checks (fi_cache/doctor/sglang_checks.py) through the CLI: files placed where
SGLang's own path code puts them (tests/sglang_layout.py), written by real FlashInfer."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fi_cache.engines.server import free_port, health_ok
from fi_cache.engines.sglang import live
from tests.conftest import MOE_618_FUSED, ROOT, flashinfer_dir
from tests.doctor.doctor_argv import (
    JSON_DOCTOR,
    NODE_0_OF_2_TP_4,
    findings,
    sglang_serve,
    sglang_target,
    two_tp_ranks,
)
from tests.sglang_layout import sglang_paths
from tests.sglang_rig import sglang_venv


def _cutedsl_file(path: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir("0.6.18"))}
    subprocess.run(
        [sys.executable, "-m", "tests.real_flashinfer.cutedsl_writer", str(path), mode],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=180,
    )


def test_cutedsl_nvfp4_entries_are_shared_by_both_modes_on_0_6_18(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rank, _ = sglang_paths("0.5.18", tmp_path, flashinfer="0.6.18", backend="flashinfer_cutedsl")
    _cutedsl_file(rank, "fused")
    fused = rank.read_text()
    _cutedsl_file(rank, "unfused")  # an unfused start, e.g. after the upgrade to 0.5.21
    assert rank.read_text() == fused  # FlashInfer found every key: nothing was re-tuned
    r = run(*JSON_DOCTOR, *sglang_target("0.5.21", "0.6.18"), tmp_path)
    [f] = findings(r.json(), "sglang-cutedsl-mode-blind")
    assert f["path"] == str(rank) and f["details"]["entries"] == 8
    assert "do not carry the finalize mode" in f["message"] and "unfused start" in f["message"]


@pytest.mark.parametrize("fi", ["0.7.0", "0.7.2"])  # the mode is in the key from 0.7.0
def test_cutedsl_entries_in_a_0_7_flashinfer_dir_are_not_flagged(run, tmp_path: Path, fi) -> None:  # type: ignore[no-untyped-def]
    """The version gate: the file is 0.6.18's, placed where SGLang keeps FlashInfer 0.7.x's."""
    rank, _ = sglang_paths("0.5.23", tmp_path, flashinfer=fi, backend="flashinfer_cutedsl")
    _cutedsl_file(rank, "fused")
    r = run(*JSON_DOCTOR, *sglang_target("0.5.23", fi), tmp_path)
    assert findings(r.json(), "sglang-cutedsl-mode-blind") == []


def test_tp_ranks_that_differ_are_deleted_at_start_from_0_5_19(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, b = two_tp_ranks(tmp_path)
    data = json.loads(b.read_text())
    data.pop(next(k for k in data if not k.startswith("_")))  # rank 1 tuned one shape fewer
    b.write_text(json.dumps(data, indent=2))
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.19", "0.6.18"), tmp_path).json()
    [f] = findings(doc, "sglang-ranks-disagree")
    assert "deletes them all when they differ" in f["message"]
    assert f["details"]["files"] == ["rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json"]
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.18", "0.6.18"), tmp_path).json()
    assert findings(doc, "sglang-ranks-disagree") == []


def test_identical_tp_ranks_are_kept(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_tp_ranks(tmp_path)
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.23", "0.6.18"), tmp_path).json()
    assert findings(doc, "sglang-ranks-disagree") == []


def test_ranks_or_nodes_from_different_stacks_are_named(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, _ = sglang_paths("0.5.18", tmp_path / "node0", tp=2, tp_rank=0)
    b, _ = sglang_paths("0.5.18", tmp_path / "node1", tp=2, tp_rank=1)
    shutil.copy(MOE_618_FUSED, a)
    data = json.loads(MOE_618_FUSED.read_text())
    data["_metadata"]["cuda_version"] = "12.9"  # node 1 runs another CUDA
    b.write_text(json.dumps(data, indent=2))
    doc = run(
        *JSON_DOCTOR, *sglang_target("0.5.18", "0.6.18"), tmp_path / "node0", tmp_path / "node1"
    ).json()
    [f] = findings(doc, "sglang-ranks-disagree")
    assert f["details"]["fields"] == ["cuda_version"]
    assert "different environments" in f["message"]


def test_servers_are_told_apart_by_session_cache_dir_and_gpus() -> None:
    rows = [
        (
            10,
            10,
            ["/v/bin/python", "/v/bin/sglang", "serve", "--model-path", "M"],
            {"HOME": "/h", "CUDA_VISIBLE_DEVICES": "0,1"},
        ),
        (11, 10, ["sglang::scheduler_TP0"], {"HOME": "/h", "CUDA_VISIBLE_DEVICES": "0,1"}),
        (
            20,
            20,
            ["python", "-m", "sglang.launch_server", "--model-path", "M"],
            {"HOME": "/h", "CUDA_VISIBLE_DEVICES": "1"},
        ),
        (30, 30, ["python", "-m", "vllm.entrypoints.openai.api_server"], {"HOME": "/h"}),
    ]
    found = live.engines(rows)
    assert [(e.pid, e.gpus) for e in found] == [(10, "0,1"), (20, "1")]
    assert found[0].cache_dir == os.path.realpath("/h/.cache/sglang")
    mega = "flashinfer_megamoe"
    assert live.sharing(found, "/h/.cache/sglang", frozenset({"1"}), mega) == found
    assert live.sharing(found, "/h/.cache/sglang", frozenset({"1"}), "flashinfer_cutlass") == []
    assert live.sharing(found, "/h/.cache/sglang", frozenset({"2"}), mega) == []
    assert live.sharing(found, "/elsewhere", None, mega) == []
    row = (
        40,
        40,
        ["sglang", "serve", "--model-path", "M", "--moe-runner-backend", mega],
        {"HOME": "/h"},
    )
    assert live.engines([row])[0].backend == mega


def test_a_running_megamoe_sglang_on_the_same_cache_dir_and_gpus_is_named(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sglang = sglang_venv(tmp_path / "venv", "0.5.23", None)
    cache = tmp_path / "sglang-cache"
    port = free_port()
    env = {**os.environ, "SGLANG_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "0"}
    argv = [
        str(sglang),
        "serve",
        "--model-path",
        "M",
        "--port",
        str(port),
        "--moe-runner-backend",
        "flashinfer_megamoe",
        "--disable-flashinfer-autotune",
    ]
    server = subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not health_ok(port):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        monkeypatch.setenv("SGLANG_CACHE_DIR", str(cache))
        argv = [*JSON_DOCTOR, *sglang_target("0.5.23"), tmp_path / "none"]
        (tmp_path / "none").mkdir()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        [f] = findings(run(*argv).json(), "sglang-shared-cache-dir")
        assert f["details"]["pids"] == [server.pid] and "GPUs 0" in f["message"]
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # other GPUs: their own business
        assert findings(run(*argv).json(), "sglang-shared-cache-dir") == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_doctor_reads_sglangs_own_cache_dir_for_the_target_version_only(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PATHs, an SGLang target's checks read $SGLANG_CACHE_DIR/flashinfer/autotune, as
    plain `sglang serve` would; only the target's FlashInfer version dir is loaded."""
    cache = tmp_path / "sglang"
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(cache))
    ours, _ = sglang_paths("0.5.18", cache, flashinfer="0.6.18", backend="flashinfer_cutedsl")
    other, _ = sglang_paths("0.5.18", cache, flashinfer="0.6.17", backend="flashinfer_cutedsl")
    _cutedsl_file(ours, "fused")
    shutil.copy(ours, other)
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.21", "0.6.18")).json()
    assert [f["path"] for f in findings(doc, "sglang-cutedsl-mode-blind")] == [str(ours)]
    listed = run("--format", "json", "ls").json()
    rows = listed["caches"] if isinstance(listed, dict) else listed
    assert {r["path"] for r in rows} >= {str(ours), str(other)}  # ls lists SGLang's dir too


def test_an_sglang_start_that_died_on_a_gemm2_id_is_named_with_the_sglang_cure(  # type: ignore[no-untyped-def]
    run, tmp_path: Path
) -> None:
    rank = "/root/.cache/sglang/flashinfer/autotune/0.6.17/sm90/8e60e63bda689ee5/rank_tp0.json"
    log = tmp_path / "sglang.log"
    log.write_text(
        "[2026-12-01 10:00:00 TP0] Load weight end. type=Qwen3MoeForCausalLM\n"
        "2026-12-01 10:00:02,000 - INFO - autotuner.py:2789 - flashinfer.jit: [Autotuner]: "
        f"Loaded 10 configs from {rank}\n"
        "[2026-12-01 10:00:03 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: Invalid gemm2 profile id: 40\n"
    )
    doc = run(*JSON_DOCTOR, "--log", log, *sglang_target("0.5.18", "0.6.17")).json()
    [f] = findings(doc, "stale-gemm2-profile")
    assert f["severity"] == "error" and f"after loading {rank}" in f["message"]
    assert "fi-cache serve --engine sglang --deterministic" in f["fix"]


@pytest.mark.parametrize(
    "version, flashinfer, warned",
    [
        ("0.5.18", None, False),
        ("0.5.19", None, True),
        ("0.5.22", None, True),
        ("0.5.23", None, False),
        ("0.5.23", "0.6.18", True),
    ],
)
def test_tp_cutlass_moe_loses_its_cache_every_boot_where_flashinfer_keys_carry_the_rank(
    run,
    version,
    flashinfer,
    warned,  # type: ignore[no-untyped-def]
) -> None:
    """No EP: FlashInfer 0.6.18-0.7.1 (0.5.19-0.5.22's pins) key CUTLASS MoE entries by tp_rank,
    so two TP ranks' files never agree; 0.5.23's FlashInfer 0.7.2 keys carry no rank."""
    serve = sglang_serve("--tp-size 2 --moe-runner-backend flashinfer_cutlass")
    doc = run(*JSON_DOCTOR, *sglang_target(version, flashinfer), *serve).json()
    found = findings(doc, "sglang-ep-cache-discarded")
    assert bool(found) is warned
    if found:
        assert "tensor-parallel ranks' files never agree" in found[0]["message"]
        assert "fi-cache align" in found[0]["fix"]


def test_rank_keyed_tp_files_are_named_and_align_makes_sglang_keep_them(  # type: ignore[no-untyped-def]
    run, tmp_path: Path
) -> None:
    a, b = two_tp_ranks(tmp_path)
    for path, rank in ((a, 0), (b, 1)):  # each rank's own keys, as FlashInfer 0.6.18 makes them
        keyed = path.read_text().replace(", 8, 1, 0, 1, 0, 1, 0,", f", 8, 2, {rank}, 1, 0, 1, 0,")
        path.write_text(keyed)
    target, serve = sglang_target("0.5.21", "0.6.18"), sglang_serve("--tp-size 2")
    argv = [*JSON_DOCTOR, *target, tmp_path, *serve]
    [f] = findings(run(*argv).json(), "sglang-ranks-disagree")
    assert f["details"]["differs"] == ["tp1_pp0_dp0"] and "fi-cache align" in f["fix"]
    assert run("align", a.parent).code == 0
    assert a.read_bytes() == b.read_bytes()
    assert findings(run(*argv).json(), "sglang-ranks-disagree") == []


def test_another_nodes_ranks_not_given_are_said_not_to_be_known(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--tp-size 4 over two nodes: this node writes tp0 and tp1; tp2 and tp3 are node 1's."""
    two_tp_ranks(tmp_path)
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.23", "0.6.18"), tmp_path, *NODE_0_OF_2_TP_4).json()
    assert findings(doc, "sglang-ranks-disagree") == []
    [f] = findings(doc, "ranks-not-given")
    assert f["severity"] == "info" and f["details"]["ranks"] == ["tp2_pp0_dp0", "tp3_pp0_dp0"]


def test_doctor_names_this_nodes_rank_files_and_what_only_the_worker_knows(run) -> None:  # type: ignore[no-untyped-def]
    serve = sglang_serve(
        "--tp-size 4 --dp-size 2 --enable-dp-attention --nnodes 2 --node-rank 1"
        " --moe-runner-backend flashinfer_megamoe"
    )
    doc = run(*JSON_DOCTOR, *sglang_target("0.5.23"), *serve).json()
    [f] = findings(doc, "sglang-rank-files")
    assert f["details"]["node"] == ["rank_tp2_pp0_dp1.json", "rank_tp3_pp0_dp1.json"]
    assert len(f["details"]["ranks"]) == 4 and "on node 1 of 2" in f["message"]
    assert any("_gpu<uuid>" in w for w in f["details"]["on_worker"])
