"""warm and serve end to end, against tests/fake_vllm.py (a stand-in for `vllm`, not vLLM).

Each test runs `python -m fi_cache` as a real process, because what matters here is processes:
signals, process groups, locks, exit codes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fi_cache.store import locks
from fi_cache.store.namespace import NAMESPACES_DIR
from tests.conftest import (
    H200_ROW,
    MOE_617_FUSED,
    fake_gpu_bin,
    flashinfer_dir,
)
from tests.vllm_rig import FAKE, MODEL, Rig, make_rig, vllm_dist


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


def _manifest(ns: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((ns / "manifest.json").read_text())


def test_warm_passes_argv_and_env_and_records_the_warm(rig: Rig) -> None:
    p = rig.run("--format", "json", "warm", "--", MODEL, "--tensor-parallel-size", "1")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    [start] = rig.starts()
    assert start["argv"][:4] == ["serve", MODEL, "--tensor-parallel-size", "1"]
    assert start["argv"][-4:-1] == ["--host", "127.0.0.1", "--port"]
    ns = Path(doc["namespace"])
    assert start["env"]["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == str(ns / "vllm")
    assert start["env"]["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "1"
    assert doc["files"][0]["entries"] == 32 and doc["reused"] is False
    m = _manifest(ns)
    assert m["finalize"] == "fused" and len(m["warms"]) == 1
    warm = m["warms"][0]
    assert (
        warm["argv"] == [MODEL, "--tensor-parallel-size", "1"] and warm["files"][0]["entries"] == 32
    )


def test_finalize_modes_never_share_a_directory(rig: Rig) -> None:
    assert rig.run("warm", "--finalize", "fused", "--", MODEL).returncode == 0
    unfused = rig.run("warm", "--finalize", "unfused", "--", MODEL)
    assert unfused.returncode == 0, unfused.stderr
    assert "cannot inspect the vLLM package" in unfused.stderr  # no vllm dist here: warned
    fused_ns, unfused_ns = sorted(rig.namespaces(), key=lambda p: p.name)
    assert fused_ns.name.startswith("fused-") and unfused_ns.name.startswith("unfused-")
    dirs = [s["env"]["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] for s in rig.starts()]
    assert len(set(dirs)) == 2
    assert [s["env"]["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] for s in rig.starts()] == ["1", "0"]
    quiet = rig.run("-q", "warm", "--finalize", "unfused", "--", MODEL)
    assert quiet.returncode == 0 and quiet.stderr == ""  # -q: no notes, no warnings


def test_eight_concurrent_warms_start_vllm_once(rig: Rig) -> None:
    procs = [rig.popen("warm", "--", MODEL, FAKE_VLLM_TUNE_SECONDS="1.5") for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [o[1] for o in outs]
    assert len(rig.starts()) == 1
    reused = [o for o in outs if "reused the warm" in o[0]]
    assert len(reused) == 7
    assert any("waiting for warm by pid" in o[1] for o in outs)
    assert len(_manifest(rig.namespaces()[0])["warms"]) == 1


def test_a_waiting_warm_overtaken_by_other_arguments_says_so(rig: Rig) -> None:
    first = rig.popen("warm", "--", MODEL, "--max-model-len", "512", FAKE_VLLM_TUNE_SECONDS="2")
    deadline = time.monotonic() + 30
    while not rig.starts() and time.monotonic() < deadline:
        time.sleep(0.05)  # the first warm holds the lock once vLLM has started
    second = rig.run("warm", "--", MODEL)
    first.communicate(timeout=60)
    assert second.returncode == 0, second.stderr
    assert "waited for was of other arguments (" in second.stderr
    assert "--max-model-len 512): warming these now" in second.stderr
    assert len(rig.starts()) == 2


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_a_sigkilled_warm_takes_vllm_with_it_and_holds_the_lock_until_then(
    rig: Rig, strategy: str
) -> None:
    """SIGKILL reaches no handler: fi-cache's guard stops vLLM's whole group (here one that
    ignores SIGINT/SIGTERM and writes nothing after start-up, with a child of its own), and
    the namespace stays locked until it has; then the next warm goes ahead."""
    deaf = {"FAKE_VLLM_MODE": "hang", "FAKE_VLLM_IGNORE_SIGNALS": "1", "FAKE_VLLM_SPAWN_CHILD": "1"}
    first = rig.popen("warm", "--", MODEL, FI_CACHE_LOCK=strategy, FI_CACHE_STOP_GRACE="3", **deaf)
    deadline = time.time() + 30
    while not (rig.record / "child.pid").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    server, child = rig.starts()[0]["pid"], int((rig.record / "child.pid").read_text())
    blocked = rig.run("warm", "--lock-timeout", "1", "--", MODEL, FI_CACHE_LOCK=strategy)
    assert blocked.returncode == 1 and "timed out" in blocked.stderr
    assert _alive(server)  # still being stopped: the lock was not free while vLLM ran
    deadline = time.time() + 20
    while (_alive(server) or _alive(child)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(server) and not _alive(child), "vLLM outlived its killed warm"
    again = rig.run("warm", "--lock-timeout", "20", "--", MODEL, FI_CACHE_LOCK=strategy)
    assert again.returncode == 0, again.stderr
    assert len(rig.starts()) == 2


def test_ctrl_c_during_warm_stops_vllm_and_its_workers(rig: Rig) -> None:
    proc = rig.popen("warm", "--", MODEL, FAKE_VLLM_MODE="hang", FAKE_VLLM_SPAWN_CHILD="1")
    deadline = time.time() + 30
    while not (rig.record / "child.pid").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    server, child = rig.starts()[0]["pid"], int((rig.record / "child.pid").read_text())
    time.sleep(0.5)
    for pid in (server, child):
        assert not _alive(pid), f"pid {pid} survived"
    [ns] = [p.parent for p in (rig.store / NAMESPACES_DIR).rglob(locks.LOCK_NAME)]
    assert not (ns / "manifest.json").exists()  # nothing recorded, nothing half-written


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_timeout_stops_vllm_and_shows_its_last_lines(rig: Rig) -> None:
    p = rig.run("warm", "--timeout", "2", "--", MODEL, FAKE_VLLM_MODE="hang")
    assert p.returncode == 1
    assert "not healthy after 2s" in p.stderr.splitlines()[-1]
    assert "--- last" in p.stderr and "Traceback" not in p.stderr
    assert not _alive(rig.starts()[0]["pid"])


def test_a_vllm_that_ignores_sigint_and_sigterm_is_killed(rig: Rig) -> None:
    p = rig.run("warm", "--", MODEL, FAKE_VLLM_MODE="ignore-sigterm", FI_CACHE_STOP_GRACE="1")
    assert p.returncode == 0, p.stderr
    assert not _alive(rig.starts()[0]["pid"])


def test_early_exit_reports_vllm_output_and_exit_1(rig: Rig) -> None:
    p = rig.run("warm", "--", MODEL, FAKE_VLLM_MODE="crash")
    assert p.returncode == 1
    assert "Invalid gemm2 profile id: 50" in p.stderr
    assert p.stderr.splitlines()[-1] == "fi-cache: vLLM exited with code 1 before it was healthy"
    assert rig.namespaces() == []  # no manifest for a failed warm


def _gpu_host(rig: Rig, tmp_path: Path) -> dict[str, str]:
    """What a tuning start needs to be expected: an SM90 GPU (a fake nvidia-smi) and FlashInfer
    among the packages of the interpreter that runs vLLM (a dist-info, nothing to import)."""
    site = tmp_path / "site"
    meta = site / "flashinfer_python-0.6.18.dist-info"
    meta.mkdir(parents=True)
    text = "Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.18\n"
    (meta / "METADATA").write_text(text)
    bin_dir = fake_gpu_bin(tmp_path / "gpu-bin", H200_ROW)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{rig.env['PATH']}",
        "PYTHONPATH": f"{rig.env['PYTHONPATH']}{os.pathsep}{site}",
    }


def test_healthy_without_a_cache_is_a_failed_warm_where_vllm_should_tune(
    rig: Rig, tmp_path: Path
) -> None:
    p = rig.run("warm", "--", MODEL, FAKE_VLLM_NO_CACHE="1", **_gpu_host(rig, tmp_path))
    assert p.returncode == 1 and "neither wrote nor read an autotune cache" in p.stderr
    assert rig.namespaces() == []


def test_nothing_to_tune_is_a_warm_and_serve_starts_vllm_once(rig: Rig) -> None:
    """No GPU and no FlashInfer here: vLLM tunes nothing, and that is known before it starts."""
    p = rig.run("--format", "json", "warm", "--", MODEL, FAKE_VLLM_NO_CACHE="1")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["files"] == [] and "no FlashInfer installed" in doc["nothing_to_tune"]
    served = rig.run("serve", "--", MODEL, FAKE_VLLM_NO_CACHE="1", FAKE_VLLM_MODE="exit-now")
    assert served.returncode == 0, served.stderr
    assert len(rig.starts()) == 2  # the warm, then serve's exec: no second warm
    text = rig.run("warm", "--again", "--", MODEL, FAKE_VLLM_NO_CACHE="1")
    assert (text.stdout + text.stderr).count("nothing to tune") == 1  # said once, on stdout


@pytest.mark.parametrize(
    "args, env, words",
    [
        (["warm", "--", "--tensor-parallel-size", "2"], {}, "no model in the vLLM arguments"),
        (["warm", "--", MODEL], {"FI_CACHE_VLLM": "/nonexistent/vllm"}, "no vLLM executable"),
        (["serve", "--vllm", "no-such-vllm", "--", MODEL], {}, "give --vllm the vLLM executable"),
        (["warm", "--", "/no/such/model"], {}, "/no/such/model: no such model directory"),
        (["serve", "./no-such-dir", "-tp", "2"], {}, "no such model directory (vLLM would take"),
    ],
)
def test_refusals_exit_2_with_one_line(
    rig: Rig, args: list[str], env: dict[str, str], words: str
) -> None:
    """Refused before anything starts and before any other line (no detection warning first)."""
    p = rig.run(*args, **env)
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert rig.starts() == []


def test_port_in_use_is_refused(rig: Rig) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = rig.run("warm", "--port", str(port), "--", MODEL)
    assert p.returncode == 2 and f"port {port} is in use" in p.stderr


def test_lock_timeout_names_the_holder(rig: Rig) -> None:
    first = rig.run("--format", "json", "warm", "--", MODEL)
    ns = Path(json.loads(first.stdout)["namespace"])
    with locks.namespace_lock(ns, "test-holder", timeout=5):
        p = rig.run("warm", "--lock-timeout", "1", "--", MODEL)
    assert p.returncode == 1
    assert f"waiting for test-holder by pid {os.getpid()}" in p.stderr
    assert "timed out after 1s" in p.stderr.splitlines()[-1]


def test_ray_workers_get_flashinfer_variables(rig: Rig) -> None:
    p = rig.run(
        "warm",
        "--",
        MODEL,
        "--distributed-executor-backend",
        "ray",
        VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY="MY_",
    )
    assert p.returncode == 0, p.stderr
    assert rig.starts()[0]["env"]["VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"] == "MY_,FLASHINFER_"


def test_serve_warms_a_cold_namespace_then_runs_vllm_with_its_exit_code(rig: Rig) -> None:
    p = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now", FAKE_VLLM_EXIT_CODE="0")
    # exit-now never becomes healthy: the cold warm fails before serving
    assert p.returncode == 1 and "before it was healthy" in p.stderr
    assert rig.run("warm", "--", MODEL).returncode == 0
    p = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now", FAKE_VLLM_EXIT_CODE="3")
    assert p.returncode == 3
    starts = rig.starts()
    assert len(starts) == 3  # failed warm, warm, serve: no second warm for a warm namespace
    assert starts[-1]["argv"] == ["serve", MODEL]
    assert starts[-1]["env"]["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "1"


def test_serve_forwards_signals_to_vllm(rig: Rig) -> None:
    from fi_cache.engines.server import free_port

    port = str(free_port())
    assert rig.run("warm", "--", MODEL, "--port", port).returncode == 0
    proc = rig.popen("serve", "--", MODEL, "--port", port)
    deadline = time.time() + 30
    while len(rig.starts()) < 2 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 0  # the stand-in exits 0 on SIGTERM, like vLLM
    assert rig.starts()[-1]["pid"] == proc.pid  # exec: vLLM is the serve process itself


def test_serve_deterministic_uses_the_unfused_namespace(rig: Rig) -> None:
    p = rig.run("serve", "--deterministic", "--no-warm", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 0, p.stderr
    env = rig.starts()[0]["env"]
    assert env["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"
    assert "/unfused-" in env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]


def test_serve_refuses_a_stale_gemm2_cache_in_the_unfused_namespace(rig: Rig) -> None:
    # An unfused namespace whose 0.6.17 cache has no record of how it was tuned: the collision.
    p = rig.run(
        "--format",
        "json",
        "warm",
        "--finalize",
        "unfused",
        "--",
        MODEL,
        FAKE_VLLM_CACHE_SOURCE=str(MOE_617_FUSED),
    )
    ns = Path(json.loads(p.stdout)["namespace"])
    (ns / "manifest.json").unlink()
    p = rig.run("serve", "--deterministic", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 1
    assert "stale-gemm2-profile" in p.stderr and "Invalid gemm2 profile id" in p.stderr
    p = rig.run(
        "serve", "--deterministic", "--force", "--no-warm", "--", MODEL, FAKE_VLLM_MODE="exit-now"
    )
    assert p.returncode == 0


def test_serve_refuses_a_corrupt_cache(rig: Rig) -> None:
    p = rig.run("--format", "json", "warm", "--", MODEL)
    f = Path(json.loads(p.stdout)["files"][0]["path"])
    f.write_text('{"_metadata": {')
    p = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 1 and "corrupt-file" in p.stderr and "truncated" in p.stderr


def _read_only_bind(path: Path) -> bool:
    """Make `path` a read-only bind mount of itself (root with CAP_SYS_ADMIN); False if we can't.
    chmod is no test here: root writes through it."""
    ok = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, check=False)
    if ok.returncode != 0:
        return False
    ro = subprocess.run(
        ["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, check=False
    )
    if ro.returncode != 0:
        subprocess.run(["umount", str(path)], check=False)
        return False
    return True


def test_serve_works_on_a_prewarmed_read_only_store(rig: Rig) -> None:
    assert rig.run("warm", "--", MODEL).returncode == 0
    if not _read_only_bind(rig.store):
        pytest.skip("cannot make a read-only mount here (needs root with CAP_SYS_ADMIN)")
    try:
        assert not os.access(rig.store, os.W_OK) or _cannot_write(rig.store)
        p = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now", FAKE_VLLM_EXIT_CODE="0")
        assert p.returncode == 0, p.stderr
        assert len(rig.starts()) == 2
        cold = rig.run("warm", "--", "other/model")
        assert cold.returncode == 2 and "Read-only file system" in cold.stderr
        assert "Traceback" not in cold.stderr
        # vLLM 0.30 rewrites its file at every start: refused before it starts, not a crash later
        old = rig.run("serve", "--", MODEL, **vllm_dist(rig, "0.30.0"))
        assert old.returncode == 2 and "vLLM 0.30.0 writes its autotune file" in old.stderr
        assert len(rig.starts()) == 2
    finally:
        subprocess.run(["umount", str(rig.store)], check=False)


def _cannot_write(path: Path) -> bool:
    try:
        (path / "probe").write_text("x")
    except OSError:
        return True
    return False


def test_a_vllm_serve_line_runs_as_is_after_fi_cache_serve(rig: Rig) -> None:
    """`vllm serve ARGS` -> `fi-cache warm/serve ARGS`, no `--`: the same vLLM command line (and
    -q there is vLLM's --quantization, not fi-cache's quiet); global options after the name."""
    from fi_cache.engines.server import free_port

    port = str(free_port())
    p = rig.run("warm", "--format", "json", MODEL, "-tp", "1", "--max-model-len", "4096")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["reused"] is False
    p = rig.run(
        "serve",
        MODEL,
        "--port",
        port,
        "-tp",
        "1",
        "--max-model-len",
        "4096",
        FAKE_VLLM_MODE="exit-now",
    )
    assert p.returncode == 0, p.stderr
    warm, served = rig.starts()  # the warm counts: no second one
    assert warm["argv"][:6] == ["serve", MODEL, "-tp", "1", "--max-model-len", "4096"]
    assert served["argv"] == ["serve", MODEL, "--port", port, "-tp", "1", "--max-model-len", "4096"]
    p = rig.run("serve", "--no-warm", "-q", "fp8", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 0, p.stderr
    assert rig.starts()[-1]["argv"] == ["serve", "-q", "fp8", MODEL]


def test_model_given_as_model_flag_is_the_same_warm(rig: Rig) -> None:
    assert rig.run("warm", "--model", MODEL).returncode == 0
    p = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 0, p.stderr
    assert [s["argv"][1:3] for s in rig.starts()] == [["--model", MODEL], [MODEL]]  # one warm


def test_a_pasted_python_m_api_server_line_runs_that_python(rig: Rig, tmp_path: Path) -> None:
    """`python -m vllm.entrypoints.openai.api_server --model M ...` after `fi-cache serve`: that
    interpreter runs vLLM's module, for the warm and for serving, $FI_CACHE_VLLM or not."""
    shim = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    shim.mkdir(parents=True)
    for d in (shim.parent.parent, shim.parent, shim):
        (d / "__init__.py").write_text("")
    (shim / "api_server.py").write_text(
        f"import runpy, sys\nsys.argv = [{str(FAKE)!r}, 'serve', *sys.argv[1:]]\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n"
    )
    line = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL]
    env = {
        "FI_CACHE_VLLM": "/nonexistent/vllm",
        "PYTHONPATH": f"{rig.env['PYTHONPATH']}{os.pathsep}{tmp_path / 'site'}",
    }
    p = rig.run("warm", *line, **env)
    assert p.returncode == 0, p.stderr
    p = rig.run("serve", *line, "--port", "8123", FAKE_VLLM_MODE="exit-now", **env)
    assert p.returncode == 0, p.stderr
    warm, served = rig.starts()
    assert warm["argv"][:3] == served["argv"][:3] == ["serve", "--model", MODEL]
    assert served["argv"] == ["serve", "--model", MODEL, "--port", "8123"]
    p = rig.run("serve", "--vllm", str(rig.env["FI_CACHE_VLLM"]), *line)
    assert p.returncode == 2 and "name two vLLMs" in p.stderr


def test_the_users_finalize_variable_picks_the_unfused_namespace(rig: Rig) -> None:
    """VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 in the environment is --deterministic (serve) and
    --finalize unfused (warm), said in one line; never the fused namespace with =1."""
    user = {"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "0"}
    warm = rig.run("warm", MODEL, **user)
    assert warm.returncode == 0, warm.stderr
    assert (
        "VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 in the environment: unfused finalize, as "
        "--finalize unfused" in warm.stderr
    )
    served = rig.run("serve", MODEL, FAKE_VLLM_MODE="exit-now", **user)
    assert served.returncode == 0, served.stderr
    assert "as --deterministic" in served.stderr
    [ns] = rig.namespaces()
    assert ns.name.startswith("unfused-")
    assert len(rig.starts()) == 2  # serve found the unfused warm
    for start in rig.starts():
        assert start["env"]["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"
        assert start["env"]["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == str(ns / "vllm")
    refused = rig.run("serve", "--deterministic", MODEL, VLLM_FLASHINFER_MOE_FUSED_FINALIZE="1")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "asks for fused finalize and --deterministic for unfused" in refused.stderr
    assert len(rig.starts()) == 2


def test_an_undetected_environment_is_said_before_warming(rig: Rig, tmp_path: Path) -> None:
    """No GPU and no FlashInfer here: the namespace reads unknown/unknown/unknown, shared with
    every machine like that; a GPU host with FlashInfer hears nothing of it."""
    p = rig.run("warm", MODEL)
    assert p.returncode == 0, p.stderr
    [line] = [x for x in p.stderr.splitlines() if "not detected" in x]
    assert line.startswith("fi-cache: flashinfer_version, arch, gpu not detected")
    assert "namespaces/unknown/unknown/unknown/fused-" in line
    assert "shared with every machine" in line
    quiet = rig.run("--quiet", "warm", MODEL)
    assert "not detected" not in quiet.stderr
    gpu = rig.run("warm", MODEL, **_gpu_host(rig, tmp_path))
    assert gpu.returncode == 0, gpu.stderr
    assert "not detected" not in gpu.stderr


def test_prune_leaves_the_namespace_of_a_running_server_alone(rig: Rig) -> None:
    from fi_cache.engines.server import free_port

    port = str(free_port())
    assert rig.run("warm", "--", MODEL, "--port", port).returncode == 0
    [ns] = rig.namespaces()
    proc = rig.popen("serve", "--", MODEL, "--port", port)
    deadline = time.time() + 30
    while len(rig.starts()) < 2 and time.time() < deadline:
        time.sleep(0.1)
    try:
        p = rig.run("--format", "json", "prune", "--older-than", "0s", "--yes")
        assert p.returncode == 0, p.stderr
        assert ns.is_dir(), "a served namespace must survive prune"
        assert [s["path"] for s in json.loads(p.stdout)["skipped_locked"]] != []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    p = rig.run("--format", "json", "prune", "--older-than", "0s", "--yes")
    assert p.returncode == 0 and not ns.exists()


def test_warmed_files_get_the_read_access_of_the_store(rig: Rig) -> None:
    rig.store.mkdir(mode=0o755)
    rig.store.chmod(0o755)
    p = rig.run("--format", "json", "warm", "--", MODEL)
    [f] = json.loads(p.stdout)["files"]
    assert Path(f["path"]).stat().st_mode & 0o777 == 0o644  # vLLM wrote it 0600
    private_store = rig.store.parent / "private"
    private_store.mkdir(mode=0o700)
    private_store.chmod(0o700)
    private = rig.run("--store", str(private_store), "--format", "json", "warm", "--", MODEL)
    [g] = json.loads(private.stdout)["files"]
    assert Path(g["path"]).stat().st_mode & 0o777 == 0o600


def test_a_v2_store_is_warm_and_the_second_serve_starts_vllm_once(rig: Rig) -> None:
    """vLLM 0.33 with one rank keeps FlashInfer's v2 store in the override dir, here written by
    the real FlashInfer 0.7.2.post1 (the stand-in vLLM calls FlashInfer's own v2 writer)."""
    fi = flashinfer_dir("0.7.2.post1")
    env = {"FAKE_VLLM_V2": "1", "PYTHONPATH": f"{rig.env['PYTHONPATH']}{os.pathsep}{fi}"}
    w = rig.run("--format", "json", "warm", "--", MODEL, **env)
    assert w.returncode == 0, w.stderr
    doc = json.loads(w.stdout)
    [cache] = doc["files"]
    assert re.search(r"/vllm/v2/[0-9a-f]{16}$", cache["path"]) and cache["entries"] == 32
    for code in (0, 4):
        exit_now = {"FAKE_VLLM_MODE": "exit-now", "FAKE_VLLM_EXIT_CODE": str(code)}
        p = rig.run("serve", "--", MODEL, **env, **exit_now)
        assert p.returncode == code, p.stderr
    assert len(rig.starts()) == 3  # one warm, then each serve starts vLLM once
    listed = rig.run("ls", **env)
    assert listed.returncode == 0 and cache["path"].split("/")[-1] in listed.stdout
    doctor = rig.run("doctor", **env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_a_warm_is_the_files_that_start_used_not_the_namespace(rig: Rig, tmp_path: Path) -> None:
    """A second model whose start wrote and read nothing is a failed warm, though the namespace
    holds the first model's file; a start that loaded its existing file is a warm of it."""
    gpu = _gpu_host(rig, tmp_path)  # vLLM should tune here: no file is a failure
    assert rig.run("warm", "--", MODEL, **gpu).returncode == 0
    other = rig.run("--format", "json", "warm", "--", "other/model", FAKE_VLLM_NO_CACHE="1", **gpu)
    assert other.returncode == 1 and "neither wrote nor read" in other.stderr
    again = rig.run("--format", "json", "warm", "--", MODEL, "--max-num-seqs", "8", **gpu)
    [first_file] = json.loads(again.stdout)["files"]
    reload = rig.run("--format", "json", "warm", "--", MODEL, "--max-num-seqs", "8", **gpu)
    assert reload.returncode == 0, reload.stderr  # the file is unchanged: the log names it
    assert json.loads(reload.stdout)["files"] == [first_file]


def test_a_gemm_profile_crash_is_named_and_its_log_kept_for_doctor(rig: Rig) -> None:
    p = rig.run("warm", "--", MODEL, FAKE_VLLM_MODE="crash")
    assert p.returncode == 1 and "Traceback (most recent call last)" in p.stderr  # vLLM's own
    assert "vLLM died replaying a cached MoE tactic" in p.stderr
    assert "(Invalid gemm2 profile id: 50)" in p.stderr
    said = [ln for ln in p.stderr.splitlines() if "fi-cache doctor --log " in ln]
    log = said[0].rsplit("fi-cache doctor --log ", 1)[1].rstrip(")")
    assert Path(log).is_file() and Path(log).is_relative_to(rig.store)
    doctor = rig.run("--format", "json", "doctor", "--log", log)
    checks = {f["check"] for f in json.loads(doctor.stdout)["findings"]}
    assert doctor.returncode == 1 and "stale-gemm2-profile" in checks


def test_a_lock_file_the_flock_strategy_left_does_not_stop_a_lockfile_warm(rig: Rig) -> None:
    """The store moves to NFS, or one node sets FI_CACHE_LOCK=lockfile: the empty lock file of
    the flock strategy is no holder, and the warm does not wait for one."""
    first = rig.run("--format", "json", "warm", "--", MODEL, FI_CACHE_LOCK="flock")
    assert first.returncode == 0, first.stderr
    lock = Path(json.loads(first.stdout)["namespace"]) / locks.LOCK_NAME
    assert lock.read_bytes() == b""  # what flock leaves
    then = time.time() - 3600
    os.utime(lock, (then, then))
    again = rig.run("warm", "--lock-timeout", "2", "--", "other/model", FI_CACHE_LOCK="lockfile")
    assert again.returncode == 0, again.stderr
    assert "waiting for" not in again.stderr and len(rig.starts()) == 2


def test_serve_format_json_prints_one_document_and_vllms_log_on_stderr(rig: Rig) -> None:
    """--format json: one JSON document on stdout, then vLLM runs with its stdout on stderr, so
    `fi-cache --format json serve ... | jq` parses (the warm phase captures vLLM's output)."""
    warm = rig.run("--format", "json", "warm", "--", MODEL)
    assert warm.returncode == 0, warm.stderr
    p = rig.run("--format", "json", "serve", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # the whole of stdout is one document
    assert doc["namespace"] == json.loads(warm.stdout)["namespace"]
    assert doc["finalize"] == "fused" and doc["command"][-1] == MODEL and doc["warm"] is None
    assert doc["cache_dir"] == str(Path(doc["namespace"]) / "vllm")
    assert "fake vLLM exiting at once" in p.stderr  # vLLM's log went to stderr


def test_a_cold_serve_with_autotune_off_starts_vllm_once(rig: Rig) -> None:
    """Nothing to tune, certainly (autotune off in the arguments): no warm first (issue 23)."""
    p = rig.run("serve", "--", MODEL, "-O0", FAKE_VLLM_MODE="exit-now", FAKE_VLLM_EXIT_CODE="0")
    assert p.returncode == 0 and "vLLM starts once, without a warm" in p.stderr
    assert len(rig.starts()) == 1


def test_disable_flashinfer_autotune_before_0_33_is_refused_before_vllm_starts(rig: Rig) -> None:
    """vLLM 0.32's parser rejects --disable-flashinfer-autotune (0.33's flag): refused up
    front, with the spelling 0.32 reads; on 0.33 it is autotune off and vLLM starts once."""
    old = rig.run("warm", "--", MODEL, "--disable-flashinfer-autotune", **vllm_dist(rig, "0.32.0"))
    assert old.returncode == 2 and rig.starts() == []
    assert "vLLM 0.32.0 has no --disable-flashinfer-autotune" in old.stderr
    assert "pass --no-enable-flashinfer-autotune" in old.stderr
    new = rig.run("warm", "--", MODEL, "--disable-flashinfer-autotune", **vllm_dist(rig, "0.33.0"))
    assert new.returncode == 0, new.stderr


def test_the_machines_nccl_settings_reach_every_vllm_start(rig: Rig) -> None:
    """A multi-GPU host that turns NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0, issue 26)
    keeps it off in the warm's vLLM and in the one serve hands over to."""
    nccl = {"NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"}
    assert rig.run("warm", "--", MODEL, **nccl).returncode == 0
    served = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now", **nccl)
    assert served.returncode == 0, served.stderr
    warm_start, serve_start = rig.starts()
    for start in (warm_start, serve_start):
        assert {k: start["env"].get(k) for k in nccl} == nccl


def test_serve_on_one_gpus_rank_file_asks_vllm_nothing(rig: Rig) -> None:
    """vLLM 0.32+ names even one GPU's file by rank (dp0_rank0): serve's check for other ranks'
    files has nothing to do there, and must neither wait for vLLM's answer (~25 s on the H200's
    host) nor fail when vLLM cannot give one (here: a stand-in, no vLLM to import)."""
    dist = {**vllm_dist(rig, "0.32.0"), "FAKE_VLLM_PER_RANK": "1"}
    assert rig.run("warm", "--", MODEL, **dist).returncode == 0
    served = rig.run("serve", "--", MODEL, FAKE_VLLM_MODE="exit-now", **dist)
    assert served.returncode == 0, served.stderr
    assert "could not compute" not in served.stderr and len(rig.starts()) == 2


def test_serve_says_so_when_it_cannot_tell_whether_every_rank_file_is_here(rig: Rig) -> None:
    dist = {**vllm_dist(rig, "0.32.0"), "FAKE_VLLM_RANKS": "2"}
    assert rig.run("warm", "--", MODEL, "-tp", "2", **dist).returncode == 0
    served = rig.run("serve", "--", MODEL, "-tp", "2", FAKE_VLLM_MODE="exit-now", **dist)
    assert served.returncode == 0, served.stderr  # the start goes on, as it would have
    assert (
        "cannot tell whether this node's rank files are all here: vLLM could not compute its "
        "cache location"
    ) in served.stderr
