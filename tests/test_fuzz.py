"""The attack of issue 12 as a test: random and mutated caches, manifests and logs through what
reads them (inventory, show's and ls's rows, verify's defects, doctor's checks, merge's reader,
the log reader). Property: no exception but the project's own (FiCacheError), and every message
and row can be printed and written as JSON. Bounded (a few seconds) and derandomized: CI sees
the same examples on every run.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fi_cache import doctor
from fi_cache.caches import inventory
from fi_cache.cli import ls, render, show
from fi_cache.doctor import Inputs, Target
from fi_cache.doctor.gather import GatherRequest, gather
from fi_cache.doctor.logs import parse_log, read_log
from fi_cache.errors import FiCacheError
from fi_cache.maintenance import merge
from fi_cache.model import keys, v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import Namespace
from tests.conftest import FI, GEMM_618, H200, HASH_A, MOE_617_FUSED, with_surrogate

FIXTURES = sorted([*H200.glob("*.json"), *FI.glob("*.json")])
SEEDS = [json.loads(p.read_text()) for p in FIXTURES]
LOGS = sorted(H200.glob("*.log"))
H200_617 = Fingerprint(flashinfer_version="0.6.17", gpu="NVIDIA H200", arch="90a")
TARGETS = [
    Target(H200_617, "0.30.0", False, "unfused"),
    Target(H200_617.replace(flashinfer_version="0.6.18"), "0.33.0", True, "fused"),
    Target(Fingerprint()),  # a machine that knows nothing: nothing compared
]

FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Text with what real files hold and what attackers add: lone surrogates, NUL, the wildcard.
_chars = st.one_of(st.characters(), st.characters(categories=["Cs"]))
_words = st.sampled_from(
    ["*", "unknown", "None", "0.6.17", "0.6.18", "NVIDIA H200", "(", "('", "\ud800", "\x00", ""]
)
_text = st.one_of(_words, st.text(_chars, max_size=24))
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_deep = st.integers(min_value=30, max_value=3000).map(lambda n: "[" * n + "]" * n)


def _printable(text: Any) -> None:
    """What the CLI prints must encode: a lone surrogate in a message is a traceback there."""
    str(text).encode("utf-8")


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals itself


def _replace_somewhere(draw: Callable[..., Any], node: Any) -> None:
    """Replace one value at a random path inside `node` with random JSON."""
    while True:
        slots = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not slots:
            return
        slot = draw(st.sampled_from(slots))
        child = node[slot]
        if not isinstance(child, (dict, list)) or not child or draw(st.booleans()):
            node[slot] = draw(_json)
            return
        node = child


def _mutate_dict(draw: Callable[..., Any], data: dict[str, Any]) -> None:
    keys = list(data)
    ops = ["meta", "value", "key", "add", "generation", "records", "drop", "deep"]
    op = draw(st.sampled_from(ops))
    if op == "deep":
        _replace_somewhere(draw, data)
    elif op == "meta":
        meta = data.get("_metadata")
        if isinstance(meta, dict) and meta:
            meta[draw(st.sampled_from(sorted(meta)))] = draw(_json)
        else:
            data["_metadata"] = draw(_json)
    elif op == "value" and keys:
        data[draw(st.sampled_from(keys))] = draw(_json)
    elif op == "key" and keys:
        old = draw(st.sampled_from(keys))
        at = draw(st.integers(0, len(old)))
        cut = draw(st.integers(0, 3))
        data[old[:at] + draw(_text) + old[at + cut :]] = data.pop(old)
    elif op == "add":
        data[draw(_text)] = draw(_json)
    elif op == "generation":
        data["_generation"] = draw(st.one_of(_json, st.just("0" * 64)))
    elif op == "records":
        data["_records"] = draw(_json)
    elif keys:
        del data[draw(st.sampled_from(keys))]


@st.composite
def cache_bytes(draw: Callable[..., Any]) -> bytes:
    """A real FlashInfer file, mutated as JSON and then maybe as bytes; or random JSON."""
    if draw(st.integers(0, 4)) == 0:
        doc: Any = draw(st.one_of(_json, st.dictionaries(_text, _json, max_size=6)))
    else:
        doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
        for _ in range(draw(st.integers(1, 3))):
            _mutate_dict(draw, doc)
    text = json.dumps(doc, indent=draw(st.sampled_from([None, 2])))
    if draw(st.booleans()):
        text = text.replace("[]", draw(_deep), 1)
    raw = text.encode("utf-8", "surrogatepass")  # ensure_ascii=False is not used: escapes stay
    edit = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert"]))
    if edit == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif edit == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    elif edit == "insert":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=8)) + raw[at:]
    return raw


def _exercise(paths: list[Path], store: Path, target: Target) -> None:
    """What ls, show, verify, doctor and merge do with the files under `paths`."""
    try:
        inv = inventory.scan(paths)
    except FiCacheError as exc:
        _printable(exc)
        return
    for problem in inv.problems:
        _printable(problem.message)
    for cache in inv.caches:
        row = ls.summary(cache, store)
        json.dumps(row)
        _printable([render.short_gpu(row["gpu"]), row["flashinfer_version"], row["arch"]])
        for raw, key, value in v1.iter_entries(cache.file):
            entry = show._entry_json(raw, key, value)
            json.dumps(entry)
            _printable([entry["op"], entry["runner"], show._compact(entry["tactic"])])
            _printable(keys.shapes(entry["profile"]))
        _printable(list(cache.metadata.items()) if cache.metadata else None)
        for defect in v1.defects(cache.file):
            _printable(defect.message)
        again = v1.loads(v1.dumps(cache.file))  # what merge writes reads back the same
        assert _same(again.entries, cache.file.entries) and _same(again.metadata, cache.metadata)
        if cache.found.format == "v1":
            try:
                merge.read_source(cache.path)
            except FiCacheError as exc:
                _printable(exc)
    environ = {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(store / "no-vllm-dir")}
    inputs = gather(GatherRequest(store=store, paths=paths, target=target, environ=environ))
    for finding in doctor.run(inputs):
        _printable(finding.message)
        json.dumps(finding.to_json())


def _with_metadata(source: Path, **fields: Any) -> bytes:
    doc = json.loads(source.read_text())
    doc["_metadata"].update(fields)
    return json.dumps(doc).encode()


# What the attack of issue 12 found, always tried first (each crashed fi-cache before).
_ATTACKS = [
    with_surrogate(GEMM_618, "gpu").encode(),  # printing the GPU: UnicodeEncodeError
    with_surrogate(GEMM_618, "key").encode(),
    _with_metadata(MOE_617_FUSED, gpu=["NVIDIA H200"]),  # compare_metadata: unhashable list
]


@FUZZ
@given(raw=cache_bytes(), target=st.sampled_from(TARGETS))
@example(raw=_ATTACKS[0], target=TARGETS[0])
@example(raw=_ATTACKS[1], target=TARGETS[0])
@example(raw=_ATTACKS[2], target=TARGETS[0])
def test_any_v1_file_is_read_or_reported(tmp_path: Path, raw: bytes, target: Target) -> None:
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    cache = work / "root" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(raw)
    _exercise([work / "root"], work / "store", target)


def _real_manifest() -> dict[str, Any]:
    ns = Namespace(TARGETS[0].fingerprint, "unfused")
    files = [manifests.CacheFileRecord(f"vllm/{HASH_A}/autotune_configs.json", 32, 9000)]
    warm = manifests.WarmRecord(1.0, 2.0, "0.30.0", ["m"], "k", files, False)
    m = manifests.Manifest.new(ns, 1.0).with_warm(warm)
    counts = {"tactic_counts": {"gemm1": 3, "gemm2": {"fused": 2, "unfused": 1}}}
    return {**manifests.to_json(m), **counts}


@st.composite
def manifest_json(draw: Callable[..., Any]) -> Any:
    """A namespace manifest fi-cache wrote, mutated; or random JSON."""
    if draw(st.booleans()):
        return draw(_json)
    doc = _real_manifest()
    for _ in range(draw(st.integers(1, 3))):
        _replace_somewhere(draw, doc)
    return doc


@settings(FUZZ, max_examples=150)
@given(manifest=manifest_json(), entry=_json, raw=cache_bytes(), target=st.sampled_from(TARGETS))
@example(  # a warm record that is not an object: AttributeError in manifests.load
    manifest={**_real_manifest(), "warms": [5]}, entry={}, raw=b"{}", target=TARGETS[0]
)
@example(  # a v2 manifest naming a GPU with a lone surrogate
    manifest={"gpu": "NVIDIA H200\ud800"}, entry={}, raw=b"{}", target=TARGETS[0]
)
def test_any_v2_store_and_namespace_manifest_is_read_or_reported(
    tmp_path: Path, manifest: Any, entry: Any, raw: bytes, target: Target
) -> None:
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    env = work / "fi" / "v2" / ("0" * 16)
    (env / "entries").mkdir(parents=True)
    (env / "manifest.json").write_text(json.dumps(manifest))
    (env / "entries" / ("a" * 24 + ".json")).write_text(json.dumps(entry))
    store = work / "store"
    ns = Namespace(TARGETS[0].fingerprint, "unfused").path(store)  # the one TARGETS[0] loads
    (ns / "vllm" / HASH_A).mkdir(parents=True)
    (ns / "vllm" / HASH_A / "autotune_configs.json").write_bytes(raw)
    (ns / manifests.MANIFEST_NAME).write_text(json.dumps(manifest))
    _exercise([env, store / "namespaces"], store, target)
    try:
        m = manifests.load(ns)
    except FiCacheError as exc:
        _printable(exc)
    else:
        assert m is not None
        json.dumps(manifests.to_json(m))
        _printable([m.fingerprint, m.finalize, m.last_warm(), m.last_warm("k", since=0.0)])


# --- logs ---------------------------------------------------------------------------------------

_FI = "2026-11-30 02:00:0{}, 474 - INFO - autotuner.py:2789 - flashinfer.jit: [Autotuner]: "
_TEMPLATES = [
    "Saved {n} configs to {p} ({n} new, {n} from previous config)",
    "Loaded {n} configs from {p}",
    "Cache file {p} was created in a different environment ({t}: saved={t} vs current={t}). "
    "Ignoring cached configs. {t}",
    "Skipped {n} legacy cuDNN config",
    "Autotuning process starts",
    "Autotuning process ends",
    "Invalid gemm{g} profile id: {n}",
]


@st.composite
def log_line(draw: Callable[..., Any]) -> str:
    if draw(st.booleans()):
        return draw(st.text(_chars, max_size=60))
    line = draw(st.sampled_from(_TEMPLATES)).format(
        n=draw(st.one_of(st.integers(-5, 10**6).map(str), st.just("9" * 5000), _text)),
        p=draw(_text),
        t=draw(_text),
        g=draw(st.sampled_from(["1", "2", "3"])),
    )
    prefix = draw(st.sampled_from(["", _FI.format(draw(st.integers(0, 9))), "INFO 13-45 "]))
    return prefix + line + draw(st.sampled_from(["", "\r", "\r[AutoTuner]: x"]))


@FUZZ
@given(
    lines=st.lists(log_line(), max_size=12),
    seed=st.sampled_from(LOGS),
    noise=st.binary(max_size=64),
)
def test_any_log_is_parsed_or_refused(
    tmp_path: Path, lines: list[str], seed: Path, noise: bytes
) -> None:
    raw = "\n".join(lines).encode("utf-8", "surrogatepass")  # a lone surrogate: bytes not UTF-8
    facts = parse_log(raw.decode("utf-8", "replace").split("\n"))  # as the reader decodes them
    text = seed.read_bytes()[:2000] + noise + raw
    log = tmp_path / "vllm.log"
    log.write_bytes(text)
    try:
        from_file = read_log(log)
    except FiCacheError as exc:
        _printable(exc)
        from_file = facts
    for findings in (doctor.run(Inputs(TARGETS[0], logs=(f,))) for f in (facts, from_file)):
        for finding in findings:
            _printable(finding.message)
            json.dumps(finding.to_json())
