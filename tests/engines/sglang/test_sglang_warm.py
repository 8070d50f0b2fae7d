"""`warm --engine sglang` and `serve --engine sglang` in real processes, against the STAND-IN
SGLang server (tests/engines/sglang/standin_sglang.py: SGLang's own environ.py and cache-path
code from its 0.5.18 / 0.5.23 wheels, FlashInfer's real autotuner writing the rank file; SGLang
has no CPU build to run). A fake nvidia-smi reports an H200."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.server import free_port, health_ok
from tests.conftest import (
    FLASHINFER_INSTALLS,
    H200_ROW,
    ROOT,
    fake_gpu_bin,
    flashinfer_dir,
    one_line,
)
from tests.sglang_rig import sglang_venv

MODEL = ["--model-path", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass"]
PINS = {"0.5.23": "0.6.18", "0.5.18": "0.6.17"}  # 0.5.23 pins FlashInfer 0.7.2: see the rig's doc


class Rig:
    """A store, a HOME (the user's ~/.cache/sglang), a PATH with a fake nvidia-smi, and one
    stand-in SGLang venv."""

    def __init__(self, root: Path, sglang: Path) -> None:
        self.root, self.sglang = root, sglang
        self.store, self.home, self.report = root / "store", root / "home", root / "report.jsonl"
        self.home.mkdir(parents=True, exist_ok=True)
        gpu = fake_gpu_bin(root / "bin", H200_ROW)
        theirs = ("SGLANG_", "FI_CACHE_", "TRITON_", "VLLM_FLASHINFER_")
        keep = {k: v for k, v in os.environ.items() if not k.startswith(theirs)}
        self.env = {
            **keep,
            "HOME": str(self.home),
            "PYTHONPATH": str(ROOT),
            "PATH": f"{gpu}{os.pathsep}{os.environ['PATH']}",
            "FI_CACHE_STANDIN_REPORT": str(self.report),
            "FI_CACHE_STOP_GRACE": "2",
        }

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "fi_cache", "--store", str(self.store), *args]

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            env={**self.env, **env},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def warm(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(
            "--format",
            "json",
            "warm",
            "--engine",
            "sglang",
            "--sglang",
            str(self.sglang),
            *args,
            **env,
        )

    def starts(self) -> list[dict[str, Any]]:
        """What each stand-in start saw (its report lines)."""
        if not self.report.exists():
            return []
        return [json.loads(line) for line in self.report.read_text().splitlines()]


def _rig(tmp_path: Path, version: str) -> Rig:
    fi = flashinfer_dir(PINS[version])
    venv = tmp_path / f"sglang-{version}"
    return Rig(tmp_path / "rig", sglang_venv(venv, version, fi))


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return _rig(tmp_path, "0.5.23")


def test_warm_fills_the_namespace_the_release_default_names(rig: Rig) -> None:
    p = rig.warm(*MODEL)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["finalize"] == "unfused"  # SGLang 0.5.23's default, said on stderr
    assert "SGLang 0.5.23 runs unfused finalize by default" in p.stderr
    [f] = doc["files"]
    rank = Path(f["path"])
    assert rank.name == "rank_tp0_pp0_dp0.json" and f["entries"] > 0
    ns_cache = Path(doc["namespace"]) / "sglang"
    # SGLang's own path code put it under the namespace's SGLANG_CACHE_DIR, FlashInfer wrote it
    assert rank.relative_to(ns_cache / "flashinfer" / "autotune" / "0.6.18" / "sm90")
    [start] = rig.starts()
    assert start["env"]["SGLANG_CACHE_DIR"] == str(ns_cache)
    assert start["env"]["SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"
    assert start["fused"] is False
    keys = [k for k in json.loads(rank.read_text()) if not k.startswith("_")]
    assert keys and all("False" in k for k in keys if "fused_moe" in k)  # 0.6.18 keys: the mode


def test_the_users_other_sglang_caches_stay_where_they_were(rig: Rig) -> None:
    p = rig.warm(*MODEL)
    assert p.returncode == 0, p.stderr
    theirs = rig.home / ".cache" / "sglang"
    [start] = rig.starts()
    # Triton's dir is SGLang's own default, a link into theirs (a diffusion worker re-points it)
    assert Path(start["env"]["TRITON_CACHE_DIR"]).resolve() == (theirs / "triton").resolve()
    assert start["env"]["FLASHINFER_WORKSPACE_BASE"] == str(theirs)  # FlashInfer's JIT cache
    assert start["env"]["SGLANG_DG_CACHE_DIR"] == str(theirs / "deep_gemm")
    assert (theirs / "triton" / "standin-kernel.txt").exists()  # Triton wrote where it always did
    link = Path(json.loads(p.stdout)["namespace"]) / "sglang" / "torch_compile_cache"
    assert link.is_symlink() and link.resolve() == (theirs / "torch_compile_cache").resolve()
    assert "kept in" in p.stderr and "TRITON_CACHE_DIR" in p.stderr  # and it says so


def test_the_two_finalize_modes_never_share_a_rank_file(rig: Rig) -> None:
    unfused, fused = rig.warm(*MODEL), rig.warm("--finalize", "fused", *MODEL)
    assert unfused.returncode == 0 and fused.returncode == 0, fused.stderr
    a, b = json.loads(unfused.stdout), json.loads(fused.stdout)
    assert a["namespace"] != b["namespace"]
    assert a["files"][0]["path"] != b["files"][0]["path"]
    assert [s["env"]["SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"] for s in rig.starts()] == ["0", "1"]


def test_a_second_start_reads_the_rank_file_the_warm_left(rig: Rig) -> None:
    assert rig.warm(*MODEL).returncode == 0
    already = rig.warm(*MODEL)  # warmed with these arguments: nothing starts
    assert already.returncode == 0 and json.loads(already.stdout)["already"] is True
    assert len(rig.starts()) == 1
    again = rig.warm("--again", *MODEL)
    assert again.returncode == 0, again.stderr
    first, second = rig.starts()
    assert second["files"][0]["path"] == first["files"][0]["path"]
    assert second["files"][0]["existed"] is True and second["files"][0]["profiled"] == 0
    # 0.5.21+'s own context saves at every start (flashinfer_autotune.py 0.5.23:366-367)
    assert second["files"][0]["rewritten"] is True


def test_deterministic_inference_tunes_nothing_and_still_starts(rig: Rig) -> None:
    p = rig.warm(*MODEL, "--enable-deterministic-inference")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["finalize"] == "unfused" and doc["files"] == []
    assert "skips FlashInfer autotuning" in doc["nothing_to_tune"]
    [start] = rig.starts()
    assert start["tuned"] is False  # SGLang started, and tuned nothing


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["--finalize", "fused", *MODEL, "--enable-deterministic-inference"],
            {},
            "--enable-deterministic-inference asks SGLang for unfused finalize",
        ),
        (
            MODEL,
            {"SGLANG_FLASHINFER_MOE_FUSED_FINALIZE": "maybe"},
            "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE='maybe'",
        ),
        (["--moe-runner-backend", "flashinfer_cutlass"], {}, "no model in the SGLang arguments"),
        (["--model-path", "M", "--tp-size", "two"], {}, "--tp-size 'two' is not a positive"),
        (["--model-path", "M", "--nnodes", "2"], {}, "--nnodes 2 starts only when every node"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_in_the_store(
    rig: Rig, args: list[str], env: dict[str, str], said: str
) -> None:
    p = rig.warm(*args, **env)
    assert p.returncode == 2
    assert said in one_line(p)
    assert not rig.store.exists() or not any((rig.store / "namespaces").rglob("*"))
    assert rig.starts() == []


def test_an_unknown_release_is_refused_before_anything_starts(rig: Rig, tmp_path: Path) -> None:
    wrapper = tmp_path / "wrap" / "sglang"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {rig.sglang} "$@"\n')
    wrapper.chmod(0o755)
    p = rig.run("warm", "--engine", "sglang", "--sglang", str(wrapper), *MODEL)
    assert p.returncode == 2
    assert "cannot tell which SGLang release" in one_line(p)
    assert rig.starts() == [] and not (rig.store / "namespaces").exists()


def test_a_release_without_a_cache_has_nothing_to_warm(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "rig", sglang_venv(tmp_path / "old", "0.5.11", None))
    p = rig.run("warm", "--engine", "sglang", "--sglang", str(rig.sglang), *MODEL)
    assert p.returncode == 2
    assert "SGLang 0.5.11 keeps no FlashInfer autotune cache" in one_line(p)
    assert not (rig.store / "namespaces").exists()


def test_a_launch_that_fails_is_named_with_sglangs_words(rig: Rig) -> None:
    p = rig.warm(*MODEL, "--no-such-flag")
    assert p.returncode == 1  # a warm that failed (docs/serving.md, exit codes)
    assert "unrecognized arguments: --no-such-flag" in p.stderr  # SGLang's parser said it
    assert (
        p.stderr.strip()
        .splitlines()[-1]
        .endswith("SGLang exited with code 2 before it was healthy")
    )
    manifests = list((rig.store / "namespaces").rglob("manifest.json"))
    assert manifests == []  # no warm recorded
    assert list((rig.store / "namespaces").rglob("sglang")) == []  # nor its empty dir and links
    assert (rig.home / ".cache" / "sglang" / "torch_compile_cache").is_dir()  # theirs stays


@pytest.mark.skipif(
    "0.6.17" not in FLASHINFER_INSTALLS and not os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"),
    reason="FlashInfer 0.6.17 not installed",
)
def test_0_5_18_defaults_to_fused_and_reads_the_variable(tmp_path: Path) -> None:
    rig = _rig(tmp_path, "0.5.18")
    fused, unfused = rig.warm(*MODEL), rig.warm("--finalize", "unfused", *MODEL)
    assert fused.returncode == 0 and unfused.returncode == 0, unfused.stderr
    assert json.loads(fused.stdout)["finalize"] == "fused"
    assert [s["fused"] for s in rig.starts()] == [True, False]
    # FlashInfer 0.6.17's keys do not carry the mode: only the namespaces keep them apart
    a, b = (json.loads(p.stdout)["files"][0]["path"] for p in (fused, unfused))
    assert a != b and Path(a).name == Path(b).name == "rank_tp0_pp0_dp0.json"
    assert rig.warm("--again", *MODEL).returncode == 0  # 0.5.18 saves only what is new
    assert (
        rig.starts()[-1]["files"][0] | {"profiled": 0, "rewritten": False}
        == (rig.starts()[-1]["files"][0])
    )


def _serve(rig: Rig, port: int, *args: str) -> subprocess.Popen[str]:
    argv = rig.argv(
        "--format",
        "json",
        "serve",
        "--engine",
        "sglang",
        "--sglang",
        str(rig.sglang),
        *args,
        "--port",
        str(port),
    )
    return subprocess.Popen(
        argv, env=rig.env, cwd=rig.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _until_healthy(proc: subprocess.Popen[str], port: int, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not health_ok(port):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "serve never became healthy"
        time.sleep(0.3)


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("backend", "warned"), [("flashinfer_cutlass", False), ("flashinfer_megamoe", True)]
)
def test_serve_warms_a_cold_namespace_then_execs_sglang_on_it(
    rig: Rig, backend: str, warned: bool
) -> None:
    args = ["--model-path", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", backend]
    port = free_port()
    first = _serve(rig, port, *args)
    try:
        _until_healthy(first, port)
        # Warm now: a second serve starts SGLang once, with no warm first. On the same GPUs and
        # namespace it is told about the first one when MegaMoE makes that a problem.
        port2 = free_port()
        second = _serve(rig, port2, *args)
        try:
            _until_healthy(second, port2)
        finally:
            out2, err2 = _stop(second)
    finally:
        out, err = _stop(first)
    assert first.returncode == 0, err  # SGLang's exit code is serve's
    doc = json.loads(out)
    assert doc["engine"] == "sglang" and doc["warm"]["files"]
    _, served, again = rig.starts()
    assert served["env"]["SGLANG_CACHE_DIR"] == doc["cache_dir"]
    assert served["files"][0]["existed"] is True  # the served start read what the warm wrote
    assert json.loads(out2)["warm"] is None and again["files"][0]["existed"] is True
    said = f"SGLang pid {first.pid} already serves from {doc['cache_dir']}" in err2
    assert said is warned, err2
    if backend == "flashinfer_megamoe":  # SGLang 0.5.23 names MegaMoE files by the GPU
        assert "_gpu" in Path(doc["warm"]["files"][0]["path"]).name


def test_serve_with_sglangs_default_backend_tunes_nothing_and_serves(rig: Rig) -> None:
    port = free_port()
    proc = _serve(rig, port, "--model-path", "Qwen/Qwen3-8B")  # backend auto: no FlashInfer MoE
    try:
        _until_healthy(proc, port)
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 0, err
    assert "wrote no autotune file" in err
    assert json.loads(out)["warm"]["files"] == []
    warm = rig.warm("--model-path", "Qwen/Qwen3-8B")
    assert warm.returncode == 0
    assert "wrote no autotune file" in json.loads(warm.stdout)["nothing_to_tune"]


def test_show_names_what_the_deployment_hash_covers_and_the_warm_that_made_it(rig: Rig) -> None:
    p = rig.warm(*MODEL)
    assert p.returncode == 0, p.stderr
    rank = Path(json.loads(p.stdout)["files"][0]["path"])
    shown = rig.run("--format", "json", "show", str(rank))
    key = json.loads(shown.stdout)["sglang"]
    assert key["key_dir"] == rank.parent.name and "model path (as given)" in key["hashes"]
    assert key["warmed_with"] == MODEL and key["sglang_version"] == "0.5.23"
    human = rig.run("show", str(rank.parent)).stdout
    assert f"SGLang deployment {rank.parent.name}: a hash of model path" in human
    assert "warmed by fi-cache with SGLang 0.5.23: --model-path Qwen/Qwen3-30B-A3B" in human


def test_every_tp_rank_file_is_recorded_and_they_agree(rig: Rig) -> None:
    p = rig.warm(*MODEL, "--tp-size", "2")
    assert p.returncode == 0, p.stderr
    names = sorted(Path(f["path"]).name for f in json.loads(p.stdout)["files"])
    assert names == ["rank_tp0_pp0_dp0.json", "rank_tp1_pp0_dp0.json"]
    doctor = ("--format", "json", "doctor", "--sglang-version", "0.5.23")
    checks = {f["check"] for f in json.loads(rig.run(*doctor).stdout)["findings"]}
    assert "sglang-ranks-disagree" not in checks  # 0.5.19+ would delete them all otherwise
    rank1 = Path(json.loads(p.stdout)["files"][1]["path"])
    data = json.loads(rank1.read_text())
    data.pop(next(k for k in data if not k.startswith("_")))
    rank1.write_text(json.dumps(data))  # now they differ: the next SGLang start discards both
    checks = {f["check"] for f in json.loads(rig.run(*doctor).stdout)["findings"]}
    assert "sglang-ranks-disagree" in checks


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is dead for our purpose
    except OSError:
        return False


def _popen_warm(rig: Rig, **env: str) -> subprocess.Popen[str]:
    argv = rig.argv("warm", "--engine", "sglang", "--sglang", str(rig.sglang), *MODEL)

    # A shell running the tests in the background (`cmd &`) leaves SIGINT ignored, and Python
    # keeps an ignored SIGINT: give the child the default a terminal user has.
    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    return subprocess.Popen(
        argv,
        env={**rig.env, **env},
        cwd=rig.root,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_sigint,
    )


def _started(rig: Rig) -> int:
    deadline = time.monotonic() + 60
    while not rig.starts():
        assert time.monotonic() < deadline, "the stand-in never started"
        time.sleep(0.1)
    return int(rig.starts()[0]["pid"])


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_or_killed_warm_leaves_no_sglang_behind(rig: Rig, how: signal.Signals) -> None:
    proc = _popen_warm(rig, FI_CACHE_STANDIN_HANG="1")
    pid = _started(rig)
    proc.send_signal(how)
    proc.communicate(timeout=60)
    if how == signal.SIGINT:
        assert proc.returncode == 130
    deadline = time.monotonic() + 20  # SIGKILL: fi-cache's guard stops SGLang's group
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "SGLang outlived its warm"
    assert list((rig.store / "namespaces").rglob("manifest.json")) == []  # nothing recorded


def test_with_the_cache_off_sglang_writes_runs_copies_that_are_never_recorded(rig: Rig) -> None:
    p = rig.warm(*MODEL, SGLANG_FLASHINFER_AUTOTUNE_CACHE="0")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["files"] == [] and "write-only runs/" in doc["nothing_to_tune"]
    [start] = rig.starts()
    assert "/runs/" in start["files"][0]["path"]  # SGLang's own runs/ branch wrote it


def test_multi_node_serve_starts_without_a_warm_and_tunes_into_the_namespace(rig: Rig) -> None:
    port = free_port()
    proc = _serve(rig, port, *MODEL, "--nnodes", "2", "--node-rank", "0")
    try:
        _until_healthy(proc, port)
    finally:
        out, err = _stop(proc)
    doc = json.loads(out)
    assert doc["warm"] is None and "--nnodes 2: no warm first" in err
    [start] = rig.starts()  # one start: the served one, tuning into the namespace
    assert start["files"][0]["path"].startswith(doc["cache_dir"])


def test_serve_refuses_a_read_only_store_where_sglang_saves_at_every_start(
    rig: Rig, read_only: Callable[[Path], None]
) -> None:
    """SGLang 0.5.21+ saves its rank file after every autotune context and FlashInfer's save
    cannot write there: serve refuses up front, as for vLLM 0.25-0.31."""
    assert rig.warm(*MODEL).returncode == 0
    read_only(rig.store)
    p = rig.run("serve", "--engine", "sglang", "--sglang", str(rig.sglang), *MODEL)
    assert p.returncode == 2 and len(rig.starts()) == 1  # the warm's start only
    assert "SGLang 0.5.23 saves its rank file at every start" in p.stderr
    # What serve spares the user: 0.5.23's own context on that fully warm dir fails the start.
    env = {**rig.env, "SGLANG_CACHE_DIR": rig.starts()[0]["env"]["SGLANG_CACHE_DIR"]}
    direct = subprocess.run(
        [str(rig.sglang), "serve", *MODEL, "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode != 0 and "Read-only file system" in direct.stderr


def _hf_copy(rig: Rig, model: str, config: dict[str, Any]) -> Path:
    """The model's config.json in the rig's Hugging Face cache, as SGLang's first start leaves
    it (huggingface_hub's layout), and a local copy of it; returns the local dir."""
    repo = rig.home / ".cache" / "huggingface" / "hub" / ("models--" + model.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=2)
    (snap / "config.json").write_text(text)
    local = rig.root / "models" / model.split("/")[1]
    local.mkdir(parents=True, exist_ok=True)
    (local / "config.json").write_text(text)
    return local


QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "torch_dtype": "bfloat16",
    "num_experts": 128,
}


def test_the_same_model_by_its_local_path_starts_on_a_seeded_key_dir_and_tunes_nothing(
    rig: Rig,
) -> None:
    """SGLang hashes the model argument as given: the HF id and a local copy get two key dirs
    (SGLang's own key code, in the stand-in); fi-cache seeds the second from the first."""
    local = _hf_copy(rig, "Qwen/Qwen3-30B-A3B", QWEN3_MOE)
    assert rig.warm(*MODEL).returncode == 0
    p = rig.warm("--model-path", str(local), "--moe-runner-backend", "flashinfer_cutlass")
    assert p.returncode == 0, p.stderr
    first, second = rig.starts()
    [a], [b] = first["files"], second["files"]
    assert Path(a["path"]).parent != Path(b["path"]).parent  # SGLang's own key code: 2 dirs
    assert a["profiled"] > 0 and b["existed"] is True and b["profiled"] == 0
    assert b["entries"] == a["entries"]
    assert f"seeded {a['entries']} entries from 1 earlier file(s): {b['path']}" in p.stderr
    [f] = json.loads(p.stdout)["files"]
    assert f["path"] == b["path"] and f["seeded"] == a["entries"]


def test_a_tp_change_seeds_the_rank_files_the_earlier_warm_has(rig: Rig) -> None:
    _hf_copy(rig, "Qwen/Qwen3-30B-A3B", QWEN3_MOE)
    assert rig.warm(*MODEL).returncode == 0
    p = rig.warm(*MODEL, "--tp-size", "2")
    assert p.returncode == 0, p.stderr
    rank0, rank1 = rig.starts()[1]["files"]
    assert rank0["existed"] is True and rank1["existed"] is False  # tp1's name had no source
    assert "seeded" in p.stderr and rank1["profiled"] > 0


def test_without_the_models_config_here_it_says_why_it_does_not_seed(rig: Rig) -> None:
    assert rig.warm(*MODEL).returncode == 0
    p = rig.warm(*MODEL, "--tp-size", "2")
    assert p.returncode == 0, p.stderr
    assert "not seeding: no config.json of Qwen/Qwen3-30B-A3B here" in p.stderr
    assert all(f["existed"] is False for f in rig.starts()[1]["files"])
