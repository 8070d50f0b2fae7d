"""fi_cache/store/paths.py: the store a command works on is a directory, or nothing yet; a path
read from store state stays inside its dir."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fi_cache.store.paths import Unconfined, confined, relative_problem, within
from tests.conftest import Result, no_hang

COMMANDS = [["ls"], ["env"], ["verify"], ["prune", "--dry-run"], ["import", "b.tar.gz"]]


def _hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "store"
    if kind == "loop":
        path.symlink_to(path)
    elif kind == "loop-above":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        path = tmp_path / "loop" / "store"
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text("not a store")
    else:  # a file where a directory on the way should be
        (tmp_path / "f").write_text("x")
        path = tmp_path / "f" / "store"
    return path


@pytest.mark.parametrize("kind", ["loop", "loop-above", "fifo", "file", "file-above"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_store_that_cannot_be_one_is_refused_in_one_line(
    run: Callable[..., Result], tmp_path: Path, kind: str, command: list[str]
) -> None:
    """A symlink loop was a RuntimeError traceback; a FIFO or a file passed for an empty store."""
    store = _hostile(tmp_path, kind)
    forms = [["--store", str(store), *command], [*command, "--store", str(store)]]
    if command[0] == "prune":  # tests/cli/test_prune_cli.py registers it without after-name options
        forms.pop()
    for args in forms:
        with no_hang():
            result = run(*args)
        assert result.code == 2 and result.err.count("\n") == 1, result.err
        assert result.err.startswith(f"fi-cache: {store}: ") and "cannot be the store" in result.err
        assert "Traceback" not in result.err and result.out == ""


def test_fi_cache_dir_is_checked_as_store_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fi_cache.cli import main

    store = _hostile(tmp_path, "loop")
    monkeypatch.setenv("FI_CACHE_DIR", str(store))
    with pytest.raises(SystemExit) as info:
        main(["--format", "json", "ls"])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert err == f"fi-cache: {store}: symlink loop: cannot be the store\n"
    assert '"exit_code": 2' in out


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("/etc/passwd", "is absolute"),
        ("../../victim/x.json", "not normalised"),
        ("vllm/../../x.json", "not normalised"),
        ("vllm//x.json", "not normalised"),
        ("./x.json", "not normalised"),
        ("", "is empty"),
        ("vllm\\..\\x.json", "backslash"),
        ("vllm/x\n.json", "control character"),
    ],
)
def test_a_path_from_store_state_must_be_plain_and_relative(rel: str, why: str) -> None:
    assert why in (relative_problem(rel) or "")
    with pytest.raises(Unconfined, match=why.split()[-1]):
        confined(Path("/store/ns"), rel)


def test_a_confined_path_never_passes_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "ns" / "vllm").mkdir(parents=True)
    (tmp_path / "ns" / "out").symlink_to(tmp_path)
    assert confined(tmp_path / "ns", "vllm/abc/x.json") == tmp_path / "ns" / "vllm/abc/x.json"
    with pytest.raises(Unconfined, match="symlink"):
        confined(tmp_path / "ns", "out/ns/vllm")
    assert within(tmp_path / "ns", tmp_path / "ns" / "vllm" / "x.json") == "vllm/x.json"
    for outside in (tmp_path / "x.json", tmp_path / "ns" / "vllm" / ".." / ".." / "x.json"):
        with pytest.raises(Unconfined):
            within(tmp_path / "ns", outside)
