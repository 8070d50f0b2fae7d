"""The one writer: atomic replace, and namespace locks with a named holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import files, install, locks, trash
from fi_cache.store.trash import TRASH_DIR


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
    with pytest.raises(OSError):
        files.atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert len(list(tmp_path.iterdir())) == 2  # the file and its lock, no temp left


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_lock_timeout_names_the_holder(tmp_path: Path, strategy: str) -> None:
    seen = []
    with (
        locks.namespace_lock(tmp_path, "warm", strategy=strategy),
        pytest.raises(FiCacheError, match=f"waiting for warm by pid {os.getpid()} on host"),
        locks.namespace_lock(tmp_path, "other", 0.3, seen.append, strategy),
    ):
        pass
    assert seen and seen[0] is not None and seen[0].purpose == "warm"
    with locks.namespace_lock(tmp_path, "again", timeout=0.3, strategy=strategy):
        pass  # released on exit


def test_lockfile_of_a_dead_holder_on_this_host_is_recovered(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))
    with locks.namespace_lock(tmp_path, "warm", timeout=1, strategy="lockfile") as me:
        assert me.pid == os.getpid()


def test_lockfile_of_another_host_is_not_broken(tmp_path: Path) -> None:
    holder = {"pid": 1, "host": "elsewhere", "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))
    with (
        pytest.raises(FiCacheError, match="on host elsewhere"),
        locks.namespace_lock(tmp_path, "warm", timeout=0.2, strategy="lockfile"),
    ):
        pass


def test_local_filesystem_uses_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    kind, why = locks.lock_strategy(tmp_path)
    assert kind == "flock" and "honours flock" in why


def test_network_filesystems_use_a_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    monkeypatch.setattr(locks, "filesystem_type", lambda p: "nfs4")
    assert locks.lock_strategy(tmp_path)[0] == "lockfile"
    monkeypatch.setenv("FI_CACHE_LOCK", "flock")
    assert locks.lock_strategy(tmp_path) == ("flock", "set by FI_CACHE_LOCK")


def test_waiters_on_a_dead_holders_lockfile_take_it_one_at_a_time(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))
    code = (
        "import os, sys, time; from pathlib import Path; from fi_cache.store import locks\n"
        "d = Path(sys.argv[1])\n"
        "with locks.namespace_lock(d, 'w', 30, strategy='lockfile'):\n"
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
    assert not (tmp_path / locks.LOCK_NAME).exists()


# --- Races with a namespace being replaced (import) ----------------------------------------------


def test_concurrent_lock_strategy_probes_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe must not take another process's probe lock for a filesystem that ignores flock."""
    import fcntl

    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    other = os.open(tmp_path / f"{files.TMP_PREFIX}flock-probe", os.O_CREAT | os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)  # what a concurrent probe under the old fixed name held
    try:
        assert locks.lock_strategy(tmp_path)[0] == "flock"
    finally:
        os.close(other)


def _staged(tmp_path: Path, text: str) -> Path:
    new = tmp_path / "stage" / "ns"
    new.mkdir(parents=True)
    (new / "autotune_configs.json").write_text(text)
    return new


def _namespace(tmp_path: Path, text: str = "old") -> tuple[Path, Path]:
    store, target = tmp_path / "s", tmp_path / "s" / "namespaces" / "h200" / "ns"
    target.mkdir(parents=True)
    (target / "autotune_configs.json").write_text(text)
    return store, target


@pytest.fixture
def two_renames(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without an atomic exchange (NFS): install_dir's two-rename path (with flock,
    which these tests' lock holders use, whatever filesystem the tests run on)."""
    monkeypatch.setattr(install, "_exchange", lambda a, b: False)
    monkeypatch.setenv("FI_CACHE_LOCK", "flock")


# Linux filesystems whose rename supports RENAME_EXCHANGE: there, fi-cache must use it.
_EXCHANGING_FS = ("ext4", "ext3", "ext2", "xfs", "btrfs", "tmpfs", "overlay", "f2fs")


def _exchange_expected(tmp_path: Path) -> bool:
    return sys.platform == "linux" and locks.filesystem_type(tmp_path) in _EXCHANGING_FS


def test_install_swaps_in_one_step_where_the_filesystem_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an exchange the namespace never stops existing: whoever arrives mid-import finds
    the old one or the new one, never a gap in which to create an empty one."""
    if not _exchange_expected(tmp_path):
        pytest.skip(f"{locks.filesystem_type(tmp_path)}: no renameat2 RENAME_EXCHANGE known")
    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")
    real_to_trash, seen = trash.to_trash, []

    def to_trash(path: Path, store_: Path, name: str) -> Path:
        seen.append((target / "autotune_configs.json").read_text())  # the moment after the swap
        return real_to_trash(path, store_, name)

    monkeypatch.setattr(trash, "to_trash", to_trash)
    install.install_dir(new, target, store)
    assert seen == ["new"] and (target / "autotune_configs.json").read_text() == "new"
    assert not new.exists() and list((store / TRASH_DIR).iterdir()) == []


T = TypeVar("T")


def _in_the_gap(monkeypatch: pytest.MonkeyPatch, new: Path, what: Callable[[], T]) -> list[T]:
    """Run `what` once, just as install_dir moves `new` into place (between its two renames,
    the old namespace already aside); returns [what's result] once it has run."""
    real_replace, ran = os.replace, list[T]()

    def replace(src: object, dst: object) -> None:
        if Path(str(src)) == new and not ran:
            ran.append(what())
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    return ran


@pytest.mark.usefixtures("two_renames")
def test_install_retries_when_a_newcomer_recreates_the_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")

    def newcomer() -> None:  # a warm arrives while target is absent
        target.mkdir()
        (target / locks.LOCK_NAME).touch()

    ran = _in_the_gap(monkeypatch, new, newcomer)
    install.install_dir(new, target, store)
    assert ran and (target / "autotune_configs.json").read_text() == "new"
    assert list((store / TRASH_DIR).iterdir()) == []


@pytest.mark.usefixtures("two_renames")
def test_install_outwaited_by_a_newcomer_says_where_the_old_namespace_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm that recreated the namespace in the gap and holds it past the lock timeout: the
    import fails with one line naming where the namespace it was replacing is kept."""
    import fcntl
    import re

    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")

    def newcomer() -> int:
        target.mkdir()
        fd = os.open(target / locks.LOCK_NAME, os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # the warm's lock, held throughout
        return fd

    held = _in_the_gap(monkeypatch, new, newcomer)
    try:
        with pytest.raises(FiCacheError, match="the namespace as it was is in ") as exc:
            install.install_dir(new, target, store, timeout=0.3)
    finally:
        os.close(held[0])
    found = re.search(r" is in (\S+) \(kept 1 h from prune\)$", exc.value.message)
    assert found, exc.value.message
    kept = Path(found.group(1))
    assert kept.parent == store / TRASH_DIR
    assert (kept / "autotune_configs.json").read_text() == "old"
    assert trash.trash_entry_in_use(kept, time.time())  # prune leaves it alone for now


@pytest.mark.usefixtures("two_renames")
def test_install_survives_a_prune_removing_the_emptied_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the two renames a prune of the only sibling removes the empty parent dirs."""
    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")
    pruned = _in_the_gap(monkeypatch, new, target.parent.rmdir)  # what remove_empty_parents does
    install.install_dir(new, target, store)
    assert pruned and (target / "autotune_configs.json").read_text() == "new"


@pytest.mark.usefixtures("two_renames")
def test_failed_install_puts_the_old_namespace_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")

    def cross_device() -> None:
        raise OSError(18, "Invalid cross-device link")

    _in_the_gap(monkeypatch, new, cross_device)
    with pytest.raises(OSError):
        install.install_dir(new, target, store)
    assert (target / "autotune_configs.json").read_text() == "old"


def test_a_lock_leaves_a_holder_file_it_did_not_write(tmp_path: Path) -> None:
    """After an import swapped the dir, the holder file there is the newcomer's: keep it."""
    with locks.namespace_lock(tmp_path, "import", strategy="flock"):
        theirs = tmp_path / "theirs"
        theirs.write_text('{"pid": 1, "host": "h", "since": 0, "purpose": "warm"}')
        os.replace(theirs, tmp_path / locks.HOLDER_NAME)
    assert (tmp_path / locks.HOLDER_NAME).exists()
    with locks.namespace_lock(tmp_path, "warm", strategy="flock"):
        pass
    assert not (tmp_path / locks.HOLDER_NAME).exists()  # its own is removed


def test_a_dead_holders_lock_that_cannot_be_moved_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's lock file in a sticky dir: waiting ends at the timeout, no busy loop."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))

    def rename(*a: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "rename", rename)
    import threading

    seen: list[BaseException] = []

    def take() -> None:
        try:
            with locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"):
                pass
        except BaseException as exc:  # the test looks at it
            seen.append(exc)

    waiter = threading.Thread(target=take, daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive(), "still trying to take the lock after 10 s"
    assert len(seen) == 1 and isinstance(seen[0], FiCacheError)
    assert "timed out after 0s" in str(seen[0])


def test_install_into_a_served_namespace_is_refused(tmp_path: Path) -> None:
    """A running `fi-cache serve` marks its namespace in use; swapping the dir would carry the
    mark away (and let prune delete what the server uses)."""
    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")
    fd = locks.hold_in_use(target)
    assert fd is not None
    try:
        with pytest.raises(FiCacheError, match="in use by a running `fi-cache serve`"):
            install.install_dir(new, target, store)
    finally:
        os.close(fd)
    assert (target / "autotune_configs.json").read_text() == "old" and new.is_dir()


@pytest.mark.parametrize("trash", ["a-file", "read-only"])
def test_install_refuses_a_store_whose_trash_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trash: str
) -> None:
    """Checked before anything moves: the old namespace must have somewhere to go."""
    import tempfile

    store, target = _namespace(tmp_path)
    new = _staged(tmp_path, "new")
    if trash == "a-file":
        (store / TRASH_DIR).write_text("not a dir")
    else:  # another user's 0755 `.trash` in a shared store (root, running this, writes anyway)
        (store / TRASH_DIR).mkdir()
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*a: Any, **k: Any) -> Any:
            if Path(str(k.get("dir"))) == store / TRASH_DIR:
                raise PermissionError(13, "Permission denied")
            return real_mkstemp(*a, **k)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    words = {"a-file": "cannot create directory", "read-only": "store is not writable"}[trash]
    with pytest.raises(Refused, match=words):
        install.install_dir(new, target, store)
    assert (target / "autotune_configs.json").read_text() == "old" and new.is_dir()


def test_lock_retries_when_its_dir_is_moved_before_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    real_open, moved = os.open, []

    def open_(path: object, *a: object, **k: object) -> int:
        if str(path).endswith(locks.LOCK_NAME) and not moved:
            moved.append(d.rename(tmp_path / "aside"))  # an import swaps the dir just now
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    with locks.namespace_lock(d, "warm", timeout=2, strategy="flock"):
        assert moved and (d / locks.LOCK_NAME).exists()


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
    trash.delete_tree(doomed)
    assert late and not doomed.exists()


def test_prune_lock_refuses_a_namespace_replaced_since_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    d.mkdir()
    real_open = os.open

    def open_(path: object, *a: object, **k: object) -> int:
        fd = real_open(path, *a, **k)  # type: ignore[arg-type]
        if str(path).endswith(locks.LOCK_NAME):
            d.rename(tmp_path / "old")  # an import installs a new namespace just now
            d.mkdir()
        return fd

    monkeypatch.setattr(os, "open", open_)
    with (
        pytest.raises(locks.NamespaceBusy),
        locks.try_namespace_lock(d, "prune", "flock"),
    ):
        pass


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_prune_lock_on_a_namespace_moved_away_is_busy_not_an_error(
    tmp_path: Path, strategy: str
) -> None:
    """Between prune's look and its lock an import (two renames) moved the dir: skip it."""
    with (
        pytest.raises(locks.NamespaceBusy),
        locks.try_namespace_lock(tmp_path / "gone", "prune", strategy),
    ):
        pass
