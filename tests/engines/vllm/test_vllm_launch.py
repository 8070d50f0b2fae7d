"""Finding the interpreter behind a vLLM executable, so that facts about vLLM (and the packages
that name a namespace) come from the environment that runs it, not from fi-cache's own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fi_cache.engines.scripts import interpreter
from fi_cache.engines.vllm.launch import vllm_python
from tests.conftest import write_script

PY = sys.executable


def test_a_console_script_names_its_interpreter(tmp_path: Path) -> None:
    vllm = write_script(tmp_path / "vllm", f"#!{PY}\nfrom vllm.entrypoints.cli.main import main\n")
    assert interpreter(str(vllm)) == PY


def test_env_shebangs_are_resolved_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    write_script(bin_dir / "python3", f'#!/bin/sh\nexec "{PY}" "$@"\n')
    monkeypatch.setenv("PATH", str(bin_dir))
    vllm = write_script(tmp_path / "vllm", "#!/usr/bin/env -S python3\nimport sys\n")
    assert interpreter(str(vllm)) == str(bin_dir / "python3")


def test_pips_launcher_for_long_interpreter_paths(tmp_path: Path) -> None:
    long_dir = tmp_path / ("v" * 120) / "bin"
    python = write_script(long_dir / "python", f'#!/bin/sh\nexec "{PY}" "$@"\n')
    text = f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    assert interpreter(str(write_script(tmp_path / "vllm", text))) == str(python)


@pytest.mark.parametrize(
    "text",
    ['#!/bin/sh\nexec /opt/vllm/bin/vllm "$@"\n', "#!/usr/bin/env bash\necho\n", "no shebang\n"],
    ids=["shell-wrapper", "bash", "no-shebang"],
)
def test_anything_else_has_no_known_interpreter(tmp_path: Path, text: str) -> None:
    assert interpreter(str(write_script(tmp_path / "vllm", text))) is None


def test_a_python_is_its_own_interpreter_and_a_missing_vllm_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert interpreter(PY) == PY
    assert interpreter(str(tmp_path / "missing")) is None
    monkeypatch.setenv("FI_CACHE_VLLM", str(tmp_path / "missing"))
    assert vllm_python(None) is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # issue 43: the user's --port reached vLLM beside the warm's (`--port 8000 ... --port N`)
        (
            ["Qwen/Qwen3-8B", "--port", "8000", "-tp", "2"],
            ["Qwen/Qwen3-8B", "-tp", "2", "--host", "127.0.0.1", "--port", "5000"],
        ),
        (
            ["Qwen/Qwen3-8B", "--host=0.0.0.0", "--port=8000"],
            ["Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "5000"],
        ),
        # F5: after a `--` vLLM's argparse takes --host/--port as positionals
        (
            ["Qwen/Qwen3-30B-A3B", "--", "--x"],
            ["Qwen/Qwen3-30B-A3B", "--host", "127.0.0.1", "--port", "5000", "--", "--x"],
        ),
        (
            ["m", "--", "--port", "1"],
            ["m", "--host", "127.0.0.1", "--port", "5000", "--", "--port", "1"],
        ),
    ],
)
def test_the_warms_address_replaces_the_users_before_any_double_dash(
    argv: list[str], expected: list[str]
) -> None:
    from fi_cache.engines.vllm.launch import warm_argv

    assert warm_argv(argv, 5000) == expected
    assert warm_argv(argv, None) == argv  # serve: the user's own address, untouched
