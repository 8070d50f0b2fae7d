"""export/import and push/pull through the CLI: `--dry-run` says what an import would install and
refuses what it would refuse, with the store untouched; NAMESPACE spelled as --namespace too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MOE_618_FUSED
from tests.fleet.test_bundle import _bundle_of, corrupt_cache
from tests.fleet.test_transfer import B200, H200, Run, _as_machine, _namespace_tree, _warm


def _tree(store: Path) -> dict[str, bytes]:
    """Every file of a store (lock files included: a dry run takes no lock)."""
    if not store.exists():
        return {}
    return {
        p.relative_to(store).as_posix(): p.read_bytes() for p in store.rglob("*") if p.is_file()
    }


@pytest.fixture
def bundle(run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path) -> Path:
    """Both namespaces of this (H200) machine, exported."""
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    out = tmp_path / "h200.tar.gz"
    assert run("export", "-o", out).code == 0
    return out


def test_import_dry_run_says_what_would_land_and_writes_nothing(
    run: Run, bundle: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-store"
    dry = run("--store", other, "import", "--dry-run", bundle)
    assert dry.code == 0, dry.err
    lines = dry.out.splitlines()
    assert lines[0].startswith("would import 2 namespace(s), 5 files")
    assert [line.split(": ")[1] for line in lines[1:]] == ["new", "new"]
    assert _tree(other) == {}  # no namespace, no staging dir, no lock file
    assert run("--store", other, "import", bundle).code == 0
    before = _tree(other)
    doc = run("--store", other, "--format", "json", "import", "--dry-run", bundle).json()
    assert doc["dry_run"] is True and doc["files"] == 5 and doc["node_ranks"] is None
    assert [n["replaces"] for n in doc["planned"]] == [True, True]
    assert _tree(other) == before


def test_import_dry_run_refuses_what_the_import_refuses(
    run: Run, bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_machine(monkeypatch, B200)  # another machine: the bundle is foreign here
    other = tmp_path / "other-store"
    real = run("--store", other, "import", bundle)
    dry = run("--store", other, "import", "--dry-run", bundle)
    assert real.code == dry.code == 2 and dry.err == real.err and "another environment" in dry.err
    assert _tree(other) == {}
    forced = run("--store", other, "import", "--dry-run", "--allow-foreign", bundle)
    assert forced.code == 0 and _tree(other) == {}


def test_import_dry_run_refuses_a_corrupt_member(run: Run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _as_machine(monkeypatch, H200)
    path = _bundle_of(
        tmp_path, {"fused": MOE_618_FUSED.read_bytes(), "unfused": corrupt_cache("unparsable-key")}
    )
    other = tmp_path / "other-store"
    dry = run("--store", other, "import", "--dry-run", path)
    assert dry.code == 2 and len(dry.err.splitlines()) == 1 and "bundled cache" in dry.err
    assert _tree(other) == {}


def test_pull_dry_run_checks_the_bundle_and_imports_nothing(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path
) -> None:
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    remote = tmp_path / "remote"
    assert run("push", str(remote)).code == 0
    other = tmp_path / "other-store"
    dry = run("--store", other, "pull", "--dry-run", remote.as_uri())
    assert dry.code == 0, dry.err
    assert (
        dry.out.startswith("would import 2 namespace(s), 5 files") and dry.out.count(": new") == 2
    )
    assert _tree(other) == {}
    assert run("--store", other, "pull", remote.as_uri()).code == 0
    assert _namespace_tree(other) == _namespace_tree(store)


def test_export_takes_namespace_as_an_option_too(run: Run, bundle: Path, tmp_path: Path) -> None:
    by_option = tmp_path / "fused.tar.gz"
    r = run("--format", "json", "export", "--namespace", "fused", "-o", by_option)
    assert r.code == 0 and len(r.json()["namespaces"]) == 1
    both = run("export", "fused", "--namespace", "unfused", "-o", tmp_path / "x.tar.gz")
    assert both.code == 2 and len(both.err.splitlines()) == 1 and "give one" in both.err
    assert not (tmp_path / "x.tar.gz").exists()


def test_import_dry_run_refuses_a_store_that_cannot_be_written(
    run: Run, bundle: Path, tmp_path: Path, read_only
) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "other-store"
    other.mkdir()
    read_only(other)
    real = run("--store", other, "import", bundle)
    dry = run("--store", other, "import", "--dry-run", bundle)
    assert real.code == dry.code == 2 and dry.err == real.err and "not writable" in dry.err
