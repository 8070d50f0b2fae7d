"""nvidia-smi's answer kept while the driver shows the same GPUs (fi_cache/environment/gpus.py):
a driver dir like /proc/driver/nvidia's, and a counting nvidia-smi on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_cache.environment import gpus
from tests.conftest import H200_ROW, write_script


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """(driver dir, state dir, the file nvidia-smi appends a line to at each call)."""
    proc = tmp_path / "proc-nvidia"
    info = proc / "gpus" / "0000:19:00.0" / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t NVIDIA H200\nGPU UUID: \t GPU-1234\nBus Location: \t 0000:19:00.0\n")
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    write_script(bin_dir / "nvidia-smi", f"#!/bin/sh\necho x >> {calls}\necho '{H200_ROW}'\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    return proc, tmp_path / "state", calls


def _calls(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_answer_is_kept_while_the_driver_shows_the_same_gpus(
    machine: tuple[Path, Path, Path],
) -> None:
    proc, state, calls = machine
    first = gpus.query_gpus(state, str(proc))
    assert [g.name for g in first] == ["NVIDIA H200"] and _calls(calls) == 1
    assert gpus.query_gpus(state, str(proc)) == first and _calls(calls) == 1


@pytest.mark.parametrize("change", ["another GPU", "another driver"])
def test_another_gpu_or_driver_asks_nvidia_smi_again(
    machine: tuple[Path, Path, Path], change: str
) -> None:
    proc, state, calls = machine
    gpus.query_gpus(state, str(proc))
    if change == "another GPU":
        info = proc / "gpus" / "0000:2a:00.0" / "information"
        info.parent.mkdir()
        info.write_text("Model: \t NVIDIA H200\nGPU UUID: \t GPU-5678\n")
    else:
        (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.1\n")
    gpus.query_gpus(state, str(proc))
    assert _calls(calls) == 2


def test_without_a_driver_dir_nvidia_smi_runs_each_time(machine: tuple[Path, Path, Path]) -> None:
    """A fake nvidia-smi on a host without NVIDIA's driver (these tests) is asked every time."""
    proc, state, calls = machine
    for _ in range(2):
        gpus.query_gpus(state, str(proc / "missing"))
    assert _calls(calls) == 2 and not state.exists()


def test_no_nvidia_smi_starts_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.query_gpus(tmp_path / "state") == []
