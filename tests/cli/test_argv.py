"""fi-cache's options, then vLLM's: where serve and warm split a command line, and the global
options after a command name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fi_cache.cli.argv import VLLM_NAMES, misplaced, split
from tests.conftest import GEMM_618, Result

OURS = {"--deterministic": False, "--timeout": True, "--no-warm": False, "--port": True}


@pytest.mark.parametrize(
    "args, ours, theirs, explicit",
    [
        (["Qwen/Qwen3-8B", "--port", "8000", "-tp", "2"], [], ["Qwen/Qwen3-8B", "--port", "8000",
         "-tp", "2"], False),
        (["--deterministic", "--timeout", "60", "m", "-tp", "2"], ["--deterministic", "--timeout",
         "60"], ["m", "-tp", "2"], False),
        (["--timeout=60", "--", "m", "--deterministic"], ["--timeout=60"], ["m",
         "--deterministic"], True),
        (["-q", "fp8", "m"], [], ["-q", "fp8", "m"], False),  # -q is not one of ours here
        (["--no-warm=1", "m"], [], ["--no-warm=1", "m"], False),  # a flag takes no value
    ],
)  # fmt: skip
def test_our_options_end_at_the_first_word_that_is_not_one(
    args: list[str], ours: list[str], theirs: list[str], explicit: bool
) -> None:
    assert split(args, OURS) == (ours, theirs, explicit)


def test_only_names_vllm_lacks_count_as_misplaced() -> None:
    only = set(OURS) - VLLM_NAMES
    assert misplaced(["m", "--port", "1", "-q", "fp8"], only) is None  # vLLM's own flags
    assert misplaced(["m", "--timeout=5"], only) == "--timeout"
    assert misplaced(["m", "--", "--deterministic"], only) is None  # handed on on purpose


def test_an_option_of_ours_after_the_vllm_arguments_is_refused_not_taken(run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_VLLM", "/nonexistent/vllm")
    for command in (["serve", "Qwen/Qwen3-8B", "--port", "8000", "--deterministic"],
                    ["warm", "Qwen/Qwen3-8B", "--finalize", "unfused"]):  # fmt: skip
        r: Result = run(*command)
        assert r.code == 2 and r.err.count("\n") == 1, r.err
        name = command[-2] if command[0] == "warm" else command[-1]
        assert r.err.startswith(f"fi-cache: {name} comes after the vLLM arguments")
        assert "put it first" in r.err and "after `--`" in r.err


def test_global_options_work_after_the_command_name(run, store: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_VLLM", "/nonexistent/vllm")  # doctor: the layout model
    listed = run("ls", "--format", "json", str(GEMM_618))
    assert listed.code == 0 and json.loads(listed.out)["caches"][0]["path"] == str(GEMM_618)
    loud = run("doctor", "--", "Qwen/Qwen3-8B")
    quiet = run("doctor", "-q", "--", "Qwen/Qwen3-8B")
    assert loud.code == quiet.code == 0, quiet.err
    assert "cache-location" in loud.out and "cache-location" not in quiet.out  # info: dropped
    shown = run("env", "--format", "json", "--store", str(store / "elsewhere"))
    assert json.loads(shown.out)["store"] == str((store / "elsewhere").resolve())
