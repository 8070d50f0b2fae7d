"""fi_cache/store/files.py: an atomic replace leaves the old file or the new one, no temp file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fi_cache.errors import EXIT_PROBLEM, EXIT_REFUSED, FiCacheError, Refused
from fi_cache.store import files
from tests.conftest import GEMM_618, SPECIAL_KINDS, make_special, no_hang


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a" / "f.json"
    files.atomic_write(target, b"one")
    files.atomic_write(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two" and (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(files.TMP_PREFIX)] == []


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.json"
    files.atomic_write(target, b"old")

    def boom(*a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(FiCacheError) as info:  # one line naming the file, exit 1 (storage)
        files.atomic_write(target, b"new")
    assert info.value.path == str(target) and info.value.exit_code == EXIT_PROBLEM
    assert "No space left on device" in info.value.message
    assert target.read_bytes() == b"old"
    assert len(list(tmp_path.iterdir())) == 2  # the file and its lock, no temp left


def test_prune_empty_removes_links_and_empty_dirs_only(tmp_path: Path) -> None:
    from fi_cache.store.files import prune_empty

    theirs = tmp_path / "theirs"
    (theirs / "torch_compile_cache").mkdir(parents=True)
    (theirs / "torch_compile_cache" / "kept").write_text("x")
    root = tmp_path / "ns" / "sglang"
    (root / "flashinfer" / "autotune" / "0.6.18").mkdir(parents=True)
    (root / "torch_compile_cache").symlink_to(theirs / "torch_compile_cache")
    prune_empty(root)
    assert not root.exists() and (theirs / "torch_compile_cache" / "kept").exists()
    (root / "flashinfer").mkdir(parents=True)
    (root / "flashinfer" / "rank_tp0_pp0_dp0.json").write_text("{}")
    prune_empty(root)
    assert (root / "flashinfer" / "rank_tp0_pp0_dp0.json").exists()  # a file: all of it stays


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_atomic_write_refuses_to_replace_what_is_no_regular_file(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "out.json"
    still = make_special(target, kind)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(Refused) as info:  # exit 2, one line naming the path
        files.atomic_write(target, b"data")
    assert info.value.path == str(target) and info.value.exit_code == EXIT_REFUSED
    assert still() and sorted(p.name for p in tmp_path.iterdir()) == before  # no lock, no temp


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux /proc")
def test_a_lock_file_that_cannot_be_made_is_refused_at_once(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """/proc/self/status is a regular file no lock file can sit beside: filelock retried that
    for its whole timeout (60 s for `merge -o`), then said it timed out."""
    with no_hang(5.0), pytest.raises(Refused) as info, files.locked(Path("/proc/self/status")):
        pass
    assert info.value.exit_code == EXIT_REFUSED and info.value.path == "/proc/self/status"
    assert "cannot create its lock file .status.lock" in info.value.message
    with no_hang(5.0):
        result = run("merge", GEMM_618, "-o", "/proc/self/status")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert result.err.startswith("fi-cache: /proc/self/status: cannot write here")


def test_create_new_writes_only_where_nothing_is_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """A seed placed while the engine starts: the engine's own file, saved first, stays."""
    from fi_cache.store.files import create_new, stamp_of

    target = tmp_path / "hash" / "autotune_configs.json"
    stamp = create_new(target, b'{"a": 1}')
    assert stamp is not None and stamp == stamp_of(target) and target.read_bytes() == b'{"a": 1}'
    assert create_new(target, b'{"b": 2}') is None and target.read_bytes() == b'{"a": 1}'
    assert sorted(p.name for p in target.parent.iterdir()) == ["autotune_configs.json"]


@pytest.mark.parametrize("command", ["evict", "merge -o", "locked"])
def test_a_symlink_at_a_lock_name_is_refused_and_nothing_is_made_at_its_target(
    run,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    command: str,
) -> None:
    cache = tmp_path / "c2.json"
    cache.write_bytes(GEMM_618.read_bytes())
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / ".c2.json.lock").symlink_to(victim / "new1")  # dangling: O_CREAT would make it
    if command == "locked":
        with (
            pytest.raises(Refused, match=r"lock file \.c2\.json\.lock is a symlink"),
            files.locked(cache),
        ):
            pass
    else:
        argv = (
            ["evict", cache, "--tactic", "0"]
            if command == "evict"
            else ["merge", GEMM_618, "-o", cache]
        )
        result = run(*argv)
        assert result.code == 2 and result.err.count("\n") == 1, result.err
        assert "is a symlink" in result.err
    assert not (victim / "new1").exists() and list(victim.iterdir()) == []
    assert cache.read_bytes() == GEMM_618.read_bytes()


# --- a file's lock follows the store's strategy: a lock file where flock is not trusted ----------


def _on_nfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What /proc/mounts says of a shared store: an NFS mount, where flock is not trusted."""
    from fi_cache.store import locks

    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    monkeypatch.setattr(locks, "filesystem_type", lambda p: "nfs4")


def test_on_nfs_a_write_waits_for_the_lock_file_another_host_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hosts' `merge -o` of one file on a shared NFS store: host B's lock file is all host A
    can see (its flock is B's own); A waits, names B, and writes nothing."""
    _on_nfs(monkeypatch)
    out = tmp_path / "merged.json"
    out.write_bytes(b"B is writing")
    lock = tmp_path / ".merged.json.lock"
    theirs = {"pid": 4242, "host": "node-b", "since": 0.0, "purpose": "writing merged.json"}
    lock.write_text(json.dumps(theirs))
    with pytest.raises(FiCacheError) as info:
        files.atomic_write(out, b"A's merge", timeout=0.3)
    assert info.value.path == str(out) and info.value.exit_code == EXIT_PROBLEM
    assert "timed out after 0s waiting for writing merged.json by pid 4242 on host node-b" in (
        info.value.message
    )
    assert out.read_bytes() == b"B is writing" and json.loads(lock.read_text()) == theirs


def test_on_nfs_two_writers_of_one_file_take_turns_by_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file names its holder (what another host's writer is told), and is gone after."""
    _on_nfs(monkeypatch)
    out = tmp_path / "merged.json"
    lock = tmp_path / ".merged.json.lock"
    with files.locked(out):
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["purpose"] == "writing merged.json"
        with pytest.raises(
            FiCacheError, match=f"waiting for writing merged.json by pid {os.getpid()}"
        ):
            files.atomic_write(out, b"second", timeout=0.2)
    assert not lock.exists() and not out.exists()
    files.atomic_write(out, b"second", timeout=0.2)
    assert out.read_bytes() == b"second" and sorted(p.name for p in tmp_path.iterdir()) == [
        "merged.json"
    ]


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_a_writer_killed_holding_a_files_lock_leaves_no_stale_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """A `merge -o` SIGKILLed mid-write: the next one takes the lock at once, either strategy."""
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    monkeypatch.setenv("FI_CACHE_LOCK", strategy)
    out = tmp_path / "merged.json"
    code = (
        "import sys, time; from pathlib import Path; from fi_cache.store import files\n"
        "with files.locked(Path(sys.argv[1])):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(FiCacheError, match="timed out after 0s waiting for"):
            files.atomic_write(out, b"while held", timeout=0.2)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    files.atomic_write(out, b"after", timeout=0.5)
    assert out.read_bytes() == b"after"


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_what_no_lock_makes_at_a_files_lock_name_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, kind: str
) -> None:
    """Either strategy: nothing is made at a link's target, a FIFO never makes the lock wait."""
    monkeypatch.setenv("FI_CACHE_LOCK", strategy)
    out = tmp_path / "merged.json"
    lock = tmp_path / ".merged.json.lock"
    victim = tmp_path / "victim"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(victim)  # dangling: O_CREAT would make it
    with no_hang(5.0), pytest.raises(Refused) as info:
        files.atomic_write(out, b"data", timeout=2)
    what = "a symlink: refusing to follow it" if kind == "symlink" else "a FIFO: not a lock file"
    assert info.value.path == str(out) and info.value.exit_code == EXIT_REFUSED
    assert info.value.message == f"cannot write here: its lock file .merged.json.lock is {what}"
    assert not victim.exists() and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".merged.json.lock"]
