"""export/import: round trips, and hostile bundles refused before anything is written."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.errors import Refused
from fi_cache.fleet import bundle
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as m
from fi_cache.store.namespace import Namespace
from tests.conftest import HASH_A, MOE_618_FUSED, ROOT

FP = Fingerprint.from_metadata(json.loads(MOE_618_FUSED.read_text())["_metadata"], "90a")


def _make_namespace(store: Path, finalize: str = "fused", fp: Fingerprint = FP) -> Path:
    ns = Namespace(fp, finalize)  # type: ignore[arg-type]
    d = ns.path(store)
    cache = d / "vllm" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    shutil.copy(MOE_618_FUSED, cache)
    m.save(d, m.Manifest.new(ns, now=1.0))
    return d


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> Fingerprint:
    env = Environment(FP, (), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    return FP


def _files(root: Path) -> dict[str, bytes]:
    # Lock files and the temp files of killed writers (doctor's tmp-leftover) are not content.
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".fi-cache")
    }


def test_round_trip_through_the_cli(run, store: Path, tmp_path: Path, here: Fingerprint) -> None:  # type: ignore[no-untyped-def]
    a = _make_namespace(store)
    _make_namespace(store, "unfused")
    out = tmp_path / "b.tar.gz"
    r = run("--format", "json", "export", "-o", out)
    assert r.code == 0 and len(r.json()["namespaces"]) == 2
    other = tmp_path / "other-store"
    r = run("--store", other, "import", out)  # the later --store wins
    assert r.code == 0, r.err
    assert _files(other / "namespaces") == _files(store / "namespaces")
    assert not list(other.glob(".import-*"))
    single = tmp_path / "one.tar.gz"
    assert run("export", a, "-o", single).code == 0
    assert [n.path for n in bundle.read_manifest(single)[0].namespaces] == [
        a.relative_to(store).as_posix()
    ]


def test_import_replaces_a_namespace_whole(store: Path, tmp_path: Path) -> None:
    d = _make_namespace(store)
    out = tmp_path / "b.tar.gz"
    bundle.export(store, [d], out)
    (d / "vllm" / HASH_A / "autotune_configs.json").write_text("{}")
    (d / "vllm" / "stray.json").write_text("{}")
    bundle.import_bundle(store, out, FP, force=False)
    assert (
        d / "vllm" / HASH_A / "autotune_configs.json"
    ).read_bytes() == MOE_618_FUSED.read_bytes()
    assert not (d / "vllm" / "stray.json").exists()


def test_bundle_for_another_environment_needs_force(
    run,
    store: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    here: Fingerprint,
) -> None:
    h100 = FP.replace(gpu="NVIDIA H100 80GB HBM3")
    src = tmp_path / "src"
    d = _make_namespace(src, fp=h100)
    out = tmp_path / "h100.tar.gz"
    bundle.export(src, [d], out)
    r = run("import", out)
    assert r.code == 2 and "gpu: bundle 'NVIDIA H100 80GB HBM3', here 'NVIDIA H200'" in r.err
    assert not (store / "namespaces").exists()
    assert run("import", "--force", out).code == 0
    assert (store / d.relative_to(src)).is_dir()


# --- hostile bundles ------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _good_parts(store: Path) -> tuple[dict, list[tuple[tarfile.TarInfo, bytes]]]:  # type: ignore[type-arg]
    d = _make_namespace(store)
    rel = d.relative_to(store).as_posix()
    files = [
        (f"{rel}/manifest.json", (d / "manifest.json").read_bytes()),
        (f"{rel}/vllm/{HASH_A}/autotune_configs.json", MOE_618_FUSED.read_bytes()),
    ]
    man = {
        "format": "fi-cache-bundle",
        "schema": 1,
        "fi_cache_version": "0",
        "created": 1.0,
        "namespaces": [{"path": rel, "fingerprint": FP.__dict__, "finalize": "fused"}],
        "files": [
            {"path": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files
        ],
    }
    shutil.rmtree(store)
    return man, [_file(n, b) for n, b in files]


def _with_manifest(man: dict, members: list) -> list:  # type: ignore[type-arg]
    return [_file("fi-cache-bundle.json", json.dumps(man).encode()), *members]


def _refused(store: Path, path: Path, words: str) -> None:
    with pytest.raises(Refused, match=words):
        bundle.import_bundle(store, path, FP, force=True)
    assert not (store / "namespaces").exists(), "nothing may be written"
    assert not list(store.glob(".import-*")) if store.exists() else True


def test_a_well_formed_hand_made_bundle_imports(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    path = _tar(tmp_path / "ok.tar.gz", _with_manifest(man, members))
    bundle.import_bundle(store, path, FP, force=False)
    assert len(list((store / "namespaces").rglob("autotune_configs.json"))) == 1


@pytest.mark.parametrize(
    "name", ["../evil.json", "/tmp/evil.json", "namespaces/../../evil", "namespaces\\..\\evil"]
)
def test_traversal_is_refused(tmp_path: Path, name: str) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    man["files"].append({"path": name, "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()})
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, [*members, _file(name, b"{}")]))
    _refused(store, path, "outside the store")
    assert not (tmp_path / "evil.json").exists()


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE]
)
def test_links_and_devices_are_refused(tmp_path: Path, kind: bytes) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    rel = man["namespaces"][0]["path"]
    info = tarfile.TarInfo(f"{rel}/vllm/link.json")
    info.type, info.linkname = kind, "/etc/passwd"
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, [*members, (info, None)]))
    _refused(store, path, "is a (symlink|hard link|non-regular member)")


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    info, data = members[1]
    tampered = data.replace(b'"MoERunner",\n    3', b'"MoERunner",\n    4', 1)
    assert tampered != data
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, [members[0], (info, tampered)]))
    _refused(store, path, "checksum mismatch")


def test_truncated_gzip_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, members))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _refused(store, path, "not a readable tar.gz bundle")


def test_ten_gigabytes_declared_are_refused_unread(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    man["files"][1]["size"] = 10 * 1024**3
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, members))
    _refused(store, path, "over the 4096 MB limit")
    # the same claim in a tar header, with 10 GB of data that is not there
    header = tarfile.TarInfo(members[1][0].name)
    header.size = 10 * 1024**3
    raw = header.tobuf(format=tarfile.GNU_FORMAT) + b"x" * 512
    path2 = tmp_path / "c.tar.gz"
    manifest_member = tarfile.TarInfo("fi-cache-bundle.json")
    man_bytes = json.dumps(man).encode()
    manifest_member.size = len(man_bytes)
    pad = b"\0" * (-len(man_bytes) % 512)
    path2.write_bytes(
        gzip.compress(manifest_member.tobuf(format=tarfile.GNU_FORMAT) + man_bytes + pad + raw)
    )
    _refused(store, path2, "not a readable tar.gz bundle|over the")


def test_member_missing_from_the_manifest_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    rel = man["namespaces"][0]["path"]
    path = _tar(
        tmp_path / "b.tar.gz", _with_manifest(man, [*members, _file(f"{rel}/x.json", b"{}")])
    )
    _refused(store, path, "not in its manifest")


def test_forged_namespace_path_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    man["namespaces"][0]["fingerprint"]["gpu"] = "NVIDIA B200"  # path no longer matches
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, members))
    _refused(store, path, "does not match its fingerprint")


def test_not_a_bundle(tmp_path: Path, run) -> None:  # type: ignore[no-untyped-def]
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"hello")
    r = run("import", junk)
    assert r.code == 2 and "not a readable tar.gz bundle" in r.err and "Traceback" not in r.err
    r = run("import", tmp_path / "missing.tar.gz")
    assert r.code == 2 and "no such file" in r.err


# --- reliability --------------------------------------------------------------------------------

_IMPORT = (
    "import sys; from fi_cache import environment; from fi_cache.fleet import bundle; "
    "from fi_cache.model.fingerprint import "
    "Fingerprint; import json; fp = Fingerprint(**json.loads(sys.argv[3])); "
    "bundle.import_bundle(__import__('pathlib').Path(sys.argv[1]), "
    "__import__('pathlib').Path(sys.argv[2]), fp, False)"
)


def _import_proc(store: Path, path: Path):  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", _IMPORT, str(store), str(path),
                             json.dumps(FP.__dict__)], env=env)  # fmt: skip


def test_concurrent_imports_into_one_store(tmp_path: Path) -> None:
    src = tmp_path / "src"
    d = _make_namespace(src)
    out = tmp_path / "b.tar.gz"
    bundle.export(src, [d], out)
    store = tmp_path / "s"
    procs = [_import_proc(store, out) for _ in range(6)]
    assert [p.wait(60) for p in procs] == [0] * 6
    assert _files(store / "namespaces") == _files(src / "namespaces")
    assert not list(store.glob(".import-*"))


def test_sigkill_during_import_leaves_old_or_new(tmp_path: Path) -> None:
    import random
    import signal
    import time

    src = tmp_path / "src"
    d = _make_namespace(src)
    out = tmp_path / "b.tar.gz"
    bundle.export(src, [d], out)
    new = _files(src / "namespaces")
    store = tmp_path / "s"
    old_ns = _make_namespace(store)
    (old_ns / "vllm" / HASH_A / "autotune_configs.json").write_text('{"_metadata": {}}')
    old = _files(store / "namespaces")
    rng = random.Random(11)
    outcomes = set()
    for _ in range(50):
        p = _import_proc(store, out)
        time.sleep(rng.uniform(0.05, 0.45))
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        now = _files(store / "namespaces")
        assert now in (old, new), "a namespace must be whole: old or new"
        outcomes.add("new" if now == new else "old")
        if now == new:  # reset for the next trial
            shutil.rmtree(store / "namespaces")
            _make_namespace(store)
            (old_ns / "vllm" / HASH_A / "autotune_configs.json").write_text('{"_metadata": {}}')
    assert outcomes  # both are fine; the point is never a mix


def test_a_namespace_listed_twice_is_refused_and_the_old_one_survives(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    man["namespaces"].append(dict(man["namespaces"][0]))
    path = _tar(tmp_path / "twice.tar.gz", _with_manifest(man, members))
    old = _make_namespace(store)
    before = _files(store / "namespaces")
    with pytest.raises(Refused, match="namespace twice"):
        bundle.import_bundle(store, path, FP, force=True)
    assert _files(store / "namespaces") == before and old.is_dir()


def test_a_member_listed_twice_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    path = _tar(tmp_path / "dup.tar.gz", _with_manifest(man, [*members, members[1]]))
    _refused(store, path, "appears twice")


def test_export_refuses_a_directory_or_a_missing_parent(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _make_namespace(store)
    r = run("export", "-o", tmp_path)
    assert r.code == 2 and "is a directory" in r.err
    r = run("export", "-o", tmp_path / "no" / "such" / "b.tar.gz")
    assert r.code == 2 and "no such directory" in r.err and not (tmp_path / "no").exists()
