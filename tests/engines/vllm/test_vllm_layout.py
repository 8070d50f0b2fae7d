"""Where each vLLM release keeps FlashInfer's autotune results when vLLM cannot be asked (the
model of flashinfer_autotune_cache.py, docs/research/vllm-releases.md Q1)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fi_cache.engines.vllm.args import parse_serve_args
from fi_cache.engines.vllm.layout import store_kind, v2_root, vllm_cache_root
from tests.conftest import VLLM_PYTHON, needs_vllm


@pytest.mark.parametrize(
    "vllm, fi, argv, kind",
    [
        ("0.33.0", "0.7.2.post1", ["m"], "v2"),  # one GPU: the default case of the newest vLLM
        ("0.33.0", "0.7.2.post1", ["m", "-dp", "2"], "v1"),  # MoE (assumed): DP joins the world
        ("0.33.0", "0.7.2.post1", ["m", "-tp", "2"], "v1"),  # world size 2
        ("0.33.0", "0.7.2.post1", ["m", "-pp", "2"], "v1"),
        ("0.33.0", "0.7.2.post1", ["m", "--nnodes", "2"], "v1"),
        ("0.33.0", "0.7.2.post1", ["m", "--enable-elastic-ep"], "v1"),
        ("0.33.0", "0.6.18", ["m"], "v1"),  # no autotune_v2 in FlashInfer 0.6
        ("0.32.0", "0.7.0.post1", ["m"], "v1"),
        ("0.33.0", None, ["m"], "v2"),  # FlashInfer unknown: vLLM 0.33's pin has it
    ],
)
def test_store_kind(vllm: str, fi: str | None, argv: list[str], kind: str) -> None:
    assert store_kind(vllm, fi, parse_serve_args(argv)) == kind


def test_dense_data_parallel_ranks_are_worlds_of_one() -> None:
    args = parse_serve_args(["m", "-dp", "2"])
    assert store_kind("0.33.0", "0.7.2.post1", args, moe=False) == "v2"
    assert store_kind("0.33.0", "0.7.2.post1", args, moe=True) == "v1"


def test_v2_root_follows_vllm_then_flashinfer() -> None:
    home = Path("/home/u")
    default = home / ".cache/flashinfer/autotune"
    assert v2_root({}, home) == default
    ws = {"FLASHINFER_WORKSPACE_BASE": "/ws"}
    assert v2_root(ws, home) == Path("/ws/.cache/flashinfer/autotune")
    assert v2_root({"FLASHINFER_AUTOTUNE_CACHE_DIR": "~/a"}, home) == Path("~/a")  # as FlashInfer
    env = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/ns/vllm", "FLASHINFER_AUTOTUNE_CACHE_DIR": "/a"}
    assert v2_root(env, home) == Path("/ns/vllm")
    assert v2_root({"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": ""}, home) == default  # "" is unset


@pytest.mark.parametrize(
    "argv",
    [
        ["m", "-O0"],
        ["m", "-O", "0"],
        ["m", "-O=0"],
        ["m", "--optimization-level", "0"],
        ["m", "--optimization-level=0"],
        ["m", "--no-enable-flashinfer-autotune"],
        ["m", "--kernel-config.enable_flashinfer_autotune", "false"],
        ["m", "--kernel-config.enable_flashinfer_autotune=false"],
        ["m", "--kernel-config", '{"enable_flashinfer_autotune": false}'],
    ],
)
def test_every_spelling_of_autotune_off(argv: list[str]) -> None:
    parsed = parse_serve_args(argv)
    assert parsed.autotune_off and not parsed.disable_flag and parsed.model == "m"


def test_the_033_only_flag_is_told_apart() -> None:
    parsed = parse_serve_args(["m", "--disable-flashinfer-autotune"])
    assert parsed.autotune_off and parsed.disable_flag
    assert not parse_serve_args(["m", "-O3"]).autotune_off


def test_vllm_cache_root_as_vllm_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """envs.py: an empty value is set (relative paths follow), one expanduser at the end."""
    monkeypatch.setenv("HOME", "/home/u")
    assert vllm_cache_root({}) == "/home/u/.cache/vllm"
    assert vllm_cache_root({"XDG_CACHE_HOME": "~/x"}) == "/home/u/x/vllm"
    assert vllm_cache_root({"XDG_CACHE_HOME": ""}) == "vllm"
    assert vllm_cache_root({"VLLM_CACHE_ROOT": ""}) == ""
    assert vllm_cache_root({"VLLM_CACHE_ROOT": "~/v", "XDG_CACHE_HOME": "/x"}) == "/home/u/v"
    assert vllm_cache_root({"VLLM_CACHE_ROOT": "$HOME/v"}) == "$HOME/v"  # no variable expansion


_VLLM_ROOT = """
import json, os, sys
from vllm import envs
out = []
for case in json.loads(sys.argv[1]):
    for k in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        os.environ.pop(k, None)
    os.environ.update(case)
    out.append(envs.VLLM_CACHE_ROOT)
print(json.dumps(out))
"""


@needs_vllm
def test_vllm_cache_root_agrees_with_real_vllm() -> None:
    cases = [
        {},
        {"XDG_CACHE_HOME": "~/x"},
        {"XDG_CACHE_HOME": ""},
        {"VLLM_CACHE_ROOT": ""},
        {"VLLM_CACHE_ROOT": "~/v", "XDG_CACHE_HOME": "/x"},
        {"VLLM_CACHE_ROOT": "$HOME/v"},
        {"XDG_CACHE_HOME": "rel"},
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME")}
    out = subprocess.run(
        [VLLM_PYTHON, "-c", _VLLM_ROOT, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [vllm_cache_root(c) for c in cases]
