"""pin / unpin through the CLI: what every command that writes into a namespace does with a
pinned one (evict, merge -o, align, import refuse; prune skips), what ls and show say, and that
unpin gives it back. The namespace holds FlashInfer 0.6.18's real MoE tune (H200 metadata)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_618, HASH_A, MOE_618_FUSED

FP = Fingerprint.from_metadata(json.loads(MOE_618_FUSED.read_text())["_metadata"], "90a")
REL = f"vllm/{HASH_A}/autotune_configs.json"


def _namespace(store: Path, used: float = 1.0) -> Path:
    ns = Namespace(FP, "fused")
    d = ns.path(store)
    (d / REL).parent.mkdir(parents=True)
    shutil.copy(MOE_618_FUSED, d / REL)
    manifests.save(d, manifests.Manifest.new(ns, now=used))
    return d


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> Fingerprint:
    env = Environment(FP, (), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    return FP


def _one_line(r) -> bool:  # type: ignore[no-untyped-def]
    return len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_pin_refuses_evict_merge_and_align_till_unpinned(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store)
    before = (ns / REL).read_bytes()
    r = run("pin", ns)
    assert r.code == 0 and "pinned" in r.out and "1 file(s) made read-only" in r.out
    assert (ns / REL).stat().st_mode & 0o222 == 0
    assert "pinned already" in run("pin", ns).out
    evict = run("evict", ns, "--op", "gemm2")
    assert evict.code == 2 and _one_line(evict) and "fi-cache unpin" in evict.err
    other = tmp_path / "extra.json"
    shutil.copy(MOE_618_FUSED, other)
    merge = run("merge", other, "-o", ns / REL)
    assert merge.code == 2 and _one_line(merge) and "pinned" in merge.err
    align = run("align", ns / "vllm" / HASH_A)
    assert align.code == 2 and _one_line(align) and "pinned" in align.err
    assert (ns / REL).read_bytes() == before  # nothing of it changed
    doc = run("--format", "json", "unpin", ns).json()
    assert doc["namespaces"] == [
        {"path": str(ns), "pinned": False, "changed": True, "since": None, "files": None}
    ]
    assert (ns / REL).stat().st_mode & 0o200
    assert run("evict", ns, "--op", "gemm2").code == 0
    assert run("unpin", ns).out.strip().endswith("not pinned")


def test_ls_and_show_say_pinned_and_show_names_a_change_made_anyway(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store)
    assert run("--format", "json", "ls").json()["caches"][0]["pinned"] is False
    run("pin", ns)
    [row] = run("--format", "json", "ls").json()["caches"]
    assert row["pinned"] is True and row["namespace"] == str(ns)
    assert "(pinned: no start may change it)" in run("ls").out
    shown = run("show", ns / REL)
    assert "namespace pinned since" in shown.out and "changed since" not in shown.err
    (ns / REL).chmod(0o644)
    (ns / REL).write_bytes(GEMM_618.read_bytes())  # root, or whoever restores the write bit
    doc = run("--format", "json", "show", ns / REL).json()
    assert doc["namespace"]["pinned"]["changed"] == [REL]
    assert REL in run("show", ns / REL).err


def test_prune_skips_a_pinned_namespace_whatever_the_selector(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store, used=1.0)  # last used in 1970
    run("pin", ns)
    doc = run("--format", "json", "prune", "--older-than", "1d", "--max-size", "0", "--yes").json()
    assert doc["plan"] == []  # nothing to delete
    [skipped] = doc["skipped_pinned"]
    assert skipped["path"] == str(ns) and any("unused for" in r for r in skipped["reasons"])
    assert (ns / REL).is_file()
    human = run("prune", "--older-than", "1d", "--dry-run")
    assert "pinned (fi-cache unpin)" in human.err
    run("unpin", ns)
    assert run("--format", "json", "prune", "--older-than", "1d", "--yes").json()["removed"]


def test_import_refuses_to_replace_a_pinned_namespace_and_a_pin_does_not_travel(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint
) -> None:
    ns = _namespace(store)
    run("pin", ns)
    bundle = tmp_path / "b.tar.gz"
    assert run("export", ns, "-o", bundle).code == 0
    r = run("import", bundle)
    assert r.code == 2 and _one_line(r) and "pinned" in r.err
    assert not list(store.glob(".import-*")) and not (store / ".trash").exists()
    assert manifests.load(ns).pin is not None  # type: ignore[union-attr]
    other = tmp_path / "other-store"
    assert run("--store", other, "import", bundle).code == 0
    there = other / ns.relative_to(store)
    assert manifests.load(there).pin is None  # type: ignore[union-attr]
    assert (there / REL).stat().st_mode & 0o200
    assert "pinned" not in run("--store", other, "ls").out


def test_pin_refuses_what_is_not_a_namespace_of_the_store(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _namespace(store)
    r = run("pin", tmp_path / "nowhere")
    assert r.code == 2 and _one_line(r) and "no namespace" in r.err


def test_doctor_fix_leaves_a_pinned_namespaces_bad_file_where_it_is(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store)
    (ns / REL).write_text("{not json")  # corrupt-file: --fix would quarantine it
    assert run("pin", ns).code == 0
    args = ["doctor", ns, "--flashinfer-version", "0.6.18", "--vllm-version", "0.30.0", "--fix"]
    r = run(*args)
    assert (ns / REL).read_text() == "{not json"  # not moved: a pin is known good
    held = [line for line in r.err.splitlines() if "pinned" in line]
    assert len(held) == 1 and f"fi-cache unpin {ns}" in held[0], r.err
    assert not (store / "quarantine").exists()
    assert run("unpin", ns).code == 0
    run(*args)
    assert not (ns / REL).exists()  # unpinned: --fix quarantines it again


def test_align_checks_the_pin_under_the_namespace_lock(  # type: ignore[no-untyped-def]
    run, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fi_cache.maintenance import align
    from fi_cache.model import v1

    ns = _namespace(store)
    hdir = ns / "vllm" / HASH_A
    (hdir / "autotune_configs.json").unlink()
    cf = v1.loads(GEMM_618.read_bytes())
    for rank, drop in (("dp0_rank0", 0), ("dp1_rank1", 3)):
        part = v1.CacheFile(cf.metadata, dict(list(cf.entries.items())[drop:]), None, None)
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))
    before = {p.name: p.read_bytes() for p in hdir.iterdir()}
    first_plan = align.plan

    def pinned_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        from fi_cache.store import pin

        pin.pin(ns)  # a pin that lands after the CLI's own check, before align locks
        return first_plan(*args, **kwargs)

    monkeypatch.setattr(align, "plan", pinned_meanwhile)
    r = run("align", hdir)
    assert r.code == 2 and _one_line(r) and f"fi-cache unpin {ns}" in r.err, r.err
    assert {p.name: p.read_bytes() for p in hdir.iterdir()} == before


def _files(ns: Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.relative_to(ns).as_posix(): (p.stat().st_mode, p.read_bytes())
        for p in sorted(ns.rglob("*"))
        if p.is_file()
    }


def test_pin_and_unpin_dry_run_say_what_they_would_do_and_change_nothing(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store)
    before = _files(ns)
    dry = run("pin", "--dry-run", ns)
    assert (
        dry.code == 0
        and dry.out.startswith("would pin ")
        and "1 file(s) be made read-only" in dry.out
    )
    assert _files(ns) == before  # no mode changed, no pin recorded, no lock file made
    doc = run("--format", "json", "pin", "--dry-run", ns).json()
    assert doc["dry_run"] is True and doc["namespaces"][0]["changed"] is True
    assert run("pin", ns).code == 0
    pinned = _files(ns)
    dry = run("unpin", "--dry-run", "--namespace", str(ns))
    assert dry.code == 0 and dry.out.startswith("would unpin ")
    assert _files(ns) == pinned and manifests.load(ns).pin is not None  # type: ignore[union-attr]
    assert run("unpin", ns).code == 0
    assert "not pinned" in run("unpin", "--dry-run", ns).out


def test_pin_dry_run_refuses_what_pin_refuses(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _namespace(store)
    r = run("pin", "--dry-run", tmp_path / "nowhere")
    assert r.code == 2 and _one_line(r) and "no namespace" in r.err


def test_pin_takes_namespace_as_an_option_and_refuses_none(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace(store)
    assert run("pin", "--namespace", str(ns)).code == 0 and manifests.load(ns).pin is not None  # type: ignore[union-attr]
    none = run("unpin")
    assert none.code == 2 and _one_line(none) and "NAMESPACE" in none.err
