"""Files fi-cache writes load in the real FlashInfer (`AutoTuner.load_configs`).

FlashInfer is imported in a child process (tests/fixtures/fi_load.py) from the dirs listed in
FI_CACHE_FLASHINFER_DIRS, which scripts/test.sh fills with FlashInfer 0.6.17 and 0.6.18
(installed --no-deps beside a CPU torch). Without them these tests skip; under scripts/test.sh
(FI_CACHE_REQUIRE_FLASHINFER=1) they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.model import v1
from fi_cache.store.files import atomic_write
from tests.conftest import (
    FI_VERSIONS,
    FIXTURES,
    GEMM_617,
    GEMM_618,
    MOE_617_FUSED,
    MOE_618_FUSED,
    flashinfer_dir,
    h200_metadata,
    run_parallel,
)


def _load_with_flashinfer(version: str, path: Path) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir(version))}  # skips, or fails in CI
    p = subprocess.run(
        [sys.executable, str(FIXTURES / "fi_load.py"), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _merge_write(sources: list[Path], out: Path) -> v1.CacheFile:
    """What fi-cache's writers do: union of same-metadata files, FlashInfer layout, atomic."""
    files = [v1.loads(p.read_bytes()) for p in sources]
    entries: dict[str, list[object]] = {}
    for f in files:
        entries.update(f.entries)
    merged = v1.CacheFile(files[0].metadata, entries, generation=files[0].generation)
    atomic_write(out, v1.dumps(merged).encode())
    return merged


@pytest.mark.parametrize(
    "version, sources",
    [("0.6.17", [GEMM_617, MOE_617_FUSED]), ("0.6.18", [GEMM_618, MOE_618_FUSED])],
)
def test_flashinfer_loads_every_entry_fi_cache_wrote(
    version: str, sources: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "autotune_configs.json"
    merged = _merge_write(sources, out)
    result = _load_with_flashinfer(version, out)
    assert "error" not in result, result.get("error")
    assert result["flashinfer_version"] == version and result["returned"] is True
    assert result["loaded"] == len(merged.entries) == 70
    assert sorted(result["keys"]) == sorted(merged.entries)
    assert result["values"] == {k: v[:2] for k, v in merged.entries.items()}
    if version == "0.6.17":  # no `_generation` written, so no bogus entry for a 0.6.17 reader
        assert not any(k.startswith("_") for k in result["keys"])


# --- "ok" means FlashInfer loads it: every shape load_configs reads, against fi-cache's checks ---
#
# load_configs (autotuner.py, 0.6.17:2274-2398, 0.6.18:2657-2790): json.load; pop `_metadata`
# (0.6.18 also `_generation`, and `_records`, which must be an object); skip the whole file when
# `_metadata` does not match the environment (a non-object `_metadata` never does); then EVERY
# other top-level field is an entry: `runner = value[0]; _json_to_tactic(value[1]);
# runner.startswith("Cudnn")`, and a cuDNN entry with an int tactic >= 0 is dropped.

_KEY = next(k for k in json.loads(GEMM_617.read_text()) if k.startswith("("))
_RUNNER = "CublasltBf16GemmRunner"
_CUDNN_KEY = _KEY.replace(_RUNNER, "CudnnBf16GemmRunner")
_OK = {_KEY: [_RUNNER, 2]}

# (id, content: JSON data or raw bytes, `_metadata` of this FlashInfer version or None)
LOAD_SHAPES: list[tuple[str, object, str | None]] = [
    ("valid", _OK, None),
    ("valid-stamped-0.6.17", _OK, "0.6.17"),
    ("valid-stamped-0.6.18", _OK, "0.6.18"),
    ("empty-object", {}, None),
    ("not-json", b"{", None),
    ("not-utf8", b'{"\xe9": ["r", 1]}', None),
    ("top-array", [], None),
    ("top-string", "x", None),
    ("top-number", 1, None),
    ("top-null", None, None),
    ("metadata-null", {"_metadata": None, **_OK}, None),
    ("metadata-array", {"_metadata": [], **_OK}, None),
    ("metadata-string", {"_metadata": "*", **_OK}, None),
    ("metadata-false", {"_metadata": False, **_OK}, None),
    ("metadata-empty", {"_metadata": {}, **_OK}, None),
    ("issue-x-list-of-ints", {"x": [1, 2]}, None),
    ("issue-name-version", {"name": "x", "version": 1}, None),
    ("field-x-list-of-ints-0.6.18", {**_OK, "x": [1, 2]}, "0.6.18"),
    ("field-number", {**_OK, "note": 5}, None),
    ("field-null", {**_OK, "note": None}, None),
    ("field-object", {**_OK, "note": {"a": 1}}, None),
    ("field-empty-array", {**_OK, "note": []}, None),
    ("field-one-char", {**_OK, "note": "h"}, None),
    ("field-string", {**_OK, "note": "hello"}, None),  # a bogus entry no lookup ever matches
    ("field-runner-and-tactic", {**_OK, "x": ["r", 1]}, None),
    ("value-number", {_KEY: 5}, None),
    ("value-float", {_KEY: 1.5}, None),
    ("value-bool", {_KEY: True}, None),
    ("value-null", {_KEY: None}, None),
    ("value-object", {_KEY: {"a": 1}}, None),
    ("value-empty-object", {_KEY: {}}, None),
    ("value-empty-array", {_KEY: []}, None),
    ("value-one-element", {_KEY: [_RUNNER]}, None),
    ("value-empty-string", {_KEY: ""}, None),
    ("value-one-char", {_KEY: "a"}, None),
    ("value-string", {_KEY: "ab"}, None),  # loaded as runner "a", tactic "b"
    ("value-runner-number", {_KEY: [1, 2]}, None),
    ("value-runner-null", {_KEY: [None, 2]}, None),
    ("value-runner-array", {_KEY: [["a"], 2]}, None),
    ("value-three-elements", {_KEY: [_RUNNER, 2, "policy"]}, None),
    ("value-tactic-string", {_KEY: [_RUNNER, "x"]}, None),
    ("value-tactic-nested", {_KEY: [_RUNNER, [1, [2, 3]]]}, None),
    ("cudnn-int-tactic", {_CUDNN_KEY: ["CudnnBf16GemmRunner", 3]}, None),  # dropped on load
    ("cudnn-fallback-tactic", {_CUDNN_KEY: ["CudnnBf16GemmRunner", -1]}, None),
    ("cudnn-plan-tactic", {_CUDNN_KEY: ["CudnnBf16GemmRunner", [0, []]]}, None),
    ("records-object", {**_OK, "_records": {"ns": {}}}, None),
    ("records-empty", {**_OK, "_records": {}}, None),
    ("records-0.6.17", {**_OK, "_records": {"ns": {}}}, "0.6.17"),
    ("records-0.6.18", {**_OK, "_records": {"ns": {}}}, "0.6.18"),
    ("records-array", {**_OK, "_records": []}, None),
    ("records-null-0.6.18", {**_OK, "_records": None}, "0.6.18"),
    ("records-string-0.6.17", {**_OK, "_records": "ab"}, "0.6.17"),  # a bogus entry there
    ("records-string-0.6.18", {**_OK, "_records": "ab"}, "0.6.18"),
    ("generation-number", {**_OK, "_generation": 5}, None),
    ("generation-null", {**_OK, "_generation": None}, None),
    ("generation-one-char", {**_OK, "_generation": "a"}, None),
    ("generation-number-0.6.18", {**_OK, "_generation": 5}, "0.6.18"),
    ("generation-null-0.6.18", {**_OK, "_generation": None}, "0.6.18"),
    ("duplicate-key", f'{{"{_KEY}": 5, "{_KEY}": ["{_RUNNER}", 1]}}'.encode(), None),
]

# FlashInfer loads these as written, fi-cache still calls them corrupt: no FlashInfer writes
# them, and the runner gets the odd tactic at the first call of that shape.
STRICTER = {
    "value-tactic-float": ({_KEY: [_RUNNER, 1.5]}, "a float tactic"),
    "value-tactic-null": ({_KEY: [_RUNNER, None]}, "a null tactic"),
    "value-tactic-bool": ({_KEY: [_RUNNER, True]}, "a boolean tactic"),
    "value-tactic-object": ({_KEY: [_RUNNER, {"a": 1}]}, "an object tactic"),
    "value-five-elements": ({_KEY: [_RUNNER, 2, 3, 4, 5]}, "5 elements (0.7.4 writes 4)"),
    "key-unparsable": ({"(not a key": [_RUNNER, 2]}, "no lookup can match the key"),
}
# Skipped for the environment it records: foreign-environment's business (doctor), not corruption.
ENVIRONMENT = {"metadata-empty"}


def _shape_bytes(content: object, stamp: str | None) -> bytes:
    if isinstance(content, bytes):
        return content
    if stamp is not None:
        assert isinstance(content, dict)
        content = {"_metadata": h200_metadata(stamp), **content}
    return json.dumps(content).encode()


def _flashinfer_verdict(result: dict, data: bytes) -> str:  # type: ignore[type-arg]
    """crash | skip (whole file) | misload (an entry not held as written) | load."""
    if "error" in result:
        return "crash"
    if not result["returned"]:
        return "skip"
    entries = {k: v for k, v in json.loads(data).items() if k.startswith("(")}
    held = result["values"]
    if any(k not in held or held[k] != v[:2] for k, v in entries.items()):
        return "misload"
    return "load"


@pytest.fixture(scope="module")
def load_shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:  # type: ignore[type-arg]
    """Every shape written to a file and loaded by real FlashInfer 0.6.17 and 0.6.18 (one child
    per version), with fi-cache's verify and doctor results for the same files."""
    root = tmp_path_factory.mktemp("shapes")
    rows = [*LOAD_SHAPES, *((k, c, None) for k, (c, _) in STRICTER.items())]
    files = {}
    for name, content, stamp in rows:
        files[name] = (root / f"{name}.json", stamp)
        files[name][0].write_bytes(_shape_bytes(content, stamp))
    paths = [str(p) for p, _ in files.values()]
    jobs = [
        {
            "args": [sys.executable, str(FIXTURES / "fi_load.py"), *paths],
            "env": {**os.environ, "PYTHONPATH": str(flashinfer_dir(v))},
        }
        for v in FI_VERSIONS
    ]
    loads = {}
    for version, p in zip(FI_VERSIONS, run_parallel(*jobs), strict=True):
        lines = p.stdout.strip().splitlines()
        assert len(lines) == len(paths), p.stderr[-2000:]
        loads[version] = [json.loads(line) for line in lines]
    return {
        name: {
            "path": path,
            "stamp": stamp,
            "loads": {v: loads[v][i] for v in FI_VERSIONS},
        }
        for i, (name, (path, stamp)) in enumerate(files.items())
    }


def _cli_json(store: Path, *args: str) -> dict:  # type: ignore[type-arg]
    from click.testing import CliRunner

    from fi_cache.cli import main

    with CliRunner().isolation() as streams, pytest.raises(SystemExit):
        main(["--store", str(store), "--format", "json", *args])
    return json.loads(streams[0].getvalue().decode())  # type: ignore[no-any-return]


def test_fi_cache_says_corrupt_exactly_where_flashinfer_crashes_or_ignores(
    load_shapes: dict[str, dict],
    tmp_path: Path,  # type: ignore[type-arg]
) -> None:
    paths = [str(s["path"]) for s in load_shapes.values()]
    verify = {r["path"]: r for r in _cli_json(tmp_path, "verify", *paths)["results"]}
    doctor = _cli_json(tmp_path, "doctor", "--flashinfer-version", "0.6.17", *paths)
    errors = {  # the load-path ids; a 0.6.17 target, so records-unreadable is asked too
        f["path"]
        for f in doctor["findings"]
        if f["check"] in ("corrupt-file", "records-unreadable") and f["severity"] == "error"
    }
    disagree = []
    for name, shape in load_shapes.items():
        data = shape["path"].read_bytes()
        # Only the FlashInfer its `_metadata` names reads a stamped file; any reads the others.
        readers = [shape["stamp"]] if shape["stamp"] else list(FI_VERSIONS)
        verdicts = {v: _flashinfer_verdict(shape["loads"][v], data) for v in readers}
        for v in set(FI_VERSIONS) - set(readers):  # the other version skips it, unread
            assert _flashinfer_verdict(shape["loads"][v], data) == "skip", name
        result = verify[str(shape["path"])]
        corrupt = any(
            p["check"] in ("corrupt-file", "records-unreadable") for p in result["problems"]
        )
        if name in STRICTER:
            expected = True
            assert set(verdicts.values()) == {"load"}, (name, verdicts)
        elif name in ENVIRONMENT:
            expected = False
            assert set(verdicts.values()) == {"skip"}, (name, verdicts)
        else:
            expected = any(x != "load" for x in verdicts.values())
        if corrupt != expected:
            disagree.append((name, verdicts, result["problems"]))
        # doctor reads the same files the same way (a 0.6.17 target: stamped 0.6.18 files are
        # another environment, which it names instead; their integrity is verify's above)
        if "0.6.18" not in (shape["stamp"] or "") and (str(shape["path"]) in errors) != expected:
            disagree.append((name, verdicts, "doctor"))
    assert not disagree, "\n".join(map(str, disagree))


def test_every_crash_names_the_field_and_what_flashinfer_raises(
    load_shapes: dict[str, dict],
    tmp_path: Path,  # type: ignore[type-arg]
) -> None:
    shape = load_shapes["issue-x-list-of-ints"]
    assert "AttributeError" in shape["loads"]["0.6.17"]["error"]
    r = _cli_json(tmp_path, "verify", str(shape["path"]))["results"][0]
    assert not r["ok"] and r["problems"][0]["check"] == "corrupt-file"
    assert "'x'" in r["problems"][0]["message"]
    assert "AttributeError" in r["problems"][0]["message"]
    shape = load_shapes["issue-name-version"]
    assert "IndexError" in shape["loads"]["0.6.17"]["error"]
    r = _cli_json(tmp_path, "verify", str(shape["path"]))["results"][0]
    assert [p["check"] for p in r["problems"]] == ["corrupt-file", "corrupt-file"]
    assert "'name'" in r["problems"][0]["message"] and "IndexError" in r["problems"][0]["message"]
    assert "'version'" in r["problems"][1]["message"] and "TypeError" in r["problems"][1]["message"]
