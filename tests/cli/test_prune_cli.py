"""fi-cache prune as a user runs it: plan, dry run, the question, exit codes, locks, SIGKILL."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fi_cache import environment
from fi_cache.cli import cli
from fi_cache.cli import prune as prune_cli
from fi_cache.environment import Environment, Gpu, VllmInfo
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import locks, trash
from fi_cache.store.in_use import IN_USE_NAME
from fi_cache.store.namespace import NAMESPACES_DIR
from tests.conftest import MOE_617_FUSED, MOE_617_UNFUSED, Result, no_hang
from tests.maintenance.test_prune import DAY, killed_import, make_namespace

cli.add_command(prune_cli.prune_command)  # the lead registers it in fi_cache/cli/__init__.py

NOW = time.time()
Run = Callable[..., Result]


@pytest.fixture
def spaces(store: Path) -> dict[str, Path]:
    """Four namespaces: used now, 10 days ago, 40 days ago (FlashInfer 0.6.17), 90 days ago."""
    return {
        "fresh": make_namespace(store, last_used=NOW),
        "week": make_namespace(store, cuda="13.0", last_used=NOW - 10 * DAY),
        "month": make_namespace(
            store, fi="0.6.17", fixture=MOE_617_FUSED, last_used=NOW - 40 * DAY
        ),
        "ancient": make_namespace(
            store,
            fi="0.6.17",
            fixture=MOE_617_UNFUSED,
            finalize="unfused",
            last_used=NOW - 90 * DAY,
        ),
    }


def ask(store: Path, answer: str, *args: str) -> Result:
    """Run prune as if at a terminal, answering the question with `answer`."""
    from fi_cache.cli import main

    with CliRunner().isolation(input=answer) as streams:
        try:
            main(["--store", str(store), *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return Result(code, streams[0].getvalue().decode(), streams[1].getvalue().decode())


def paths(doc: dict) -> list[str]:  # type: ignore[type-arg]
    return [row["path"] for row in doc["plan"]]


def test_dry_run_prints_exactly_what_apply_then_does(run: Run, spaces: dict[str, Path]) -> None:
    dry = run("--format", "json", "prune", "--older-than", "30d", "--dry-run")
    assert dry.code == 0, dry.err
    doc = dry.json()
    assert set(doc) >= {"plan", "tmp", "bytes", "skipped_locked", "applied"}
    assert doc["applied"] is False
    assert paths(doc) == [str(spaces["ancient"]), str(spaces["month"])]  # least recent first
    row = doc["plan"][0]
    assert set(row) == {"path", "size", "last_used", "reasons"}
    assert row["reasons"] == ["unused for 90d"] and row["last_used"].endswith("Z")
    assert doc["bytes"] == sum(r["size"] for r in doc["plan"])
    assert all(p.is_dir() for p in spaces.values())  # a dry run deletes nothing

    done = run("--format", "json", "prune", "--older-than", "30d", "--yes")
    assert done.code == 0, done.err
    after = done.json()
    assert after["applied"] is True
    assert paths(after) == paths(doc) and after["bytes"] == doc["bytes"]
    assert after["removed"] == paths(doc) and after["freed"] == doc["bytes"]
    assert not spaces["ancient"].exists() and not spaces["month"].exists()
    assert spaces["fresh"].is_dir() and spaces["week"].is_dir()


def test_human_plan_is_a_table_with_a_total(run: Run, store: Path, spaces: dict[str, Path]) -> None:
    r = run("prune", "--max-size", "20kB", "--dry-run")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "LAST", "USED", "SIZE", "REASON"]
    rel = str(spaces["ancient"].relative_to(store))
    assert lines[1].startswith(rel) and "over --max-size" in lines[1]
    assert len(lines) == 4  # ancient and month evicted: fresh + week fit in 20 kB
    assert lines[-1].startswith("2 namespaces, ") and lines[-1].endswith(" to free")


def test_max_size_evicts_least_recently_used(run: Run, spaces: dict[str, Path]) -> None:
    doc = run("--format", "json", "prune", "--max-size", "0", "--dry-run").json()
    order = ["ancient", "month", "week", "fresh"]
    assert paths(doc) == [str(spaces[n]) for n in order]
    one = sum(f.stat().st_size for f in spaces["fresh"].rglob("*") if f.is_file())
    doc = run("--format", "json", "prune", "--max-size", str(one), "--dry-run").json()
    assert paths(doc) == [str(spaces[n]) for n in order[:3]]


def test_no_selector_means_temp_files_only(run: Run, store: Path, spaces: dict[str, Path]) -> None:
    old = spaces["week"] / "vllm" / ".autotuner_dead.tmp"
    young = store / NAMESPACES_DIR / ".fi-cache-live.tmp"
    for f, age in ((old, 3600), (young, 10)):
        f.write_text("{")
        os.utime(f, (NOW - age, NOW - age))
    r = run("prune", "--dry-run")
    assert r.code == 0 and "temp files only" in r.out and "1 temp file, " in r.out
    r = run("--format", "json", "prune", "--yes")
    assert r.code == 0 and r.json()["tmp"] == [str(old)] and r.json()["plan"] == []
    assert not old.exists() and young.exists() and all(p.is_dir() for p in spaces.values())


def test_nothing_to_prune_exits_0_without_asking(run: Run, spaces: dict[str, Path]) -> None:
    r = run("prune", "--older-than", "1000d")
    assert r.code == 0 and "nothing to prune" in r.out
    r = run("--format", "json", "prune")
    assert r.code == 0 and r.json()["plan"] == [] and r.json()["bytes"] == 0


def test_no_terminal_and_no_yes_is_refused(run: Run, spaces: dict[str, Path]) -> None:
    r = run("prune", "--older-than", "30d")
    assert r.code == 2
    assert "--yes" in r.err and "--dry-run" in r.err and len(r.err.splitlines()) == 1
    assert "2 namespaces" in r.err
    assert all(p.is_dir() for p in spaces.values())
    r = run("--format", "json", "prune", "--older-than", "30d")
    assert r.code == 2 and r.json()["error"]["exit_code"] == 2


def test_at_a_terminal_it_asks(
    store: Path, spaces: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prune_cli, "_interactive", lambda: True)
    r = ask(store, "n\n", "prune", "--older-than", "30d")
    assert r.code == 1 and "Delete 2 namespaces" in r.err and "nothing deleted" in r.err
    assert "NAMESPACE" in r.out and spaces["ancient"].is_dir()
    r = ask(store, "y\n", "prune", "--older-than", "30d")
    assert r.code == 0, r.err
    assert "removed 2 namespaces" in r.out
    assert not spaces["ancient"].exists() and spaces["week"].is_dir()


@pytest.mark.parametrize(
    "args",
    [
        ["--older-than", "30"],
        ["--older-than", "soon"],
        ["--max-size", "20XB"],
        ["--max-size", "-5GB"],
        ["--older-than", "1y", "--dry-run"],
    ],
)
def test_bad_sizes_and_durations_exit_2(run: Run, spaces: dict[str, Path], args: list[str]) -> None:
    r = run("prune", *args)
    assert r.code == 2 and r.err.startswith("fi-cache: --") and len(r.err.splitlines()) == 1
    assert "Traceback" not in r.err


def _env(fi: str | None, gpus: tuple[str, ...]) -> Environment:
    return Environment(
        Fingerprint(flashinfer_version=fi, gpu=gpus[0] if gpus else None),
        tuple(Gpu(i, g, "9.0") for i, g in enumerate(gpus)),
        VllmInfo(None, None, None),
        None,
    )


def test_foreign_without_flashinfer_or_gpu_is_refused(
    run: Run, spaces: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env(None, ()))
    r = run("prune", "--foreign", "--yes")
    assert r.code == 2 and "without FlashInfer or a GPU" in r.err
    assert all(p.is_dir() for p in spaces.values())


def test_foreign_selects_other_flashinfer_versions_and_gpus(
    run: Run, store: Path, spaces: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a100 = make_namespace(store, gpu="NVIDIA A100-SXM4-80GB", last_used=NOW)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env("0.6.18", ("NVIDIA H200",)))
    doc = run("--format", "json", "prune", "--foreign", "--dry-run").json()
    assert sorted(paths(doc)) == sorted(str(p) for p in (spaces["ancient"], spaces["month"], a100))
    reasons = {row["path"]: row["reasons"] for row in doc["plan"]}
    assert reasons[str(a100)] == ["foreign: no NVIDIA A100-SXM4-80GB here"]
    assert reasons[str(spaces["month"])] == ["foreign: FlashInfer 0.6.17 (here: 0.6.18)"]


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_a_locked_namespace_is_never_touched(
    run: Run, spaces: dict[str, Path], monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    monkeypatch.setenv("FI_CACHE_LOCK", strategy)
    with locks.namespace_lock(spaces["ancient"], "warm", strategy=strategy):
        dry = run("--format", "json", "prune", "--older-than", "30d", "--dry-run").json()
        assert paths(dry) == [str(spaces["month"])]
        [skip] = dry["skipped_locked"]
        assert skip["path"] == str(spaces["ancient"])
        assert skip["holder"].startswith(f"warm by pid {os.getpid()} on host")
        human = run("prune", "--older-than", "30d", "--yes")
        assert human.code == 0 and "skipped" in human.err and "locked for warm" in human.err
    assert spaces["ancient"].is_dir() and not spaces["month"].exists()
    assert (spaces["ancient"] / "manifest.json").is_file()


def test_leftovers_of_killed_imports_and_pulls_are_pruned(
    run: Run, store: Path, spaces: dict[str, Path]
) -> None:
    dead = killed_import(store, age=3600)
    live = killed_import(store, age=60)  # an import still unpacking
    pull = store / ".fi-cache" / ".fi-cache-pull-42-abcdef.tar.gz.tmp"
    pull.parent.mkdir(exist_ok=True)
    pull.write_text("partial")
    past = time.time() - 3600
    os.utime(pull, (past, past))
    dry = run("prune", "--dry-run")
    assert dry.code == 0 and f"staging dir of a killed import {dead}  (1h old)" in dry.out
    assert "1 temp file and 1 staging dir, " in dry.out and str(live) not in dry.out
    r = run("--format", "json", "prune", "--yes")
    assert r.code == 0 and sorted(r.json()["tmp"]) == sorted([str(dead), str(pull)])
    assert not dead.exists() and not pull.exists() and live.is_dir()
    assert all(d.is_dir() for d in spaces.values())


def _flock_leftovers(spaces: dict[str, Path]) -> None:
    """The empty `.fi-cache.lock` the flock strategy leaves in each namespace it ever locked."""
    then = time.time() - DAY
    for d in spaces.values():
        (d / locks.LOCK_NAME).touch()
        os.utime(d / locks.LOCK_NAME, (then, then))


def test_lock_files_the_flock_strategy_left_are_not_locks_to_a_lockfile_prune(
    run: Run, spaces: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store moved to NFS (or FI_CACHE_LOCK=lockfile): not every namespace "locked"."""
    monkeypatch.setenv("FI_CACHE_LOCK", "lockfile")
    _flock_leftovers(spaces)
    r = run("--format", "json", "prune", "--older-than", "30d", "--yes")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["skipped_locked"] == [] and doc["failed"] == []
    assert doc["removed"] == [str(spaces["ancient"]), str(spaces["month"])]
    assert spaces["fresh"].is_dir() and not spaces["ancient"].exists()


@pytest.mark.parametrize("name", [locks.LOCK_NAME, locks.HOLDER_NAME, IN_USE_NAME])
def test_a_fifo_planted_as_a_lock_file_neither_hangs_a_dry_run_nor_the_prune(
    run: Run, spaces: dict[str, Path], name: str
) -> None:
    for ns in spaces.values():
        (ns / name).unlink(missing_ok=True)
        os.mkfifo(ns / name)  # an open() for reading would wait for a writer forever
    with no_hang():
        dry = run("--format", "json", "prune", "--older-than", "30d", "--dry-run")
        done = run("--format", "json", "prune", "--older-than", "30d", "--yes")
    assert dry.code == 0 and done.code == 0, dry.err + done.err
    old = [str(spaces["ancient"]), str(spaces["month"])]
    assert done.json()["removed"] == paths(dry.json()) == old


def test_a_read_only_store_says_once_that_it_cannot_be_pruned(
    run: Run, store: Path, spaces: dict[str, Path], read_only: Callable[[Path], None]
) -> None:
    _flock_leftovers(spaces)
    read_only(store)
    dry = run("prune", "--older-than", "30d", "--dry-run")
    assert dry.code == 0 and "locked" not in dry.err, dry.err
    assert "2 namespaces" in dry.out
    assert dry.err == f"fi-cache: {store}: cannot delete any of this: read-only file system\n"
    r = run("prune", "--older-than", "30d", "--yes")
    assert r.code == 2 and r.out == ""
    assert r.err == (
        f"fi-cache: {store}: cannot delete: read-only file system (--dry-run shows what would go)\n"
    )
    assert all(d.is_dir() for d in spaces.values())


# --- SIGKILL at random moments --------------------------------------------------------------------

_REGISTER = (
    "from fi_cache.cli import cli, main; from fi_cache.cli.prune import COMMANDS; "
    "[cli.add_command(c) for c in COMMANDS]; "
)
# Forks a fresh `fi-cache` process per request (argv as a JSON line) and prints its pid; on the
# next line it reaps the child and prints its wait status (so a pid is never reused while the test
# may still signal it). The interpreter starts once: a trial costs the prune, not 0.3 s.
_FORKER = (
    _REGISTER
    + """
import json, os, sys
for line in sys.stdin:
    argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        code = 1
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        finally:
            os._exit(code)  # never back into this loop
    print(pid, flush=True)
    sys.stdin.readline()
    print(os.waitpid(pid, 0)[1], flush=True)
"""
)
_LOCK_FILES = {locks.LOCK_NAME, locks.HOLDER_NAME}


def _build(store: Path, n: int) -> dict[Path, dict[str, bytes]]:
    """n small namespaces; returns each one's files (relative path -> bytes)."""
    fixtures = [MOE_617_FUSED, MOE_617_UNFUSED]
    made = {}
    for i in range(n):
        d = make_namespace(store, cuda=f"12.{i}", fixture=fixtures[i % 2], last_used=NOW - DAY)
        (d / "vllm" / "extra.json").write_bytes(os.urandom(64))
        made[d] = {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    return made


def _check_whole_or_gone(store: Path, made: dict[Path, dict[str, bytes]]) -> int:
    """Every namespace is whole (its files byte-identical) or gone; returns how many are gone."""
    present = {Path(p) for p in _namespace_dirs(store)}
    assert present <= set(made), present - set(made)
    for d in present:
        files = {str(p.relative_to(d)): p for p in d.rglob("*") if p.is_file()}
        extra = set(files) - set(made[d])
        assert extra <= _LOCK_FILES, (d, extra)  # a lock taken just before the kill
        for rel, data in made[d].items():
            assert rel in files, (d, rel)
            assert files[rel].read_bytes() == data, (d, rel)
    return len(made) - len(present)


def _namespace_dirs(store: Path) -> list[str]:
    root = store / NAMESPACES_DIR
    return [str(p) for p in root.glob("*/*/*/*") if p.is_dir()] if root.is_dir() else []


def test_sigkill_at_random_moments_leaves_each_namespace_whole_or_gone(
    run: Run, store: Path, tmp_path: Path
) -> None:
    rng = random.Random(20240611)
    argv = ["--store", str(store), "-q", "prune", "--older-than", "0s", "--yes"]
    template = tmp_path / "template"
    made = {store / d.relative_to(template): files for d, files in _build(template, 5).items()}
    # Once through a fresh interpreter, as a user runs it.
    shutil.copytree(template, store)
    cmd = [sys.executable, "-c", _REGISTER + "main()", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and _namespace_dirs(store) == [], done.stderr
    forker = subprocess.Popen(
        [sys.executable, "-c", _FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert forker.stdin is not None and forker.stdout is not None
    trials, partial, killed = 0, 0, 0
    full = 0.0
    try:
        while (trials < 60 or killed < 50) and trials < 150:
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(template, store)
            forker.stdin.write(json.dumps(argv) + "\n")
            forker.stdin.flush()
            pid = int(forker.stdout.readline())
            t0 = time.monotonic()
            if trials % 2:
                time.sleep(rng.uniform(0, full * 1.2))  # anywhere: start, scan, apply
            elif trials:
                trash_dir = store / trash.TRASH_DIR  # made by the first deletion: aim at apply
                while not trash_dir.exists() and time.monotonic() - t0 < 5:
                    time.sleep(0.0002)
                time.sleep(rng.uniform(0, full / 2))
            if trials:  # trial 0 runs whole, to time the others
                os.kill(pid, signal.SIGKILL)  # not reaped yet: a zombie at worst, never reused
            forker.stdin.write("reap\n")
            forker.stdin.flush()
            status = int(forker.stdout.readline())
            if trials == 0:
                full = time.monotonic() - t0
                assert status == 0, status
            elif not os.WIFSIGNALED(status):
                full *= 0.8  # it finished before the kill: trial 0 ran slow (a loaded machine)
            killed += os.WIFSIGNALED(status)
            gone = _check_whole_or_gone(store, made)
            partial += 0 < gone < len(made)
            trials += 1
            if trials % 10 == 0:  # and a later prune finishes the job, trash included
                r = run("-q", "prune", "--older-than", "0s", "--yes")
                assert r.code == 0, r.err
                assert _namespace_dirs(store) == [] and trash.trash_leftovers(store) == []
    finally:
        forker.stdin.close()
        forker.wait(timeout=10)
    assert killed >= 50 and partial >= 5, (killed, partial)
