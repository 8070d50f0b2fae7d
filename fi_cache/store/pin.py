"""Pinned namespaces: a known-good namespace that no start may change.

The manifest's `pinned` record is what fi-cache honours: warm, evict, merge -o, align, import,
prune and doctor --fix refuse or skip a pinned namespace (`refusal`), and serve runs the engine
on it only where a fully warm start writes nothing (lifecycle/serve.py). Pinning also takes the
write bits off every file and dir the engines write in the namespace (the manifest and lock
files stay writable: fi-cache's bookkeeping goes on), so an engine that tries to save there
fails instead of changing it. File modes do not bind root; the sha256 of each file, taken when
it was pinned, tells a change made anyway (`changed`). Unpinning gives every path its mode back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from dataclasses import replace
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import manifest as manifests
from fi_cache.store.files import DEFAULT_LOCK_TIMEOUT, LOCK_SUFFIX, TMP_PREFIX
from fi_cache.store.in_use import IN_USE_NAME
from fi_cache.store.locks import namespace_lock
from fi_cache.store.locks.api import HOLDER_NAME, LOCK_NAME
from fi_cache.store.manifest import Manifest, PinRecord
from fi_cache.store.namespace import namespace_parts
from fi_cache.store.paths import Unconfined, confined

# fi-cache's own files in a namespace: they stay writable (last use, unpin, locks).
_OURS = frozenset({manifests.MANIFEST_NAME, LOCK_NAME, HOLDER_NAME, IN_USE_NAME})
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_PERMISSION_BITS = 0o777  # never setuid, setgid or sticky: pin records only what engines made


def engine_paths(ns_dir: Path) -> list[Path]:
    """The dirs and files below `ns_dir` that engines write (links are neither followed nor
    changed); fi-cache's manifest, lock files and temp files left out."""
    out: list[Path] = []
    for here, dirs, names in os.walk(ns_dir):
        top = Path(here) == ns_dir
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(here, d)))
        out.extend(Path(here, d) for d in dirs)
        for name in sorted(names):
            if (top and name in _OURS) or name.endswith(LOCK_SUFFIX) or _temp(name):
                continue
            if not os.path.islink(os.path.join(here, name)):
                out.append(Path(here, name))
    return out


def _temp(name: str) -> bool:
    return name.startswith(TMP_PREFIX) and name.endswith(".tmp")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rel(path: Path, ns_dir: Path) -> str:
    return path.relative_to(ns_dir).as_posix()


def pin(ns_dir: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> tuple[Manifest, bool]:
    """Pin `ns_dir` under its lock: (its manifest, False when it was pinned already). Refused
    for a namespace without a manifest (nothing was ever warmed into it).

    The pin record (the modes unpin gives back) is saved before any mode changes: a pin killed
    half-way leaves a pinned namespace that unpin restores whole, never read-only files that no
    record names. Pinning a pinned namespace takes the write bits again (finishing such a pin)."""
    with namespace_lock(ns_dir, "pin", timeout):
        m = _manifest(ns_dir)
        if m.pin is not None:
            usable, _ = _recorded(ns_dir, m.pin)
            with contextlib.suppress(Refused):  # what it cannot change stays as it is
                _set_modes(ns_dir, {r: mode & ~_WRITE_BITS for r, mode in usable.items()}, {})
            return m, False
        paths = engine_paths(ns_dir)
        try:
            modes = {_rel(p, ns_dir): stat.S_IMODE(p.lstat().st_mode) for p in paths}
            digests = {_rel(p, ns_dir): _sha256(p) for p in paths if p.is_file()}
        except OSError as exc:
            raise Refused(f"cannot read it to pin it: {exc.strerror}", exc.filename) from None
        pinned = replace(m, pin=PinRecord(time.time(), modes, digests))
        manifests.save(ns_dir, pinned)  # the intent first
        try:
            _set_modes(ns_dir, {rel: mode & ~_WRITE_BITS for rel, mode in modes.items()}, modes)
        except Refused:
            manifests.save(ns_dir, m)  # not pinned after all: _set_modes put the modes back
            raise  # (killed or interrupted: the record stays, and unpin gives the modes back)
    return pinned, True


def unpin(ns_dir: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> tuple[Manifest, bool, list[str]]:
    """Give every path its mode from before the pin, then drop the pin: (its manifest, False
    when it was not pinned, a note for each record skipped). Only a path inside the namespace
    (no `..`, not absolute, no symlink on the way) gets a mode, and only its permission bits:
    a tampered manifest cannot chmod anything else, nor add setuid, setgid or sticky bits."""
    with namespace_lock(ns_dir, "unpin", timeout):
        m = _manifest(ns_dir)
        if m.pin is None:
            return m, False, []
        present, skipped = _recorded(ns_dir, m.pin)
        _set_modes(ns_dir, present, {})
        unpinned = replace(m, pin=None)
        manifests.save(ns_dir, unpinned)
    return unpinned, True, skipped


def plan_pin(ns_dir: Path) -> tuple[Manifest, list[str]]:
    """What `pin` would do, without the lock and changing nothing (`pin --dry-run`): (the
    manifest, the paths that would lose their write bits; none when pinned already). Refused
    where pin would refuse: no manifest, a path it could not read to take its sha256."""
    m = _manifest(ns_dir)
    if m.pin is not None:
        return m, []
    paths = engine_paths(ns_dir)
    for p in paths:
        if p.is_file() and not os.access(p, os.R_OK):
            raise Refused("cannot read it to pin it: Permission denied", p)
    return m, [_rel(p, ns_dir) for p in paths]


def plan_unpin(ns_dir: Path) -> tuple[Manifest, list[str], list[str]]:
    """What `unpin` would do, without the lock and changing nothing (`unpin --dry-run`): (the
    manifest, the paths that would get their modes back, a note for each record skipped)."""
    m = _manifest(ns_dir)
    if m.pin is None:
        return m, [], []
    present, skipped = _recorded(ns_dir, m.pin)
    return m, sorted(present), skipped


def _recorded(ns_dir: Path, record: PinRecord) -> tuple[dict[str, int], list[str]]:
    """The pin's modes for the paths still there that may be changed: the recorded permission
    bits, the setuid/setgid/sticky bits each has now (never one added); and a note for each
    path that may not be (outside the namespace, through a symlink)."""
    usable: dict[str, int] = {}
    skipped: list[str] = []
    for rel, mode in record.modes.items():
        try:
            path = confined(ns_dir, rel)
            now = path.lstat().st_mode
        except Unconfined as exc:
            skipped.append(f"{ns_dir / manifests.MANIFEST_NAME}: pin record {exc}: skipped")
            continue
        except OSError:
            continue  # gone since: nothing to give back
        usable[rel] = (mode & _PERMISSION_BITS) | (stat.S_IMODE(now) & ~_PERMISSION_BITS)
    return usable, skipped


def _manifest(ns_dir: Path) -> Manifest:
    m = manifests.load(ns_dir)
    if m is None:
        raise Refused("not a warmed namespace (no manifest.json): nothing to pin", ns_dir)
    return m


def _set_modes(ns_dir: Path, modes: dict[str, int], undo: dict[str, int]) -> None:
    """chmod each path (dirs last when taking write bits away: their files first); on a
    failure the ones done get `undo`'s modes back and one line names the path."""
    done: list[str] = []
    order = sorted(modes, key=lambda r: (os.path.isdir(ns_dir / r), -r.count("/")))
    try:
        for rel in order:
            os.chmod(ns_dir / rel, modes[rel], follow_symlinks=False)
            done.append(rel)
    except OSError as exc:
        for rel in reversed(done):
            if rel in undo:
                with contextlib.suppress(OSError):
                    os.chmod(ns_dir / rel, undo[rel], follow_symlinks=False)
        raise Refused(f"cannot change its mode: {exc.strerror}", ns_dir / rel) from None


def changed(ns_dir: Path, record: PinRecord) -> list[str]:
    """The engines' files that differ from when the namespace was pinned: changed, gone or new
    (root writes whatever the modes say)."""
    now = {_rel(p, ns_dir): p for p in engine_paths(ns_dir) if p.is_file()}
    out = [rel for rel in record.sha256 if rel not in now]
    for rel, path in now.items():
        try:
            if record.sha256.get(rel) != _sha256(path):
                out.append(rel)
        except OSError:
            out.append(rel)
    return sorted(out)


def namespace_of(path: Path, store: Path) -> Path | None:
    """The store namespace dir holding `path` (itself a namespace dir, or a file in one)."""
    parts = namespace_parts(path, store)
    return Path(parts["dir"]) if parts else None


def pinned(ns_dir: Path) -> PinRecord | None:
    """The namespace's pin, if it has one (a broken manifest reads as none: its own readers
    report it)."""
    try:
        m = manifests.load(ns_dir)
    except FiCacheError:
        return None
    return m.pin if m else None


def refusal(ns_dir: Path, what: str) -> Refused:
    """The one line for a command a pin stops: `what` would change the namespace."""
    return Refused(
        f"pinned (`fi-cache pin`): {what} would change it; `fi-cache unpin {ns_dir}` first",
        ns_dir,
    )


def refuse_if_pinned(path: Path, store: Path, what: str) -> None:
    """Refused when `path` lies in a pinned namespace of `store`."""
    ns = namespace_of(path, store)
    if ns is not None and pinned(ns) is not None:
        raise refusal(ns, what)


def drop_staged(ns_dir: Path) -> None:
    """An imported namespace arrives unpinned: its staged manifest loses the sender's pin (its
    files were unpacked with ordinary modes; the receiving store decides what to pin)."""
    m = manifests.load(ns_dir)
    if m is not None and m.pin is not None:
        manifests.save(ns_dir, replace(m, pin=None))
