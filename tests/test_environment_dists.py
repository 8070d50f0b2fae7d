"""The packages of the interpreter that runs vLLM, when it is not fi-cache's own: asked in a child
of it once, then given again from the store while nothing that child read from has changed (every
serve ran the child: ~50 ms)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fi_cache import environment as envmod
from tests.conftest import write_script


def _venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv (its python, its site-packages) holding a stand-in vllm dist, its dirs dated a
    minute back as a venv installed earlier is."""
    venv = tmp_path / "vllm-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python*/site-packages")
    _dist(site, "vllm", "0.33.0")
    then = time.time() - 60
    for d in (site, *site.iterdir()):
        os.utime(d, (then, then))
    return venv / "bin" / "python", site


def _dist(site: Path, name: str, version: str) -> None:
    meta = site / f"{name}-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _counted(tmp_path: Path, python: Path, name: str = "python") -> tuple[Path, Path]:
    """`python` behind a wrapper that counts its starts (one per child asked)."""
    log = tmp_path / "starts"
    text = f'#!/bin/sh\necho started >> "{log}"\nexec "{python}" "$@"\n'
    wrapper = write_script(tmp_path / "bin" / name, text)
    then = time.time() - 60
    os.utime(wrapper, (then, then))
    return wrapper, log


def _starts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_answer_is_kept_and_given_again_without_a_child(tmp_path: Path) -> None:
    python, _ = _venv(tmp_path)
    wrapper, log = _counted(tmp_path, python)
    state = tmp_path / "state"
    first = envmod.dists_of(str(wrapper), state_dir=state)
    again = envmod.dists_of(str(wrapper), state_dir=state)
    assert first.versions["vllm"] == "0.33.0" and _starts(log) == 1
    assert again == first  # same versions, files and pins; the python as given


def test_a_package_installed_since_is_seen(tmp_path: Path) -> None:
    python, site = _venv(tmp_path)
    wrapper, log = _counted(tmp_path, python)
    state = tmp_path / "state"
    assert envmod.dists_of(str(wrapper), state_dir=state).versions["vllm"] == "0.33.0"
    for old in site.glob("vllm-*.dist-info"):  # pip's upgrade: the old dist-info goes
        (old / "METADATA").unlink()
        old.rmdir()
    _dist(site, "vllm", "0.34.0")
    assert envmod.dists_of(str(wrapper), state_dir=state).versions["vllm"] == "0.34.0"
    assert _starts(log) == 2


def test_a_venv_changed_just_now_is_asked_again_next_time(tmp_path: Path) -> None:
    """A change within its dir's mtime tick would go unseen: a fresh change is not kept."""
    python, site = _venv(tmp_path)
    _dist(site, "torch", "2.9.0")  # just now
    wrapper, log = _counted(tmp_path, python)
    state = tmp_path / "state"
    envmod.dists_of(str(wrapper), state_dir=state)
    envmod.dists_of(str(wrapper), state_dir=state)
    assert _starts(log) == 2


def test_two_venvs_of_one_python_keep_their_own_answers(tmp_path: Path) -> None:
    python, _ = _venv(tmp_path / "a")
    other, site = _venv(tmp_path / "b")
    for old in site.glob("vllm-*.dist-info"):
        (old / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    then = time.time() - 60
    os.utime(site, (then, then))
    state = tmp_path / "state"
    assert os.path.realpath(python) == os.path.realpath(other)  # both link the base Python
    assert envmod.dists_of(str(python), state_dir=state).versions["vllm"] == "0.33.0"
    assert envmod.dists_of(str(other), state_dir=state).versions["vllm"] == "0.34.0"


def test_a_record_that_is_not_ours_is_asked_again(tmp_path: Path) -> None:
    python, _ = _venv(tmp_path)
    wrapper, log = _counted(tmp_path, python)
    state = tmp_path / "state"
    envmod.dists_of(str(wrapper), state_dir=state)
    [record] = state.glob("dists-*.json")
    record.write_text('{"stamps": 7}')
    assert envmod.dists_of(str(wrapper), state_dir=state).versions["vllm"] == "0.33.0"
    assert _starts(log) == 2
