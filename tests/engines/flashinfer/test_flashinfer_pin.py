"""`warm --engine flashinfer` on a pinned namespace: refused under its lock, the file FlashInfer
wrote there left as it was. The tuning child is the CPU stand-in (tests/engines/flashinfer/
cpu_tune_child.py) importing the real FlashInfer 0.6.18 for its metadata."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import ROOT, TuneRig, flashinfer_dir, write_script

CPU_CHILD = ROOT / "tests" / "engines" / "flashinfer" / "cpu_tune_child.py"


def test_a_pinned_namespace_is_not_tuned_again(tmp_path: Path) -> None:
    flashinfer_dir("0.6.18")
    python = write_script(
        tmp_path / "tune-python", f'#!/bin/sh\nexec "{sys.executable}" "{CPU_CHILD}" "$@"\n'
    )
    rig = TuneRig.make(tmp_path, version="0.6.18", python=python)
    plan = rig.plan()
    first = rig.run(
        "--format", "json", "warm", "--engine", "flashinfer", "--plan", plan, "--finalize", "fused"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    [ns] = json.loads(first.stdout)["namespaces"]
    cache = Path(ns["file"])
    before = cache.read_bytes()
    assert rig.run("pin", ns["namespace"]).returncode == 0
    again = rig.run("warm", "--engine", "flashinfer", "--plan", plan, "--finalize", "fused")
    assert again.returncode == 2, again.stderr[-2000:]
    assert "pinned" in again.stderr and "a warm (FlashInfer saves its tuning there)" in again.stderr
    assert "Traceback" not in again.stderr
    assert cache.read_bytes() == before
    manifest = json.loads((Path(ns["namespace"]) / "manifest.json").read_text())
    assert len(manifest["warms"]) == 1  # the refused warm recorded nothing
