"""A pinned namespace under warm and serve, end to end against tests/fake_vllm.py (a stand-in for
`vllm`, not vLLM): served read-only where a fully warm vLLM writes nothing (0.32+), refused
before vLLM starts where it would write (0.25-0.31 at every start; any vLLM on arguments it
has not warmed), and never warmed again until unpinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm_rig import MODEL, Rig, make_rig, vllm_dist


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


def test_a_pinned_namespace_is_served_read_only_and_never_warmed(rig: Rig) -> None:
    p = rig.run("--format", "json", "warm", "--", MODEL)
    assert p.returncode == 0, p.stderr
    ns = Path(json.loads(p.stdout)["namespace"])
    cache = Path(json.loads(p.stdout)["files"][0]["path"])
    before = cache.read_bytes()
    assert rig.run("pin", str(ns)).returncode == 0
    assert len(rig.starts()) == 1

    served = rig.run("serve", "--", MODEL, **vllm_dist(rig, "0.32.0"), FAKE_VLLM_MODE="exit-now")
    assert served.returncode == 0, served.stderr
    assert "served read-only" in served.stderr and len(rig.starts()) == 2

    old = rig.run("serve", "--", MODEL, **vllm_dist(rig, "0.30.0"))
    assert old.returncode == 2 and "pinned" in old.stderr
    assert "vLLM 0.30.0 writes its autotune file at every start" in old.stderr
    cold = rig.run("serve", "--", "other/model", **vllm_dist(rig, "0.32.0"))
    assert cold.returncode == 2 and "would tune these arguments and save" in cold.stderr
    forced = rig.run("serve", "--force", "--", "other/model")
    assert forced.returncode == 2 and "fi-cache unpin" in forced.stderr  # --force is no unpin
    again = rig.run("warm", "--again", "--", MODEL)
    assert again.returncode == 2 and "a warm (vLLM saves its tuning there)" in again.stderr
    assert "Traceback" not in again.stderr + cold.stderr + old.stderr
    assert len(rig.starts()) == 2  # none of the refused ones started vLLM
    assert rig.run("warm", "--", MODEL).returncode == 0  # already warm: nothing starts
    assert len(rig.starts()) == 2 and cache.read_bytes() == before

    assert rig.run("unpin", str(ns)).returncode == 0
    assert rig.run("warm", "--", "other/model").returncode == 0
    assert len(rig.starts()) == 3
