"""The one writer: atomic replace, and namespace locks with a named holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache import storage
from fi_cache.errors import FiCacheError


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a" / "f.json"
    storage.atomic_write(target, b"one")
    storage.atomic_write(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two" and (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(storage.TMP_PREFIX)] == []


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.json"
    storage.atomic_write(target, b"old")

    def boom(*a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        storage.atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert len(list(tmp_path.iterdir())) == 2  # the file and its lock, no temp left


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_lock_timeout_names_the_holder(tmp_path: Path, strategy: str) -> None:
    seen = []
    with (
        storage.namespace_lock(tmp_path, "warm", strategy=strategy),
        pytest.raises(FiCacheError, match=f"waiting for warm by pid {os.getpid()} on host"),
        storage.namespace_lock(tmp_path, "other", 0.3, seen.append, strategy),
    ):
        pass
    assert seen and seen[0] is not None and seen[0].purpose == "warm"
    with storage.namespace_lock(tmp_path, "again", timeout=0.3, strategy=strategy):
        pass  # released on exit


def test_lockfile_of_a_dead_holder_on_this_host_is_recovered(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / storage.LOCK_NAME).write_text(json.dumps(holder))
    with storage.namespace_lock(tmp_path, "warm", timeout=1, strategy="lockfile") as me:
        assert me.pid == os.getpid()


def test_lockfile_of_another_host_is_not_broken(tmp_path: Path) -> None:
    holder = {"pid": 1, "host": "elsewhere", "since": 0.0, "purpose": "warm"}
    (tmp_path / storage.LOCK_NAME).write_text(json.dumps(holder))
    with (
        pytest.raises(FiCacheError, match="on host elsewhere"),
        storage.namespace_lock(tmp_path, "warm", timeout=0.2, strategy="lockfile"),
    ):
        pass


def test_local_filesystem_uses_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    kind, why = storage.lock_strategy(tmp_path)
    assert kind == "flock" and "honours flock" in why


def test_network_filesystems_use_a_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    monkeypatch.setattr(storage, "filesystem_type", lambda p: "nfs4")
    assert storage.lock_strategy(tmp_path)[0] == "lockfile"
    monkeypatch.setenv("FI_CACHE_LOCK", "flock")
    assert storage.lock_strategy(tmp_path) == ("flock", "set by FI_CACHE_LOCK")


def test_waiters_on_a_dead_holders_lockfile_take_it_one_at_a_time(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / storage.LOCK_NAME).write_text(json.dumps(holder))
    code = (
        "import os, sys, time; from pathlib import Path; from fi_cache import storage\n"
        "d = Path(sys.argv[1])\n"
        "with storage.namespace_lock(d, 'w', 30, strategy='lockfile'):\n"
        "    try:\n"
        "        fd = os.open(d / 'inside', os.O_CREAT | os.O_EXCL)\n"
        "    except FileExistsError:\n"
        "        sys.exit(3)\n"
        "    time.sleep(0.2); os.close(fd); os.unlink(d / 'inside')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env) for _ in range(6)
    ]
    assert [p.wait(60) for p in procs] == [0] * 6
    assert not (tmp_path / storage.LOCK_NAME).exists()
