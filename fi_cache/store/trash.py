"""Deleting from the store (prune, import): one rename into `<store>/.trash/`, then the deletion.

A namespace leaves the store in one rename (atomic on one filesystem) and only then is deleted,
so a prune killed at any moment leaves each namespace either whole under namespaces/ or gone
from it. What a killed prune left in the trash is emptied later.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store.files import check_writable, ensure_dir, fsync_dir, remove_file

TRASH_DIR = ".trash"
INSTALLING_PREFIX = "installing-"
INSTALLING_KEEP_S = 3600.0  # an install moves its old dir back on failure: prune waits this long


def remove_tree(path: Path, store: Path) -> None:
    """Delete the directory `path` inside `store`: one atomic rename into `<store>/.trash/`,
    then the deletion. Raises Refused when it cannot be moved (nothing was removed then) and
    FiCacheError when it was moved but not fully deleted (empty_trash retries later)."""
    trash = store / TRASH_DIR
    ensure_dir(trash)
    dest = trash / f"{time.time_ns()}-{os.getpid()}-{path.name}"
    try:
        os.replace(path, dest)
    except OSError as exc:
        raise Refused(f"cannot remove: {exc.strerror}", path) from None
    fsync_dir(path.parent)
    fsync_dir(trash)
    delete_tree(dest)


def delete_tree(path: Path) -> None:
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        # A create that looked the dir up just before it was moved lands in it afterwards.
        time.sleep(0.05)
    if os.path.lexists(path):
        raise FiCacheError("moved to the trash but could not delete all of it", path)


def trash_leftovers(store: Path) -> list[Path]:
    """What killed prunes left in `<store>/.trash/`."""
    try:
        return sorted((store / TRASH_DIR).iterdir())
    except OSError:
        return []


def empty_trash_entry(path: Path) -> None:
    """Delete one entry of `<store>/.trash/` (a directory or a file)."""
    if path.is_dir() and not path.is_symlink():
        delete_tree(path)
    else:
        remove_file(path)


def remove_empty_parents(path: Path, stop: Path) -> None:
    """rmdir `path`'s parents up to (not including) `stop` while they are empty."""
    for parent in path.parents:
        if parent == stop or stop not in parent.parents:
            return
        try:
            os.rmdir(parent)
        except OSError:
            return


def check_usable(store: Path) -> None:
    """Refuse (before anything moves) a store whose trash cannot take a dir: a `.trash` that is
    not a writable dir, or no `.trash` and a store it cannot be made in. Creates nothing."""
    trash = store / TRASH_DIR
    if os.path.lexists(trash):
        ensure_dir(trash)  # a file there: "cannot create directory"
        check_writable(trash)
    else:
        check_writable(store)


def to_trash(path: Path, store: Path, name: str) -> Path:
    """Move an install's old dir into the trash under a name prune leaves alone for a while."""
    aside = store / TRASH_DIR / f"{INSTALLING_PREFIX}{time.time_ns()}-{os.getpid()}-{name}"
    ensure_dir(aside.parent)
    os.replace(path, aside)
    return aside


def trash_entry_in_use(path: Path, now: float) -> bool:
    """Is this trash entry an install's, young enough that the install may still need it?"""
    if not path.name.startswith(INSTALLING_PREFIX):
        return False  # a killed prune's leftover: nobody comes back for it
    stamp = path.name[len(INSTALLING_PREFIX) :].partition("-")[0]
    try:
        return now - int(stamp) / 1e9 < INSTALLING_KEEP_S
    except ValueError:
        return False
