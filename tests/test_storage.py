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


# --- Races with a namespace being replaced (import) ----------------------------------------------


def test_concurrent_lock_strategy_probes_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe must not take another process's probe lock for a filesystem that ignores flock."""
    import fcntl

    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    other = os.open(tmp_path / f"{storage.TMP_PREFIX}flock-probe", os.O_CREAT | os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)  # what a concurrent probe under the old fixed name held
    try:
        assert storage.lock_strategy(tmp_path)[0] == "flock"
    finally:
        os.close(other)


def _staged(tmp_path: Path, text: str) -> Path:
    new = tmp_path / "stage" / "ns"
    new.mkdir(parents=True)
    (new / "autotune_configs.json").write_text(text)
    return new


def test_install_retries_when_a_newcomer_recreates_the_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target = tmp_path / "s", tmp_path / "s" / "namespaces" / "ns"
    target.mkdir(parents=True)
    (target / "autotune_configs.json").write_text("old")
    new = _staged(tmp_path, "new")
    real_replace, newcomers = os.replace, []

    def replace(src: object, dst: object) -> None:
        if Path(str(src)) == new and not newcomers:  # a warm arrives while target is absent
            target.mkdir()
            (target / storage.LOCK_NAME).touch()
            newcomers.append(target)
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    storage.install_dir(new, target, store)
    assert newcomers and (target / "autotune_configs.json").read_text() == "new"
    assert list((store / storage.TRASH_DIR).iterdir()) == []


def test_failed_install_puts_the_old_namespace_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target = tmp_path / "s", tmp_path / "s" / "namespaces" / "ns"
    target.mkdir(parents=True)
    (target / "autotune_configs.json").write_text("old")
    new = _staged(tmp_path, "new")
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        if Path(str(src)) == new:
            raise OSError(18, "Invalid cross-device link")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        storage.install_dir(new, target, store)
    assert (target / "autotune_configs.json").read_text() == "old"


def test_lock_retries_when_its_dir_is_moved_before_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    real_open, moved = os.open, []

    def open_(path: object, *a: object, **k: object) -> int:
        if str(path).endswith(storage.LOCK_NAME) and not moved:
            moved.append(d.rename(tmp_path / "aside"))  # an import swaps the dir just now
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    with storage.namespace_lock(d, "warm", timeout=2, strategy="flock"):
        assert moved and (d / storage.LOCK_NAME).exists()


def test_trash_deletion_outlasts_a_late_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create that looked the dir up before it was moved lands in the trash afterwards."""
    import shutil

    doomed = tmp_path / "doomed"
    doomed.mkdir()
    real_rmtree, late = shutil.rmtree, []

    def rmtree(path: object, ignore_errors: bool = False) -> None:
        real_rmtree(path, ignore_errors=ignore_errors)  # type: ignore[arg-type]
        if not late:
            doomed.mkdir()
            late.append((doomed / ".fi-cache-late.tmp").touch())

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    storage._delete_tree(doomed)
    assert late and not doomed.exists()


def test_prune_lock_refuses_a_namespace_replaced_since_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    d.mkdir()
    real_open = os.open

    def open_(path: object, *a: object, **k: object) -> int:
        fd = real_open(path, *a, **k)  # type: ignore[arg-type]
        if str(path).endswith(storage.LOCK_NAME):
            d.rename(tmp_path / "old")  # an import installs a new namespace just now
            d.mkdir()
        return fd

    monkeypatch.setattr(os, "open", open_)
    with (
        pytest.raises(storage.NamespaceBusy),
        storage.try_namespace_lock(d, "prune", "flock"),
    ):
        pass
