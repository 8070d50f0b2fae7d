"""store/pin.py: what a pin changes on disk (write bits off the engines' files and dirs, the
manifest and locks left writable), what unpin gives back, and a change made anyway (root)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.errors import Refused
from fi_cache.store import locks, pin
from fi_cache.store import manifest as manifests
from tests.conftest import HASH_A, VLLM_026_FUSED, VLLM_026_REL, vllm_026_namespace

FUSED, REL = VLLM_026_FUSED, VLLM_026_REL


def _namespace(store: Path) -> Path:
    directory = vllm_026_namespace(store, warmed=False)
    with locks.namespace_lock(directory, "warm"):
        pass  # the lock file a warm leaves
    return directory


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_pin_takes_the_write_bits_and_unpin_gives_the_modes_back(tmp_path: Path) -> None:
    ns = _namespace(tmp_path / "store")
    before = {p: _mode(p) for p in pin.engine_paths(ns)}
    assert set(before) == {ns / "vllm", ns / "vllm" / HASH_A, ns / REL}
    m, done = pin.pin(ns)
    assert done and m.pin is not None and set(m.pin.sha256) == {REL}
    assert all(_mode(p) & 0o222 == 0 for p in before)  # nothing an engine writes is writable
    assert _mode(ns / "manifest.json") & 0o200 and _mode(ns / locks.LOCK_NAME) & 0o200
    again, done = pin.pin(ns)
    assert not done and again.pin == m.pin  # pinned already: nothing changes
    assert pin.changed(ns, m.pin) == []
    unpinned, done, skipped = pin.unpin(ns)
    assert done and not skipped and unpinned.pin is None and manifests.load(ns).pin is None  # type: ignore[union-attr]
    assert {p: _mode(p) for p in before} == before  # 0600 file, 0755 dirs: as they were
    assert pin.unpin(ns)[1] is False


def test_a_change_made_despite_the_pin_is_told(tmp_path: Path) -> None:
    ns = _namespace(tmp_path / "store")
    m, _ = pin.pin(ns)
    assert m.pin is not None
    if os.geteuid() != 0:  # the modes stop anyone else; root writes through them
        with pytest.raises(PermissionError):
            (ns / REL).write_text("{}")
        os.chmod(ns / REL, 0o600)
    (ns / REL).write_text("{}")
    (ns / "vllm" / HASH_A).chmod(0o755)
    (ns / "vllm" / HASH_A / "autotune_configs_dp0_rank0.json").write_text("{}")
    assert pin.changed(ns, m.pin) == [REL, f"vllm/{HASH_A}/autotune_configs_dp0_rank0.json"]


def test_a_namespace_without_a_manifest_cannot_be_pinned(tmp_path: Path) -> None:
    ns = _namespace(tmp_path / "store")
    (ns / "manifest.json").unlink()
    with pytest.raises(Refused, match="no manifest"):
        pin.pin(ns)
    assert _mode(ns / REL) == 0o600


def test_refusal_names_the_namespace_and_how_to_unpin(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ns = _namespace(store)
    pin.refuse_if_pinned(ns / REL, store, "evict")  # not pinned: nothing said
    pin.pin(ns)
    with pytest.raises(Refused) as info:
        pin.refuse_if_pinned(ns / REL, store, "evict")
    assert info.value.path == str(ns) and f"fi-cache unpin {ns}" in info.value.message
    pin.refuse_if_pinned(tmp_path / "elsewhere.json", store, "evict")  # outside the store


def _tamper(ns: Path, modes: dict[str, int]) -> None:
    data = json.loads((ns / "manifest.json").read_text())
    data["pinned"]["modes"].update(modes)
    (ns / "manifest.json").write_text(json.dumps(data))


def test_unpin_changes_no_mode_outside_the_namespace_and_adds_no_setuid(tmp_path: Path) -> None:
    ns = _namespace(tmp_path / "store")
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (victim / "file").write_text("secret")
    (victim / "file").chmod(0o600)
    (ns / "vllm" / "out").symlink_to(victim)  # a link planted in the namespace
    pin.pin(ns)
    escape = os.path.relpath(victim, ns)  # ../../../../../../victim
    _tamper(
        ns,
        {
            str(victim / "file"): 0o6777,
            escape: 0o777,
            "vllm/out/file": 0o777,
            REL: 0o6777,
            "vllm/./x": 0o777,
        },
    )
    _, done, skipped = pin.unpin(ns)
    assert done
    assert _mode(victim) == 0o755 and _mode(victim / "file") == 0o600  # untouched
    assert _mode(ns / REL) == 0o777  # its own file: permission bits only, no setuid/setgid
    assert len(skipped) == 4 and all(line.startswith(f"{ns}/manifest.json: ") for line in skipped)
    assert any("is absolute" in line for line in skipped)
    assert any("symlink" in line for line in skipped)


_KILLED_PIN = """
import os, signal, sys
from pathlib import Path
from fi_cache.store import pin
calls = []
real = os.chmod
def chmod(*args, **kwargs):  # SIGKILL once the second path lost its write bits
    real(*args, **kwargs)
    if kwargs.get("follow_symlinks") is False:  # pin's own, not the lock's or the manifest's
        calls.append(args[0])
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
os.chmod = chmod
pin.pin(Path(sys.argv[1]))
"""


def test_a_pin_killed_half_way_is_undone_by_unpin(tmp_path: Path) -> None:
    ns = _namespace(tmp_path / "store")
    before = {p: _mode(p) for p in pin.engine_paths(ns)}
    child = subprocess.run([sys.executable, "-c", _KILLED_PIN, str(ns)], check=False)
    assert child.returncode == -signal.SIGKILL
    assert any(_mode(p) != before[p] for p in before)  # it got half-way
    pinned_again, done = pin.pin(ns)  # a later pin records the modes from before the first
    assert not done and pinned_again.pin is not None
    assert all(_mode(p) & 0o222 == 0 for p in before)  # ... and finishes taking write bits
    assert pin.unpin(ns)[1]
    assert {p: _mode(p) for p in before} == before
