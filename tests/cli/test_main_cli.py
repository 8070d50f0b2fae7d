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
        ["coverage", str(GEMM_618), "--plan", str(_ROOT / "examples" / "plans" / "h200-gemm.toml")],
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


_HF = _ROOT / "tests" / "fixtures" / "hf" / "qwen3-30b-a3b.json"


@pytest.mark.parametrize(
    "command",
    [
        ["env", "--no-exact"],
        ["ls", str(GEMM_618)],
        ["show", str(GEMM_618)],
        ["verify", str(GEMM_618)],
        ["doctor", str(GEMM_618)],
        ["doctor", "--list-checks"],
        ["plan", "--from-hf-config", str(_HF)],
        ["plan", "--from-hf-config", str(_HF), "--tp-size", "2", "-o", "{tmp}/plan.toml"],
        ["plan", "--check", str(_ROOT / "examples" / "plans" / "h200-gemm.toml")],
        ["merge", str(GEMM_618), "-o", "{tmp}/merged.json"],
        ["prune", "--dry-run"],
    ],
)
def test_format_json_prints_exactly_one_document(
    command: list[str], tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    cli_main_exit(["--store", str(tmp_path / "s"), "--format", "json", *args])
    out = capsys.readouterr().out
    doc = json.loads(out)  # raises on TOML, on two documents, on a human line
    assert isinstance(doc, dict)
    if command[:2] == ["plan", "--from-hf-config"]:
        assert doc["toml"].startswith("#") and doc["ops"] and doc["calls"]


def test_quiet_silences_notes_and_keeps_errors(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """-q: "No progress, notes or warnings on stderr; errors and results still show"."""
    from fi_cache import environment
    from fi_cache.environment import Environment, VllmInfo
    from fi_cache.model.fingerprint import Fingerprint

    env = Environment(
        Fingerprint(flashinfer_version="0.7.2.post1"),
        (),
        VllmInfo(None, None, None),
        None,
        notes=("FlashInfer is not installed: fields from package metadata",),
    )
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    store = ["--store", str(tmp_path / "s")]
    cli_main_exit([*store, "env", "--no-exact"])
    assert "FlashInfer is not installed" in capsys.readouterr().err
    cli_main_exit([*store, "-q", "env", "--no-exact"])
    quiet = capsys.readouterr()
    assert quiet.err == "" and "store" in quiet.out  # the result stays
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert cli_main_exit([*store, "-q", "verify", str(bad)]) == 1
    assert "truncated" in capsys.readouterr().err  # a problem found is an error: shown


def _parses(example: str) -> None:
    """An example line is a real command line: every option and argument it uses exists."""
    import shlex

    from fi_cache.cli import load_all

    words = shlex.split(example)
    assert words[0] == "fi-cache", example
    words = words[1:]
    while words[0].startswith("-"):  # global options
        words = words[2:] if words[0] in ("--format", "--store") else words[1:]
    command = load_all()[words[0]]
    command.make_context(words[0], words[1:])  # raises click.UsageError on a wrong example


def test_every_command_help_ends_with_two_or_three_real_examples() -> None:
    import click

    from fi_cache.cli import cli, load_all

    for name, command in sorted(load_all().items()):
        with click.Context(cli, info_name="fi-cache") as parent:
            text = command.get_help(click.Context(command, info_name=name, parent=parent))
        lines = text.rstrip().splitlines()
        at = max(i for i, line in enumerate(lines) if line.strip() == "Examples:")
        examples = [line.strip() for line in lines[at + 1 :]]
        assert 2 <= len(examples) <= 3, (name, examples)
        for example in examples:
            assert example.split()[:1] == ["fi-cache"] and name in example.split(), example
            _parses(example)


def test_help_lists_every_command_as_loaded_and_imports_none_of_them() -> None:
    """`fi-cache --help` lists the commands from cli.COMMANDS without importing their modules:
    the list must say what each command's own help says."""
    import subprocess
    import sys

    import click

    from fi_cache.cli import COMMANDS, load_all

    loaded = load_all()
    assert sorted(loaded) == sorted(COMMANDS)
    for name, command in loaded.items():
        assert click.Command(name, help=COMMANDS[name][1]).get_short_help_str(300) == (
            command.get_short_help_str(300)
        ), name
    probe = (
        "import sys; from fi_cache.cli import main\n"
        "try: main(['--help'])\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('fi_cache.')), file=sys.stderr)"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "Commands:" in p.stdout and "  warm " in p.stdout
    assert p.stderr.strip() == "['fi_cache.cli', 'fi_cache.errors']"
