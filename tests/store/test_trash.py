"""fi_cache/store/trash.py: deleting a namespace moved into the trash outlasts a late create."""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_cache.store import trash


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
