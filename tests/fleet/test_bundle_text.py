"""Import refuses bundles carrying JSON no FlashInfer writes (issue 12): one such bundle would
otherwise break `ls` and `doctor` for every user of the store."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.fleet import bundle
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as m
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_618, HASH_A, older_export, with_surrogate

FP = Fingerprint.from_metadata(json.loads(GEMM_618.read_text())["_metadata"], "90a")


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> Fingerprint:
    env = Environment(FP, (), VllmInfo(None, None, None), None)
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    return FP


def _export(src: Path, out: Path, text: str, fp: Fingerprint = FP) -> Path:
    ns = Namespace(fp, "fused")
    d = ns.path(src)
    cache = d / "vllm" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    m.save(d, m.Manifest.new(ns, now=1.0))
    older_export(src, [d], out)  # today's export refuses a cache import refuses
    return out


@pytest.mark.parametrize("spot", ["gpu", "key", "_generation"])
def test_a_cache_with_a_lone_surrogate_is_refused(run, store, tmp_path, here, spot) -> None:  # type: ignore[no-untyped-def]
    out = _export(tmp_path / "src", tmp_path / "b.tar.gz", with_surrogate(GEMM_618, spot))
    r = run("import", "--force", out)
    assert r.code == 2 and str(out) in r.err and "lone UTF-16 surrogate" in r.err, r.err
    assert not (store / "namespaces").exists()


def _tar(out: Path, manifest: dict, members: list[tuple[str, bytes]]) -> Path:  # type: ignore[type-arg]
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [(bundle.BUNDLE_MANIFEST, json.dumps(manifest).encode()), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def test_a_fingerprint_with_a_lone_surrogate_is_refused(run, store, tmp_path, here) -> None:  # type: ignore[no-untyped-def]
    odd = FP.replace(gpu="NVIDIA H200\ud800")  # path and digest agree with it: only the text is bad
    ns = Namespace(odd, "fused")
    rel = ns.relpath.as_posix()
    members = [
        (f"{rel}/manifest.json", json.dumps(m.to_json(m.Manifest.new(ns, now=1.0))).encode()),
        (f"{rel}/vllm/{HASH_A}/autotune_configs.json", GEMM_618.read_bytes()),
    ]
    bm = bundle.BundleManifest(
        (bundle.BundledNamespace(rel, odd, "fused"),),
        tuple(bundle.BundleFile(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in members),
        1.0,
        "0.1.0",
    )
    out = _tar(tmp_path / "b.tar.gz", bm.to_json(), members)
    r = run("import", "--force", out)
    assert r.code == 2 and str(out) in r.err and "lone UTF-16 surrogate" in r.err, r.err
    assert not (store / "namespaces").exists()
    assert run("ls").code == 0


def test_a_deeply_nested_bundle_manifest_names_the_bundle(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "deep.tar.gz"
    data = ("[" * 100_000 + "]" * 100_000).encode()
    with tarfile.open(out, "w:gz") as tar:
        info = tarfile.TarInfo(bundle.BUNDLE_MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    r = run("import", out)
    assert r.code == 2 and r.err.count("\n") == 1 and str(out) in r.err, r.err
    assert not store.exists() or not any(store.iterdir())


def test_a_malformed_bundle_manifest_names_the_bundle(run, store: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = _export(tmp_path / "src", tmp_path / "good.tar.gz", GEMM_618.read_text())
    out = tmp_path / "bad.tar.gz"
    with tarfile.open(good) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == bundle.BUNDLE_MANIFEST:
                data = json.dumps({**json.loads(data), "schema": 7}).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    r = run("import", out)
    assert r.code == 2 and f"{out}: not a schema-1 fi-cache bundle" in r.err, r.err
    shutil.rmtree(tmp_path / "src")
