"""Namespace manifests: round trip, unknown fields kept, which warm counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fi_cache.errors import CorruptCache
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as m
from fi_cache.store.namespace import Namespace
from tests.conftest import no_hang

NS = Namespace(Fingerprint(flashinfer_version="0.6.18", gpu="NVIDIA H200", arch="90a"), "unfused")


def _warm(started: float, key: str = "k", ok: bool = True) -> m.WarmRecord:
    files = [m.CacheFileRecord("vllm/abc/autotune_configs.json", 32, 9000)]
    return m.WarmRecord(started, 10.0, "0.30.0", ["Qwen/Qwen3-30B-A3B"], key, files, False, ok)


def test_round_trip_keeps_newer_fields(tmp_path: Path) -> None:
    man = m.Manifest.new(NS, now=100.0).with_warm(_warm(100.0))
    m.save(tmp_path, man)
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["added_by_fi_cache_0_9"] = {"x": 1}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    again = m.load(tmp_path)
    assert again is not None and again.warms == man.warms and again.fingerprint == NS.fingerprint
    m.save(tmp_path, again.used(500.0))
    assert json.loads((tmp_path / "manifest.json").read_text())["added_by_fi_cache_0_9"] == {"x": 1}


def test_evictions_round_trip_and_a_manifest_without_them_has_none(tmp_path: Path) -> None:
    gone = m.EvictedFile("vllm/abc/autotune_configs.json", ["('k',)"], 31)
    man = m.Manifest.new(NS, now=1.0).with_eviction(m.EvictRecord(5.0, {"tactic": 104}, [gone]))
    m.save(tmp_path, man)
    again = m.load(tmp_path)
    assert again is not None and again.evictions == man.evictions
    assert again.evictions_of("vllm/abc/autotune_configs.json") == [(man.evictions[0], gone)]
    m.save(tmp_path, m.Manifest.new(NS, now=1.0))
    assert "evictions" not in json.loads((tmp_path / "manifest.json").read_text())


def test_last_warm_filters_by_arguments_time_and_success() -> None:
    man = m.Manifest.new(NS, now=0).with_warm(_warm(100.0, "a")).with_warm(_warm(200.0, "b"))
    man = man.with_warm(_warm(300.0, "a", ok=False))
    assert man.last_warm("a") is not None and man.last_warm("a").started == 100.0  # type: ignore[union-attr]
    assert man.last_warm("a", since=150.0) is None
    assert man.last_warm("b", since=150.0) is not None
    assert man.last_used == 310.0


@pytest.mark.parametrize("text", ["{", "[]", '{"fingerprint": {}}'])
def test_bad_manifest_is_a_corrupt_cache(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(CorruptCache):
        m.load(tmp_path)


def test_no_manifest_is_none(tmp_path: Path) -> None:
    assert m.load(tmp_path) is None


_OK = '"fingerprint": {}, "finalize": "fused", "created": 1, "last_used": 1'
_WARM = (
    '"started": 1, "seconds": 1, "vllm_version": null, "argv_key": "k", '
    '"supports_finalize_env": null'
)


_BAD_FILE = '{"path": 5, "entries": 1, "size": 1}'


@pytest.mark.parametrize(
    "text",
    [
        "{" + _OK + ', "warms": [5]}',
        "{" + _OK + ', "warms": {"a": 1}}',
        "{" + _OK + ', "warms": [{' + _WARM + ', "argv": [], "files": [' + _BAD_FILE + "]}]}",
        "{" + _OK + ', "warms": [{' + _WARM + ', "argv": "m", "files": []}]}',
        "{" + _OK + ', "warms": [{' + _WARM + ', "argv": [], "files": [], "ok": "no"}]}',
        "{" + _OK.replace('"created": 1', '"created": "1"') + "}",
        "{" + _OK.replace("{}", '{"gpu": ["NVIDIA H200"]}') + "}",
        "{" + _OK.replace("{}", '{"gpu": "NVIDIA H200\\ud800"}') + "}",
        "{" + _OK.replace('"fused"', "5") + "}",
        "{" + _OK + ', "evictions": [{"at": 1, "selector": {"op": ["x"]}, "files": []}]}',
        "{" + _OK + ', "evictions": [{"at": 1, "selector": {}, "files": [{"path": "f", '
        '"evicted": "k", "kept": 1}]}]}',
        "{" + _OK + ', "evictions": [{"selector": {}, "files": []}]}',
        "[" * 50_000 + "]" * 50_000,
    ],
)
def test_a_malformed_manifest_is_a_corrupt_cache_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(CorruptCache) as info:
        m.load(tmp_path)
    assert info.value.path == str(tmp_path / "manifest.json")


def test_a_manifest_that_is_not_utf8_or_a_fifo_is_a_corrupt_cache(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(b'{"fingerprint": "\xff"}')
    with pytest.raises(CorruptCache, match="not UTF-8"):
        m.load(tmp_path)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    with no_hang(), pytest.raises(CorruptCache, match="FIFO"):
        m.load(fifo)


def _with_file(path: str, where: str = "warms") -> str:
    if where == "warms":
        file = json.dumps({"path": path, "entries": 1, "size": 1})
        return "{" + _OK + ', "warms": [{' + _WARM + ', "argv": [], "files": [' + file + "]}]}"
    file = json.dumps({"path": path, "evicted": ["k"], "kept": 1})
    return "{" + _OK + ', "evictions": [{"at": 1, "selector": {}, "files": [' + file + "]}]}"


@pytest.mark.parametrize("where", ["warms", "evictions"])
@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../../../../../../victim/autotune_configs.json", "vllm/../../x.json"]
)
def test_a_manifest_naming_a_file_outside_its_namespace_is_refused(
    tmp_path: Path, path: str, where: str
) -> None:
    (tmp_path / "manifest.json").write_text(_with_file(path, where))
    with pytest.raises(CorruptCache, match="not a path inside the namespace") as info:
        m.load(tmp_path)
    assert repr(path) in info.value.message
    (tmp_path / "manifest.json").write_text(_with_file("vllm/abc/autotune_configs.json", where))
    assert m.load(tmp_path) is not None


def test_the_manifest_keeps_the_newest_records_only() -> None:
    man = m.Manifest.new(NS, now=0)
    gone = m.EvictedFile("vllm/abc/autotune_configs.json", ["('k',)"], 31)
    for i in range(m.MAX_RECORDS + 5):
        man = man.with_warm(_warm(float(i))).with_eviction(m.EvictRecord(i, {}, [gone]))
    assert len(man.warms) == len(man.evictions) == m.MAX_RECORDS
    assert man.warms[0].started == 5.0 and man.warms[-1].started == m.MAX_RECORDS + 4
    assert man.evictions[0].at == 5.0
