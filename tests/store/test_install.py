"""fi_cache/store/install.py: an import swaps a namespace in whole, whatever races it (renameat2
exchange, the two-rename fallback, newcomers, prunes, a served namespace, an unusable trash)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import install, locks, trash
from fi_cache.store.trash import TRASH_DIR


class Swap(NamedTuple):
    store: Path
    target: Path  # the store's namespace: its cache file says "old"
    new: Path  # the import's staged namespace: its cache file says "new"


@pytest.fixture
def swap(tmp_path: Path) -> Swap:
    """An import about to swap a staged namespace in for the one a store has."""
    store, target = tmp_path / "s", tmp_path / "s" / "namespaces" / "h200" / "ns"
    new = tmp_path / "stage" / "ns"
    for where, text in ((target, "old"), (new, "new")):
        where.mkdir(parents=True)
        (where / "autotune_configs.json").write_text(text)
    return Swap(store, target, new)


# Linux filesystems whose rename supports RENAME_EXCHANGE: there, fi-cache must use it.
_EXCHANGING_FS = ("ext4", "ext3", "ext2", "xfs", "btrfs", "tmpfs", "overlay", "f2fs")


@pytest.fixture
def two_renames(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without an atomic exchange (NFS): install_dir's two-rename path (with flock,
    which these tests' lock holders use, whatever filesystem the tests run on)."""
    monkeypatch.setattr(install, "_exchange", lambda a, b: False)
    monkeypatch.setenv("FI_CACHE_LOCK", "flock")


def _exchange_expected(where: Path) -> bool:
    return sys.platform == "linux" and locks.filesystem_type(where) in _EXCHANGING_FS


def test_install_swaps_in_one_step_where_the_filesystem_can(
    swap: Swap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an exchange the namespace never stops existing: whoever arrives mid-import finds
    the old one or the new one, never a gap in which to create an empty one."""
    store, target, new = swap
    if not _exchange_expected(store):
        pytest.skip(f"{locks.filesystem_type(store)}: no renameat2 RENAME_EXCHANGE known")
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
    swap: Swap, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target, new = swap

    def newcomer() -> None:  # a warm arrives while target is absent
        target.mkdir()
        (target / locks.LOCK_NAME).touch()

    ran = _in_the_gap(monkeypatch, new, newcomer)
    install.install_dir(new, target, store)
    assert ran and (target / "autotune_configs.json").read_text() == "new"
    assert list((store / TRASH_DIR).iterdir()) == []


@pytest.mark.usefixtures("two_renames")
def test_install_outwaited_by_a_newcomer_says_where_the_old_namespace_is(
    swap: Swap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm that recreated the namespace in the gap and holds it past the lock timeout: the
    import fails with one line naming where the namespace it was replacing is kept."""
    import fcntl
    import re

    store, target, new = swap

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
    swap: Swap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the two renames a prune of the only sibling removes the empty parent dirs."""
    store, target, new = swap
    pruned = _in_the_gap(monkeypatch, new, target.parent.rmdir)  # what remove_empty_parents does
    install.install_dir(new, target, store)
    assert pruned and (target / "autotune_configs.json").read_text() == "new"


@pytest.mark.usefixtures("two_renames")
def test_failed_install_puts_the_old_namespace_back(
    swap: Swap, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, target, new = swap

    def cross_device() -> None:
        raise OSError(18, "Invalid cross-device link")

    _in_the_gap(monkeypatch, new, cross_device)
    with pytest.raises(OSError):
        install.install_dir(new, target, store)
    assert (target / "autotune_configs.json").read_text() == "old"


def test_install_into_a_served_namespace_is_refused(swap: Swap) -> None:
    """A running `fi-cache serve` marks its namespace in use; swapping the dir would carry the
    mark away (and let prune delete what the server uses)."""
    store, target, new = swap
    trusted, fd = locks.hold_in_use(target)
    assert trusted and fd is not None
    try:
        with pytest.raises(FiCacheError, match="in use by a running `fi-cache serve`"):
            install.install_dir(new, target, store)
    finally:
        os.close(fd)
    assert (target / "autotune_configs.json").read_text() == "old" and new.is_dir()
    assert not (store / TRASH_DIR).exists()  # refused: nothing made that it did not need


@pytest.mark.parametrize("trash", ["a-file", "read-only"])
def test_install_refuses_a_store_whose_trash_it_cannot_use(
    swap: Swap, monkeypatch: pytest.MonkeyPatch, trash: str
) -> None:
    """Checked before anything moves: the old namespace must have somewhere to go."""
    import tempfile

    store, target, new = swap
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


def test_a_full_disk_while_unpacking_is_a_storage_failure_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import io

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "staging" / "autotune_configs.json"
    with pytest.raises(FiCacheError) as info:
        install.write_member(target, io.BytesIO(b"{}" * 10), 20)
    assert not isinstance(info.value, Refused) and info.value.exit_code == 1
    assert info.value.path == str(target) and "No space left on device" in info.value.message


def test_a_failed_read_of_the_bundle_stays_the_bundles_fault(tmp_path: Path) -> None:
    import tarfile

    class Broken:
        def read(self, size: int) -> bytes:
            raise OSError(5, "Input/output error")

    with pytest.raises(tarfile.ReadError):  # import turns it into "bundle could not be read"
        install.write_member(tmp_path / "f.json", Broken(), 20)  # type: ignore[arg-type]
