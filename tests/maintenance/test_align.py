"""align writes a set: a deployment is aligned whole or left exactly as it was (issue 42 F10)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from fi_cache.model import v1
from tests.conftest import GEMM_618

HASH = "d" * 64
RANKS = ("dp0_rank0", "dp0_rank1", "dp0_rank2")


def _deployment(root: Path) -> Path:
    """A vLLM 0.32+ hash dir of three ranks, each holding a third of a real H200 tune."""
    hdir = root / "0.6.18" / "90a" / HASH
    hdir.mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    keys = list(cf.entries)
    for i, rank in enumerate(RANKS):
        part = v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys[i::3]}, None, "x")
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))
    return hdir


def _full_disk_at(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's writer fails with ENOSPC on its n-th data file fsync (a disk that fills up
    while align writes its set); fsyncs of directories pass."""
    real, seen = os.fsync, [0]

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen[0] += 1
            if seen[0] == n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_mid_set_leaves_every_rank_as_it_was(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    hdir = _deployment(tmp_path)
    before = {p.name: p.read_bytes() for p in hdir.iterdir() if not p.name.endswith(".lock")}
    _full_disk_at(2, monkeypatch)  # the first rank's file is written whole, the second's is not
    r = run("align", hdir)
    assert r.code == 1 and r.err.count("\n") == 1, r.err
    assert "No space left on device" in r.err and "nothing was replaced" in r.err
    after = {p.name: p.read_bytes() for p in hdir.iterdir() if not p.name.endswith(".lock")}
    assert after == before  # no rank replaced, no temp file left
    monkeypatch.undo()
    r = run("align", hdir)
    assert r.code == 0 and "wrote 3 files (0 created)" in r.out, r.err
    assert len({p.read_bytes() for p in hdir.glob("autotune_configs_*.json")}) == 1
