"""`fi-cache plan` as a user runs it: `python -m fi_cache` in a real process; a plan written from
a HF config is one `plan --check` accepts, quantised models and bad usage are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, SPECIAL_KINDS, TuneRig, make_special, no_hang, one_line

HF = FIXTURES / "hf"


def test_plan_from_a_hf_config_is_a_plan_check_accepts(tmp_path: Path) -> None:
    rig = TuneRig.make(tmp_path)
    out = tmp_path / "qwen3.toml"
    p = rig.run("plan", "--from-hf-config", HF / "qwen3-30b-a3b.json", "-o", out)
    assert p.returncode == 0, p.stderr
    check = rig.run("plan", "--check", out)
    assert check.returncode == 0, check.stderr
    assert "cutlass_fused_moe bf16 h=2048 i=768 e=128 top_k=8" in check.stdout
    assert "fused namespace: 4 calls" in check.stdout
    assert "unfused namespace: 4 calls" in check.stdout
    doc = json.loads(rig.run("--format", "json", "plan", "--check", out).stdout)
    assert doc["modes"] == ["fused", "unfused"] and doc["calls"] == {"fused": 4, "unfused": 4}
    [op] = doc["ops"]
    assert (op["op"], op["hidden_size"], op["num_experts"], op["top_k"]) == (
        "cutlass_fused_moe",
        2048,
        128,
        8,
    )


@pytest.mark.parametrize("dtype", [[], ["--dtype", "bf16"]])
def test_plan_from_a_quantised_model_is_refused(tmp_path: Path, dtype: list[str]) -> None:
    p = TuneRig.make(tmp_path).run("plan", "--from-hf-config", HF / "deepseek-v3.json", *dtype)
    assert p.returncode == 2 and p.stdout == ""
    line = one_line(p)
    assert "fp8" in line and "quantised" in line and "deepseek-v3.json" in line


def test_dtype_help_says_what_a_quantised_model_gets(run) -> None:  # type: ignore[no-untyped-def]
    """The refusal above holds with --dtype: the help must not promise --dtype for them."""
    r = run("plan", "--help")
    text = " ".join(r.out.split())
    assert r.code == 0 and "needed for quantised" not in text
    assert "Quantised models are refused, --dtype or not" in text


@pytest.mark.parametrize("both", [False, True])
def test_plan_needs_exactly_one_of_from_hf_config_and_check(tmp_path: Path, both: bool) -> None:
    rig = TuneRig.make(tmp_path)
    args = ["--from-hf-config", str(HF / "qwen3-30b-a3b.json"), "--check", str(rig.plan())]
    p = rig.run("plan", *(args if both else []))
    assert p.returncode == 2
    assert "give one of --from-hf-config CONFIG or --verify PLAN" in one_line(p)


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_plan_o_never_replaces_a_device_fifo_socket_or_dir(run, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "null"
    still = make_special(out, kind)
    with no_hang():
        r = run("plan", "--from-hf-config", HF / "qwen3-30b-a3b.json", "-o", out)
    assert r.code == 2 and r.err.startswith(f"fi-cache: {out}: is "), r.err
    assert r.err.count("\n") == 1 and still()


ENDLESS = ("fifo", "/dev/zero", "too-big")


def _endless(tmp_path: Path, kind: str) -> Path:
    """A plan or config.json that a read would never finish (or finish gigabytes later)."""
    if kind == "/dev/zero":
        return Path(kind)
    path = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:  # regular, over any cap: must be refused, not read whole
        with open(path, "wb") as f:
            f.truncate(64 << 20)
    return path


@pytest.mark.parametrize("kind", ENDLESS)
@pytest.mark.parametrize("flag", ["--check", "--from-hf-config"])
def test_plan_refuses_a_fifo_or_endless_file_at_once(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, flag: str, kind: str
) -> None:
    path = _endless(tmp_path, kind)
    with no_hang():
        r = run("plan", flag, path)
    assert r.code == 2 and r.err.startswith(f"fi-cache: {path}: "), r.err
    assert r.err.count("\n") == 1 and ("is a " in r.err or "too large" in r.err), r.err
