"""export/import: round trips, and hostile bundles refused before anything is written."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.errors import Refused
from fi_cache.fleet import bundle
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as m
from fi_cache.store.in_use import IN_USE_NAME
from fi_cache.store.namespace import Namespace
from tests.conftest import (
    ENCODINGS,
    HASH_A,
    MOE_618_FUSED,
    ROOT,
    SPECIAL_KINDS,
    hand_v2_store,
    make_special,
    no_hang,
    older_export,
    undecodable,
)

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
        "namespaces": [{"path": rel, "fingerprint": dict(FP.__dict__), "finalize": "fused"}],
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
    assert not (store / ".trash").exists(), "nor an empty .trash/"


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


def _damaged(data: bytes, damage: str) -> bytes:
    """A gzip stream (... deflate data, CRC32: 4 bytes, ISIZE: 4 bytes) damaged at its end."""
    out = bytearray(data)
    if damage == "crc":
        out[-8] ^= 0xFF
    elif damage == "size":
        out[-1] ^= 0xFF
    elif damage == "trailer-cut":
        del out[-8:]
    elif damage == "trailer-half":
        del out[-4:]
    elif damage == "padding":  # a second gzip member: a megabyte of zeros after the tar's end
        out += gzip.compress(bytes(1 << 20))
    return bytes(out)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("crc", "CRC check failed"),
        ("size", "Incorrect length"),
        ("trailer-cut", "not a readable tar.gz bundle"),
        ("trailer-half", "not a readable tar.gz bundle"),
        ("padding", "data after its last member"),
    ],
)
def test_a_gzip_end_that_does_not_check_is_refused(tmp_path: Path, damage: str, words: str) -> None:
    """Every member's sha256 still holds, but the bundle is not what export wrote (damaged in
    transit or by hand): refused, as a truncated one is, before anything is written."""
    store = tmp_path / "s"
    man, members = _good_parts(store)
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, members))
    path.write_bytes(_damaged(path.read_bytes(), damage))
    _refused(store, path, words)


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("flashinfer_version", "../../x"),
        ("arch", "90a/../../../etc"),
        ("cuda_version", ".."),
        ("gpu", "NVIDIA\nH200"),
        ("cudnn_version", "a\\b"),
    ],
)
def test_a_fingerprint_value_that_is_no_plain_name_is_refused_even_with_force(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint, field: str, value: str
) -> None:
    """Fingerprint fields name store paths: one from a bundle must never hold a path of its own."""
    src = tmp_path / "src"
    d = _make_namespace(src, fp=FP.replace(**{field: value}))
    out = tmp_path / "dots.tar.gz"
    bundle.export(src, [d], out)
    for args in (["import", out], ["import", "--force", out]):
        r = run(*args)
        assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
        assert f"fingerprint {field} {value!r} is no plain name" in r.err and str(out) in r.err
        assert not (store / "namespaces").exists()


def test_not_a_bundle(tmp_path: Path, run) -> None:  # type: ignore[no-untyped-def]
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"hello")
    r = run("import", junk)
    assert r.code == 2 and "not a readable tar.gz bundle" in r.err and "Traceback" not in r.err
    r = run("import", tmp_path / "missing.tar.gz")
    assert r.code == 2 and "no such file" in r.err


def test_a_refused_import_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """Refused after unpacking (a checksum): no `.import-*`, and no `.trash/` it never needed."""
    store = tmp_path / "s"
    man, members = _good_parts(store)
    _make_namespace(store)
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    info, data = members[1]
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, [members[0], (info, data[:-1] + b" ")]))
    with pytest.raises(Refused, match="checksum mismatch"):
        bundle.import_bundle(store, path, FP, force=True)
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_a_lock_file_the_flock_strategy_left_does_not_stop_a_lockfile_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import time

    from fi_cache.store import locks

    src = tmp_path / "src"
    out = tmp_path / "b.tar.gz"
    bundle.export(src, [_make_namespace(src)], out)
    store = tmp_path / "s"
    old = _make_namespace(store)
    (old / "vllm" / HASH_A / "autotune_configs.json").write_text('{"_metadata": {}}')
    (old / locks.LOCK_NAME).touch()  # the flock strategy's, from before the store moved to NFS
    then = time.time() - 3600
    os.utime(old / locks.LOCK_NAME, (then, then))
    monkeypatch.setenv("FI_CACHE_LOCK", "lockfile")
    t0 = time.monotonic()
    bundle.import_bundle(store, out, FP, force=False)
    assert time.monotonic() - t0 < 10  # not the 60 s lock timeout
    assert _files(store / "namespaces") == _files(src / "namespaces")


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
    return subprocess.Popen(
        [sys.executable, "-c", _IMPORT, str(store), str(path), json.dumps(FP.__dict__)], env=env
    )


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


# --- a bundle carries cache data only -----------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _with_extra(tmp_path: Path, store: Path, name: str, data: bytes) -> tuple[Path, str]:
    """A well-formed bundle plus one more member at `name` inside its namespace, listed and
    checksummed in the manifest as export would list it."""
    man, members = _good_parts(store)
    full = f"{man['namespaces'][0]['path']}/{name}"
    man["files"].append({"path": full, "size": len(data), "sha256": _sha(data)})
    return _tar(tmp_path / "b.tar.gz", _with_manifest(man, [*members, _file(full, data)])), full


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (".fi-cache.lock", "is a lock file"),  # a lock naming pid 1 here: every warm would wait
        (".fi-cache.lock.holder", "is a lock file"),
        (".fi-cache.inuse", "is a lock file"),
        (f"vllm/{HASH_A}/.autotuner_123.tmp", "is a temp file"),
        ("vllm/v2/0123456789abcdef/.autotune_x.tmp", "is a temp file"),
        (".fi-cache-abc.tmp", "is a temp file"),
        ("warm.sh", "is not a cache file"),
        ("vllm/evil.py", "is not a cache file"),
        (f"vllm/{HASH_A}/.hidden.json", "has a name no cache has"),
    ],
)
def test_locks_temp_files_and_scripts_are_refused_before_a_byte_is_written(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
    name: str,
    kind: str,
) -> None:
    path, full = _with_extra(tmp_path, tmp_path / "src", name, b"{}")  # parses as an empty cache
    r = run("import", path)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert f"bundle member {full!r} {kind}" in r.err and str(path) in r.err
    assert not store.exists(), "nothing may be written, not even a staging dir"


@pytest.mark.parametrize("name", ["vllm/manifest.json", "vllm/package.json"])
def test_json_that_is_no_cache_is_refused(tmp_path: Path, name: str) -> None:
    store = tmp_path / "s"
    path, full = _with_extra(tmp_path, store, name, b'{"name": "not a cache"}')
    _refused(store, path, f"bundle member '{full}' is not a cache fi-cache can read")


def test_export_bundles_the_manifest_and_caches_only(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
) -> None:
    d = _make_namespace(store)
    for junk in (
        ".fi-cache.lock",
        ".fi-cache.lock.holder",
        ".fi-cache.inuse",
        "warm.sh",
        f"vllm/{HASH_A}/.autotuner_1.tmp",
        f"vllm/{HASH_A}/notes.txt",
    ):
        (d / junk).write_text("x")
    out = tmp_path / "b.tar.gz"
    assert run("export", "-o", out).code == 0
    rel = d.relative_to(store).as_posix()
    with tarfile.open(out) as tar:
        assert tar.getnames() == [
            "fi-cache-bundle.json",
            f"{rel}/manifest.json",
            f"{rel}/vllm/{HASH_A}/autotune_configs.json",
        ]
    r = run("--store", tmp_path / "other", "import", out)  # what export makes, import takes
    assert r.code == 0, r.err


def test_export_refuses_a_cache_import_would_refuse(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
) -> None:
    """A stale `_generation` (FlashInfer 0.6.18+ drops such a file): the bundle would be
    refused by every node's import, so export says so, naming the file, and writes nothing."""
    d = _make_namespace(store)
    cache = d / "vllm" / HASH_A / "autotune_configs.json"
    data = json.loads(cache.read_text())
    data["_generation"] = "0" * 64
    cache.write_text(json.dumps(data))
    out = tmp_path / "b.tar.gz"
    r = run("export", "-o", out)
    assert r.code != 0 and str(cache) in r.err and "import would refuse" in r.err
    assert len(r.err.strip().splitlines()) == 1 and not out.exists()


# --- the environment check trusts the caches ----------------------------------------------------


def test_caches_written_elsewhere_are_refused_though_the_manifest_matches(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
) -> None:
    src = tmp_path / "src"
    d = _make_namespace(src)  # its manifest: this machine (an H200)
    cache = d / "vllm" / HASH_A / "autotune_configs.json"
    data = json.loads(cache.read_text())
    data["_metadata"]["gpu"] = "NVIDIA B200"
    data["_generation"] = v1.compute_generation(v1.loads(json.dumps(data).encode()))  # sound
    cache.write_text(json.dumps(data))
    out = tmp_path / "b.tar.gz"
    bundle.export(src, [d], out)
    r = run("import", out)
    member = cache.relative_to(src).as_posix()
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert f"bundle member {member!r} was written in another environment" in r.err
    assert "gpu: cache 'NVIDIA B200', here 'NVIDIA H200'" in r.err
    assert not (store / "namespaces").exists()
    assert run("import", "--force", out).code == 0
    assert (store / member).read_bytes() == cache.read_bytes()


def test_a_v2_store_written_elsewhere_is_refused(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
) -> None:
    meta = json.loads(MOE_618_FUSED.read_text())["_metadata"]
    src = tmp_path / "src"
    d = _make_namespace(src)
    ours = hand_v2_store(d / "vllm", meta)  # the v2 store of this environment travels and imports
    out = tmp_path / "ours.tar.gz"
    bundle.export(src, [d], out)
    assert run("import", out).code == 0
    assert sorted(p.name for p in (store / ours.relative_to(src)).rglob("*.json"))
    shutil.rmtree(ours)
    theirs = hand_v2_store(d / "vllm", {**meta, "flashinfer_version": "0.7.2.post1"})
    bundle.export(src, [d], out)
    r = run("import", out)
    member = (theirs / "manifest.json").relative_to(src).as_posix()
    assert r.code == 2 and f"bundle member {member!r} was written in another environment" in r.err
    assert "flashinfer_version: cache '0.7.2.post1', here '0.6.18'" in r.err
    assert not (store / theirs.relative_to(src)).exists()


@pytest.mark.parametrize("how", ENCODINGS)
def test_a_v2_entry_flashinfer_cannot_decode_is_refused(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint, how: str
) -> None:
    src = tmp_path / "src"
    d = _make_namespace(src)
    env_dir = hand_v2_store(d / "vllm", json.loads(MOE_618_FUSED.read_text())["_metadata"])
    entry = sorted((env_dir / "entries").iterdir())[0]
    undecodable(entry, how)  # json.loads(bytes) takes it; FlashInfer's UTF-8 read misses it
    out = tmp_path / "b.tar.gz"
    older_export(src, [d], out)  # today's export refuses to make it
    r = run("import", out)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "bundled cache " in r.err and entry.name in r.err
    assert not (store / "namespaces").exists()


# --- nothing hangs, nothing is decompressed for nothing -----------------------------------------


def test_import_of_a_fifo_is_refused_at_once(run, tmp_path: Path, here: Fingerprint) -> None:  # type: ignore[no-untyped-def]
    import contextlib
    import os
    import threading

    fifo = tmp_path / "bundle.tar.gz"
    os.mkfifo(fifo)

    def unblock() -> None:  # an import stuck opening the FIFO gets a writer, then EOF
        with contextlib.suppress(OSError):  # no reader left: the import did not block
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(5.0, unblock)
    timer.start()
    try:
        r = run("import", fifo)
    finally:
        timer.cancel()
        unblock()
    assert r.code == 2 and f"{fifo}: not a regular file" in r.err, r.err


def _truncated_after(prefix: bytes) -> bytes:
    """A gzip stream of `prefix` that then stops: whatever would come later is unreadable."""
    z = zlib.compressobj(wbits=31)  # gzip framing
    return z.compress(prefix) + z.flush(zlib.Z_SYNC_FLUSH)  # no final block, no trailer


def _header(name: str, size: int, pax: dict[str, str] | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    if pax:
        info.pax_headers = pax
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _manifest_block(man: dict) -> bytes:  # type: ignore[type-arg]
    data = json.dumps(man).encode()
    return _header("fi-cache-bundle.json", len(data)) + data + b"\0" * (-len(data) % 512)


def test_a_member_declared_over_the_file_cap_is_refused_from_the_manifest(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, _ = _good_parts(store)
    man["files"][1]["size"] = 600 * 1024**2  # within the bundle cap, over the file cap
    path = tmp_path / "b.tar.gz"
    path.write_bytes(_truncated_after(_manifest_block(man)))  # and not a byte of it follows
    _refused(store, path, "autotune_configs.json' declares 600 MB, over the 512 MB limit")


def test_a_tar_header_unlike_the_manifest_is_refused_before_its_data(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    name = members[0][0].name
    path = tmp_path / "b.tar.gz"
    path.write_bytes(_truncated_after(_manifest_block(man) + _header(name, 6 * 1024**3)))
    _refused(store, path, "its tar header says 6442450944 bytes, its manifest")


def test_members_the_manifest_does_not_list_are_refused_at_the_first(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, _ = _good_parts(store)
    rel = man["namespaces"][0]["path"]
    extra = b"".join(_header(f"{rel}/vllm/x{i}.json", 0) for i in range(2000))
    path = tmp_path / "b.tar.gz"
    path.write_bytes(_truncated_after(_manifest_block(man) + extra))
    _refused(store, path, f"bundle member '{rel}/vllm/x0.json' is not in its manifest")


def test_a_manifest_listing_absurdly_many_files_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, _ = _good_parts(store)
    man["files"] = [{"path": "a", "size": 0, "sha256": ""}] * 50_001
    path = tmp_path / "b.tar.gz"
    path.write_bytes(_truncated_after(_manifest_block(man)))
    _refused(store, path, "lists 50001 entries, over the limit of 50000")


def test_an_oversized_extended_header_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    man, members = _good_parts(store)
    info, data = members[1]
    info.pax_headers = {"comment": "x" * 65536}  # tarfile would read it whole into memory
    path = _tar(tmp_path / "b.tar.gz", _with_manifest(man, [members[0], (info, data)]))
    _refused(store, path, "extended tar header")


def test_a_bundle_limit_that_is_not_a_number_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_MAX_BUNDLE_MB", "4G")
    with pytest.raises(Refused, match="FI_CACHE_MAX_BUNDLE_MB='4G': give a whole number of MB"):
        bundle.max_bundle_bytes()


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_export_o_never_replaces_a_device_fifo_socket_or_dir(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, kind: str
) -> None:
    _make_namespace(store)
    out = tmp_path / "null"
    still = make_special(out, kind)
    with no_hang():
        r = run("export", "-o", out)
    assert r.code == 2 and r.err.startswith(f"fi-cache: {out}: is "), r.err
    assert r.err.count("\n") == 1 and still()


def test_a_fifo_planted_as_the_in_use_file_does_not_hang_an_import(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint
) -> None:
    ns = _make_namespace(store)
    out = tmp_path / "b.tar.gz"
    assert run("export", "-o", out).code == 0
    os.mkfifo(ns / IN_USE_NAME)  # import asks whether a server holds it: an open() would wait
    with no_hang():
        r = run("import", out)
    assert r.code == 0, r.err
    assert "imported 1 namespace(s)" in r.out and (ns / "manifest.json").is_file()


# --- every cache member is judged by verify's rules (what FlashInfer's loader can use) -----------


def corrupt_cache(how: str) -> bytes:
    """MOE_618_FUSED with one defect `fi-cache verify` reports (exit 1) and FlashInfer trips on."""
    d = json.loads(MOE_618_FUSED.read_text())
    first = next(k for k in d if not k.startswith("_"))
    if how == "unparsable-key":
        d["("] = d[first]
    elif how == "value-not-a-list":
        d[first] = 1
    elif how == "records-not-an-object":
        d["_records"] = [1]
    if how == "generation-mismatch":
        d["_generation"] = "0" * 64
    else:  # a _generation that fits: the one defect is the one named
        d["_generation"] = v1.compute_generation(v1.loads(json.dumps(d).encode()))
    return json.dumps(d).encode()


def _bundle_of(tmp_path: Path, caches: dict[str, bytes]) -> Path:
    """A bundle of one namespace per finalize mode in `caches`, each holding that cache, listed
    and checksummed as export lists them (so only the cache content can be wrong)."""
    src = tmp_path / "src"
    namespaces, files = [], []
    for finalize, data in caches.items():
        d = _make_namespace(src, finalize)
        rel = d.relative_to(src).as_posix()
        namespaces.append({"path": rel, "fingerprint": dict(FP.__dict__), "finalize": finalize})
        files += [
            (f"{rel}/manifest.json", (d / "manifest.json").read_bytes()),
            (f"{rel}/vllm/{HASH_A}/autotune_configs.json", data),
        ]
    man = {
        "format": "fi-cache-bundle",
        "schema": 1,
        "fi_cache_version": "0",
        "created": 1.0,
        "namespaces": namespaces,
        "files": [{"path": n, "size": len(b), "sha256": _sha(b)} for n, b in files],
    }
    members = _with_manifest(man, [_file(n, b) for n, b in files])
    return _tar(tmp_path / "b.tar.gz", members)


CORRUPTIONS = ["unparsable-key", "value-not-a-list", "records-not-an-object", "generation-mismatch"]


@pytest.mark.parametrize("how", CORRUPTIONS)
@pytest.mark.parametrize("where", ["only", "second"])
def test_a_cache_member_verify_calls_corrupt_is_refused_before_anything_lands(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint, how: str, where: str
) -> None:
    good, bad = MOE_618_FUSED.read_bytes(), corrupt_cache(how)
    caches = {"fused": bad} if where == "only" else {"fused": good, "unfused": bad}
    path = _bundle_of(tmp_path, caches)
    for force in ([], ["--force"]):  # --force is for another environment, never for corrupt
        r = run("import", path, *force)
        assert r.code == 2 and r.err.count("\n") == 1, r.err
        assert "bundled cache " in r.err and "autotune_configs.json" in r.err, r.err
        assert not (store / "namespaces").exists(), "nothing may land, not even the good one"


def test_the_same_bundle_with_sound_caches_imports(  # type: ignore[no-untyped-def]
    run, store: Path, tmp_path: Path, here: Fingerprint
) -> None:
    good = MOE_618_FUSED.read_bytes()
    r = run("import", _bundle_of(tmp_path, {"fused": good, "unfused": good}))
    assert r.code == 0, r.err
    assert len(list((store / "namespaces").rglob("autotune_configs.json"))) == 2


def _with_namespace_manifest(tmp_path: Path, store: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A well-formed bundle whose namespace manifest `edit` changed (and the bundle's manifest
    lists as export would: its size and sha256)."""
    man, members = _good_parts(store)
    info, data = members[0]
    ns_manifest = json.loads(data)
    edit(ns_manifest)
    data = json.dumps(ns_manifest).encode()
    man["files"][0].update(size=len(data), sha256=_sha(data))
    members[0] = _file(info.name, data)
    return _tar(tmp_path / "b.tar.gz", _with_manifest(man, members))


_WARM_RECORD = {
    "started": 1.0,
    "seconds": 1.0,
    "vllm_version": "0.30.0",
    "argv": ["m"],
    "argv_key": "m",
    "supports_finalize_env": None,
}


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("warms", "/tmp/victim/autotune_configs.json"),
        ("warms", "../../../../../../victim/x/autotune_configs.json"),
        ("evictions", "/etc/passwd"),
    ],
)
def test_a_namespace_manifest_naming_files_outside_it_is_refused(
    run,  # type: ignore[no-untyped-def]
    store: Path,
    tmp_path: Path,
    here: Fingerprint,
    where: str,
    path: str,
) -> None:
    def edit(ns_manifest: dict) -> None:  # type: ignore[type-arg]
        if where == "warms":
            file = {"path": path, "entries": 1, "size": 1}
            ns_manifest["warms"] = [{**_WARM_RECORD, "files": [file]}]
        else:
            file = {"path": path, "evicted": ["k"], "kept": 1}
            ns_manifest["evictions"] = [{"at": 1.0, "selector": {}, "files": [file]}]

    bad = _with_namespace_manifest(tmp_path, tmp_path / "src", edit)
    r = run("import", bad)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert f"{where}: files: path {path!r}" in r.err and "not a path inside the namespace" in r.err
    assert not (store / "namespaces").exists(), "nothing installed"


def test_a_namespace_manifest_over_its_size_cap_is_refused_unread(tmp_path: Path) -> None:
    store = tmp_path / "s"
    big = "x" * bundle.MAX_NAMESPACE_MANIFEST_BYTES
    path = _with_namespace_manifest(tmp_path, store, lambda d: d.update(padding=big))
    _refused(store, path, "namespace manifest .* declares 4.0 MB, over the 4 MB limit")
    assert not store.exists(), "refused before a byte is written"


def test_a_namespace_manifest_with_too_many_records_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "s"
    warms = [{**_WARM_RECORD, "files": []}] * (bundle.MAX_NAMESPACE_RECORDS + 1)
    path = _with_namespace_manifest(tmp_path, store, lambda d: d.update(warms=warms))
    _refused(store, path, "holds 10001 warm and evict records, over the limit of 10000")
