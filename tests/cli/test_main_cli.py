"""The command line as a whole: the `python -m` entry point, usage errors, JSON on failure, and
no heavy imports for commands that only read files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GEMM_618, cli_main_exit

_ROOT = Path(__file__).resolve().parents[2]


def test_usage_error_exit_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main_exit(["ls", "--no-such-flag"]) == 2
    assert cli_main_exit(["show"]) == 2


def _subprocess(
    *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, check=False
    )


def test_python_m_entry_point_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    p = _subprocess("-m", "fi_cache", "--store", str(tmp_path / "s"), "verify", str(bad))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert (
        p.stderr.strip().endswith(
            "truncated: Expecting property name enclosed in double quotes at line 1 column 2"
        )
        or "truncated" in p.stderr
    )


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["ls", "--help"],
        ["verify", str(GEMM_618)],
        ["show", str(GEMM_618)],
        ["ls", str(GEMM_618)],
        ["plan", "--check", str(_ROOT / "examples" / "plans" / "h200-gemm.toml")],
        [
            "plan",
            "--from-hf-config",
            str(_ROOT / "tests" / "fixtures" / "hf" / "qwen3-30b-a3b.json"),
        ],
        ["warm", "--engine", "flashinfer", "--plan", str(_ROOT / "no-such-plan.toml")],
    ],
)
def test_read_only_commands_import_no_heavy_package(command: list[str], tmp_path: Path) -> None:
    code = (
        "import sys; from fi_cache.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'flashinfer', 'vllm') if m in sys.modules)\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))"
    )
    p = _subprocess("-c", code, "--store", str(tmp_path), *command)
    assert p.stderr.strip().endswith("HEAVY="), p.stderr[-300:]


def test_json_mode_failure_still_prints_one_json_document(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ["--store", str(tmp_path), "--format", "json", "show", str(tmp_path / "gone.json")]
    assert cli_main_exit(args) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["error"]["exit_code"] == 2 and doc["error"]["path"] == str(tmp_path / "gone.json")
    assert captured.err.count("\n") == 1


def test_usage_errors_in_json_mode_still_print_one_json_document(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main_exit(["--store", str(tmp_path), "--format", "json", "ls", "--bogus"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == 2


_EXAMPLE = _ROOT / "examples" / "vllm-cache"


@pytest.mark.parametrize(
    "name, value, args",
    [
        ("FI_CACHE_LOCK", "bogus", ["prune", "--older-than", "0s", "--dry-run"]),
        ("FI_CACHE_MAX_FILE_MB", "abc", ["ls", str(_EXAMPLE)]),
        ("FI_CACHE_MAX_FILE_MB", "-1", ["verify", str(_EXAMPLE)]),
        ("FI_CACHE_MAX_FILE_MB", "1.5", ["show", str(GEMM_618)]),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_not_ignored(
    name: str, value: str, args: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "namespaces" / "0.6.18" / "90a" / "nvidia-h200" / "fused-0123456789ab").mkdir(
        parents=True
    )
    monkeypatch.setenv(name, value)
    code = cli_main_exit(["--store", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"fi-cache: {name}={value!r}: ") and err.count("\n") == 1
