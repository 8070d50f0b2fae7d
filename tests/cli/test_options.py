"""The shared option vocabulary (fi_cache/cli/options.py): every command's options walked by click
introspection, and options a command would accept and then ignore are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest

from fi_cache import environment
from fi_cache.cli import load_all
from tests.conftest import SMALL_PLAN

# The shared options, and the commands that must have each (docs/cli.md, "One vocabulary").
SHARED = {
    "--finalize": {"serve", "warm"},
    "--dry-run": {"align", "evict", "merge", "prune", "import", "pull", "pin", "unpin"},
    "--timeout": {"serve", "warm"},
    "--lock-timeout": {"serve", "warm"},
    "--namespace": {"export", "pin", "unpin", "push"},
}
# `plan --finalize` takes `both` too (a plan lists the modes it tunes): its own help and type.
VARIANTS = {("plan", "--finalize")}
# Commands whose modules other engineers are rewriting now (doctor as a library; bench, coverage):
# their spelling is shared already, their help text follows when they move to options.py.
NOT_YET: set[tuple[str, str]] = set()


def _uses() -> dict[str, list[tuple[str, click.Option]]]:
    uses: dict[str, list[tuple[str, click.Option]]] = {}
    for name, command in sorted(load_all().items()):
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in param.opts:
                    uses.setdefault(opt, []).append((name, param))
    return uses


def _face(param: click.Option) -> tuple[Any, ...]:
    """What a user sees of an option: its help text, its type, its metavar, its other names."""
    kind = json.dumps(param.type.to_info_dict(), sort_keys=True, default=str)
    return (param.help, kind, param.metavar, tuple(sorted(param.opts)))


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_option_has_one_spelling_one_help_and_one_type(flag: str) -> None:
    uses = _uses()
    having = {name for name, _ in uses.get(flag, [])}
    assert SHARED[flag] <= having, f"{flag} missing on {sorted(SHARED[flag] - having)}"
    faces = {_face(param) for name, param in uses[flag] if (name, flag) not in VARIANTS | NOT_YET}
    assert len(faces) == 1, faces
    # one text for every command: what each command defaults to is its show_default, not help
    [(help_text, *_)] = faces
    assert "default" not in (help_text or ""), help_text


def _spellings(command: click.Command) -> dict[str, set[str]]:
    """Each parameter's names: the spellings that reach one value."""
    return {p.name or "": set(getattr(p, "opts", [])) for p in command.params}


def test_old_spellings_stay_as_aliases_of_the_shared_ones() -> None:
    commands = load_all()
    serve = set().union(*_spellings(commands["serve"]).values())
    assert {"--finalize", "--deterministic", "--lock-timeout"} <= serve
    assert {"--verify", "--check"} <= _spellings(commands["plan"])["check_path"]
    assert {"--allow-unknown", "--force"} <= _spellings(commands["push"])["allow_unknown"]
    for name in ("import", "pull"):
        assert {"--force", "--allow-foreign"} <= _spellings(commands[name])["force"]


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(SMALL_PLAN)
    return path


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["plan", "--check", "{plan}", "--tokens", "1,2"], "--tokens"),
        (["plan", "--check", "{plan}", "--finalize", "fused"], "--finalize"),
        (["plan", "--check", "{plan}", "--dtype", "bf16"], "--dtype"),
        (["plan", "--check", "{plan}", "--tp-size", "2"], "--tp-size"),
        (["plan", "--verify", "{plan}", "--ep-size", "2"], "--ep-size"),
        (["plan", "--check", "{plan}", "-o", "{out}"], "-o"),
        (["warm", "--engine", "flashinfer", "--plan", "{plan}", "--again"], "--again"),
        (["warm", "--engine", "flashinfer", "--plan", "{plan}", "--no-seed"], "--seed"),
        (["serve", "--no-warm", "--timeout", "5", "m"], "--timeout"),
        (["serve", "--no-warm", "--seed", "m"], "--seed"),
        (["serve", "--no-warm", "--lock-timeout", "5", "m"], "--lock-timeout"),
        (["serve", "--deterministic", "--finalize", "fused", "m"], "--deterministic"),
        (["ls", "--paths", "-l"], "--paths"),
        (["ls", "--paths", "--format", "json"], "--paths"),
        (["--format", "json", "ls", "--paths"], "--paths"),
    ],
)
def test_an_option_that_would_be_ignored_is_refused(
    args: list[str], names: str, tmp_path: Path, plan_file: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: pytest.fail("got past parsing"))
    out = tmp_path / "out.toml"
    argv = [a.format(plan=plan_file, out=out) for a in args]
    from tests.conftest import cli_main_exit

    code = cli_main_exit(["--store", str(tmp_path / "store"), *argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fi-cache: ") and names in lines[0], lines
    assert not out.exists() and not (tmp_path / "store" / "namespaces").exists()
    if "json" not in argv:
        assert captured.out == ""


# Modules other engineers are rewriting now: their `_ctx` goes when they are done.
UNTYPED_YET: set[str] = set()


def test_commands_read_the_global_options_through_one_typed_accessor() -> None:
    """options.context() -> Context, not a copy of `_ctx() -> Any` in every module."""
    cli_dir = Path(__file__).parents[2] / "fi_cache" / "cli"
    untyped = sorted(
        p.name
        for p in cli_dir.glob("*.py")
        if p.name not in UNTYPED_YET
        and ("def _ctx" in (text := p.read_text()) or "get_current_context().obj" in text)
        and p.name != "options.py"
    )
    assert untyped == []
