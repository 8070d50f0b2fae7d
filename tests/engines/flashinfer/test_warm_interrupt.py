"""A `warm --engine flashinfer` stopped mid-tune keeps what it tuned (fi_cache/engines/flashinfer/
warm.py `_keep_partial`, driver.py `_save_partial`): the real CPU child (cpu_tune_child.py, with
FlashInfer 0.6.18's AutoTuner) hangs as it reaches the plan's MoE op, after the GEMM is tuned; the
user stops fi-cache with SIGTERM, as kubectl or systemd do."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from fi_cache.model.keys import parse_key
from tests.cli.test_warm_flashinfer_cli import _tune_python
from tests.conftest import TuneRig, flashinfer_dir

GEMM_OP = "fi_cache_test::cpu_gemm"  # the CPU stand-in's op for mm_bf16


def test_a_stopped_tune_keeps_the_ops_it_finished_and_the_next_warm_tunes_the_rest(
    tmp_path: Path,
) -> None:
    flashinfer_dir("0.6.18")
    rig = TuneRig.make(tmp_path, version="0.6.18", python=_tune_python(tmp_path))
    mark = tmp_path / "hanging"
    argv = ("warm", "--engine", "flashinfer", "--finalize", "fused", "--plan", rig.plan())
    job = rig.job(
        *argv,
        FI_CACHE_TEST_HANG_OP="cutlass_fused_moe",
        FI_CACHE_TEST_MARK=str(mark),
        FI_CACHE_STOP_GRACE="5",
    )
    proc = subprocess.Popen(**job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [cache] = rig.store.rglob("autotune_configs.json")
    entries = {k: v for k, v in json.loads(cache.read_text()).items() if not k.startswith("_")}
    assert {parse_key(k).op for k in entries} == {GEMM_OP}  # the GEMM's buckets, no MoE
    assert len(entries) == 5  # buckets 1, 2, 4, 8, 16
    assert f"interrupted: kept 5 entries tuned so far in {cache}" in err
    assert not list(rig.store.rglob("*.partial"))
    manifest = json.loads((cache.parents[1] / "manifest.json").read_text())
    assert [w["ok"] for w in manifest["warms"]] == [False]  # not a finished warm
    again = rig.run(*argv)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("[tune ") == 4  # every call runs; the GEMM finds its buckets cached
    entries = {k for k in json.loads(cache.read_text()) if not k.startswith("_")}
    assert len(entries) == 15
