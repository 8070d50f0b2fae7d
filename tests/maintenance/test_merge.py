"""merge: the union of real FlashInfer files, conflicts, and a locked, atomic, kill-safe write."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fi_cache.caches.discover import TMP_PATTERN
from fi_cache.errors import CorruptCache, FiCacheError, Refused
from fi_cache.maintenance import merge as mergemod
from fi_cache.maintenance.merge import Conflict, merge, merge_into
from fi_cache.model import v1
from tests.conftest import (
    GEMM_617,
    GEMM_618,
    MOE_617_FUSED,
    MOE_617_UNFUSED,
    MOE_618_FUSED,
    MOE_618_UNFUSED,
    ROOT,
)

PROJECT = ROOT
ENTRY = (
    "from fi_cache.cli import cli, main; from fi_cache.cli.merge import COMMANDS; "
    "[cli.add_command(c) for c in COMMANDS]; main()"
)
OUR_TMP = re.compile(r"^\.fi-cache-.*\.tmp$")


def load(path: Path) -> v1.CacheFile:
    return v1.loads(path.read_bytes())


def split(cf: v1.CacheFile, parts: int) -> list[v1.CacheFile]:
    """Per-rank-style pieces of one file: same metadata, entries dealt round-robin."""
    keys = sorted(cf.entries)
    return [
        dataclasses.replace(cf, entries={k: cf.entries[k] for k in keys[i::parts]})
        for i in range(parts)
    ]


def write(path: Path, cf: v1.CacheFile) -> Path:
    path.write_text(v1.dumps(cf))
    return path


def with_entries(cf: v1.CacheFile, entries: dict[str, list[Any]], **changes: Any) -> v1.CacheFile:
    return dataclasses.replace(cf, entries=entries, **changes)


def cli_merge(store: Path, *args: str | Path) -> subprocess.Popen[bytes]:
    """The real console entry point in a child process, with `merge` registered."""
    argv = [sys.executable, "-c", ENTRY, "--store", str(store), "merge", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --- The pure core ------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [GEMM_617, GEMM_618, MOE_617_FUSED, MOE_618_UNFUSED])
def test_halves_of_a_real_file_merge_back_byte_for_byte(fixture: Path, tmp_path: Path) -> None:
    text = fixture.read_text()
    a, b = split(load(fixture), 2)
    out = tmp_path / "out" / "autotune_configs.json"
    out.parent.mkdir()  # merge -o grows no directory tree (issue 42 F14)
    report = merge_into([write(tmp_path / "rank0.json", a), write(tmp_path / "rank1.json", b)], out)
    assert out.read_text() == text  # _generation recomputed for 0.6.18, absent for 0.6.17
    assert ('"_generation"' in text) == report.generation
    assert report.result.conflicts == [] and report.new == report.result.entries
    added = {
        str(tmp_path / "rank0.json"): len(a.entries),
        str(tmp_path / "rank1.json"): len(b.entries),
    }
    assert report.result.added == added
    assert v1.dumps(merge([("a", a), ("b", b)], "first").file) == text  # the pure core alone


def test_per_rank_files_with_different_finalize_keys_union_cleanly() -> None:
    fused, unfused = load(MOE_618_FUSED), load(MOE_618_UNFUSED)
    result = merge([("fused", fused), ("unfused", unfused)], "first")
    assert result.entries == len(fused.entries) + len(unfused.entries) == 64
    assert result.conflicts == [] and result.sources == 2
    assert result.file.generation == v1.compute_generation(result.file)
    assert list(v1.defects(v1.loads(v1.dumps(result.file)))) == []


@pytest.mark.parametrize("prefer", ["first", "last"])
def test_conflicts_are_listed_with_both_values_and_resolved_by_policy(prefer: str) -> None:
    fused, unfused = load(MOE_617_FUSED), load(MOE_617_UNFUSED)
    differing = {k for k in fused.entries if fused.entries[k] != unfused.entries[k]}
    assert differing and all("gemm2" in k for k in differing)  # 0.6.17: one key, two modes
    result = merge([("fused.json", fused), ("unfused.json", unfused)], prefer)  # type: ignore[arg-type]
    assert {c.key for c in result.conflicts} == differing
    winner, loser = (fused, unfused) if prefer == "first" else (unfused, fused)
    names = ("fused.json", "unfused.json") if prefer == "first" else ("unfused.json", "fused.json")
    for c in result.conflicts:
        assert (c.kept, c.dropped) == (winner.entries[c.key], loser.entries[c.key])
        assert (c.kept_from, c.dropped_from) == names
    assert result.file.entries == winner.entries and result.file.generation is None


def test_each_distinct_losing_value_is_reported_once() -> None:
    base = load(GEMM_617)
    key = sorted(base.entries)[0]
    runner = base.entries[key][0]
    files = [
        (f"rank{i}", with_entries(base, {key: [runner, tactic]}))
        for i, tactic in enumerate([7, 8, 8, 8, 9])
    ]
    result = merge(files, "first")
    assert [(c.dropped[1], c.dropped_from) for c in result.conflicts] == [
        (8, "rank1"),
        (9, "rank4"),
    ]
    assert result.file.entries[key] == [runner, 7]
    last = merge(files, "last")
    assert last.file.entries[key] == [runner, 9]
    assert [(c.dropped[1], c.dropped_from) for c in last.conflicts] == [(7, "rank0"), (8, "rank1")]


def test_same_tactic_with_other_measurements_is_not_a_conflict() -> None:
    base = load(GEMM_618)
    key = sorted(base.entries)[0]
    plain = list(base.entries[key])
    measured = [*plain, {"source": "measured"}, {"time_ms": 0.012, "candidates": 4}]
    a = with_entries(base, {key: measured})
    b = with_entries(base, {key: plain})
    first = merge([("a", a), ("b", b)], "first")
    assert first.conflicts == [] and first.file.entries[key] == measured
    last = merge([("a", a), ("b", b)], "last")
    assert last.conflicts == [] and last.file.entries[key] == plain


def test_extra_value_elements_are_kept_as_is(tmp_path: Path) -> None:
    base = load(GEMM_618)
    a, b = split(base, 2)
    key = sorted(a.entries)[0]
    extra = [*a.entries[key], {"source": "measured"}, {"time_ms": 0.01, "runner_up_ms": 0.02}]
    a = with_entries(a, {**a.entries, key: extra})
    out = tmp_path / "out.json"
    merge_into([write(tmp_path / "a.json", a), write(tmp_path / "b.json", b)], out)
    written = json.loads(out.read_text())
    assert written[key] == extra
    assert list(v1.defects(v1.loads(out.read_bytes()))) == []


def test_records_are_unioned_by_namespace_and_clashes_reported() -> None:
    base = load(GEMM_618)
    a = dataclasses.replace(base, records={"ns1": {"a": 1}, "shared": {"v": 1}})
    b = dataclasses.replace(base, records={"ns2": {"b": 2}, "shared": {"v": 2}})
    result = merge([("a", a), ("b", b)], "first")
    assert result.file.records == {"ns1": {"a": 1}, "shared": {"v": 1}, "ns2": {"b": 2}}
    assert result.conflicts == [Conflict("_records.shared", {"v": 1}, {"v": 2}, "a", "b")]
    assert merge([("a", a), ("b", b)], "last").file.records["shared"] == {"v": 2}
    text = v1.dumps(result.file)
    assert list(json.loads(text))[:2] == ["_metadata", "_records"]
    assert list(v1.defects(v1.loads(text))) == []
    # A file without records next to one with them: the records survive.
    assert merge([("base", base), ("a", a)], "first").file.records == a.records


def test_unknown_top_level_fields_are_kept_and_clashes_reported() -> None:
    base = load(GEMM_618)
    a = dataclasses.replace(base, unknown={"_future": {"x": 1}, "_only_a": 1})
    b = dataclasses.replace(base, unknown={"_future": {"x": 2}})
    result = merge([("a", a), ("b", b)], "last")
    assert result.file.unknown == {"_future": {"x": 2}, "_only_a": 1}
    assert result.conflicts == [Conflict("_future", {"x": 2}, {"x": 1}, "b", "a")]


def test_metadata_mismatch_names_the_field_and_both_files() -> None:
    a = load(GEMM_618)
    b = dataclasses.replace(a, metadata={**(a.metadata or {}), "gpu": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(FiCacheError) as info:
        merge([("h200.json", a), ("h100.json", b)], "first")
    assert info.value.exit_code == 2  # refused input: neither file is wrong
    message = str(info.value)
    assert "h200.json" in message and "h100.json" in message
    assert "gpu is 'NVIDIA H200' vs 'NVIDIA H100 80GB HBM3'" in message
    extra = dataclasses.replace(a, metadata={**(a.metadata or {}), "cutlass_dsl_version": "4.3"})
    with pytest.raises(FiCacheError, match=re.escape("cutlass_dsl_version is missing vs '4.3'")):
        merge([("a", a), ("b", extra)], "first")


def test_a_file_without_metadata_merges_only_with_others_without() -> None:
    with_meta = load(GEMM_617)
    bare_a, bare_b = (dataclasses.replace(p, metadata=None) for p in split(with_meta, 2))
    assert merge([("a", bare_a), ("b", bare_b)], "first").file.metadata is None
    with pytest.raises(FiCacheError, match="b has no _metadata"):
        merge([("a", with_meta), ("b", bare_b)], "first")


def test_generation_follows_the_format_of_the_writing_flashinfer() -> None:
    new, old = load(GEMM_618), load(GEMM_617)
    # 0.6.18 metadata: written even when no source carries one, and always recomputed.
    bare = dataclasses.replace(new, generation=None)
    assert merge([("a", bare)], "first").file.generation == v1.compute_generation(bare)
    # 0.6.17 metadata: never written, it would load as a bogus entry there.
    stamped = dataclasses.replace(old, generation="0" * 64)
    assert merge([("a", stamped)], "first").file.generation is None
    # Version unknown: keep the format the sources have.
    unknown_meta = {**(new.metadata or {}), "flashinfer_version": "unknown"}
    has = dataclasses.replace(new, metadata=unknown_meta)
    hasnt = dataclasses.replace(has, generation=None)
    assert merge([("a", hasnt), ("b", has)], "first").file.generation is not None
    assert merge([("a", hasnt)], "first").file.generation is None


# --- Files on disk ------------------------------------------------------------------------------


def test_metadata_mismatch_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out.json"
    with pytest.raises(FiCacheError, match=re.escape("flashinfer_version is '0.6.17' vs '0.6.18'")):
        merge_into([GEMM_617, GEMM_618], out)
    assert not out.parent.exists()  # not even the lock file's directory
    existing = tmp_path / "existing.json"
    existing.write_bytes(GEMM_617.read_bytes())
    before = existing.stat()
    with pytest.raises(FiCacheError) as info:
        merge_into([GEMM_618], existing)
    assert info.value.exit_code == 2  # refused input: neither file is wrong
    assert existing.read_bytes() == GEMM_617.read_bytes()
    assert existing.stat().st_mtime_ns == before.st_mtime_ns


def test_existing_out_is_merged_first(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_bytes(MOE_617_FUSED.read_bytes())
    # same keys; GEMM2 tactics differ (fused and unfused: allowed here, refused by default)
    report = merge_into([MOE_617_UNFUSED], out, allow_mixed_finalize=True)
    assert report.existed and report.new == 0 and report.result.conflicts
    assert all(c.kept_from == str(out) for c in report.result.conflicts)
    assert out.read_bytes() == MOE_617_FUSED.read_bytes()  # OUT's tactics win with --prefer first
    merge_into([MOE_617_UNFUSED], out, "last", allow_mixed_finalize=True)
    assert out.read_bytes() == MOE_617_UNFUSED.read_bytes()


def test_new_out_is_0644_and_an_existing_mode_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    merge_into([GEMM_618], out)
    assert out.stat().st_mode & 0o777 == 0o644
    out.chmod(0o600)
    merge_into([GEMM_618], out)
    assert out.stat().st_mode & 0o777 == 0o600


def test_corrupt_existing_out_is_refused_and_left_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    torn = GEMM_618.read_bytes()[:1000]
    out.write_bytes(torn)
    with pytest.raises(CorruptCache, match="refusing to overwrite") as info:
        merge_into([GEMM_618], out)
    assert info.value.exit_code == 1 and info.value.path == str(out)
    assert out.read_bytes() == torn


@pytest.mark.parametrize(
    "content, error, why",
    [
        (None, Refused, "no such file"),
        (b'{"_metadata": {}, "(\'op\'', CorruptCache, "truncated"),
        (b'{"(\'op\', \'R\', ((1,),), ())": {"runner": "R"}}', CorruptCache, "not \\[runner"),
        (b'{"name": "fi-cache", "version": "1"}', Refused, "not a FlashInfer v1 cache"),
    ],
)
def test_bad_sources_are_refused_by_name(
    tmp_path: Path, content: bytes | None, error: type[FiCacheError], why: str
) -> None:
    src = tmp_path / "src.json"
    if content is not None:
        src.write_bytes(content)
    out = tmp_path / "out.json"
    with pytest.raises(error, match=why) as info:
        merge_into([GEMM_618, src], out)
    assert info.value.path == str(src)
    assert not out.exists()


def test_v2_stores_are_refused(tmp_path: Path) -> None:
    env_dir = tmp_path / "v2" / "0123456789abcdef"
    (env_dir / "entries").mkdir(parents=True)
    (env_dir / "manifest.json").write_text("{}")
    entry = env_dir / "entries" / ("a" * 24 + ".json")
    entry.write_text('{"key": "k", "runner": "R", "tactic": 1}')
    for path in (tmp_path, tmp_path / "v2", env_dir, env_dir / "manifest.json", entry):
        with pytest.raises(Refused, match="merge takes v1 files") as info:
            merge_into([path], tmp_path / "out.json")
        assert info.value.exit_code == 2
    assert not (tmp_path / "out.json").exists()


def test_merging_again_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    merge_into([MOE_618_FUSED, MOE_618_UNFUSED], out)
    first = out.read_bytes()
    report = merge_into([MOE_618_UNFUSED, MOE_618_FUSED, out], out)
    assert out.read_bytes() == first and report.new == 0 and report.result.conflicts == []


# --- Reliability: concurrent merges, SIGKILL ----------------------------------------------------


def test_16_concurrent_merges_into_one_out_lose_nothing(tmp_path: Path) -> None:
    pieces = split(load(GEMM_618), 16)
    sources = [
        write(tmp_path / f"autotune_configs_dp0_rank{i}.json", p) for i, p in enumerate(pieces)
    ]
    out = tmp_path / "merged" / "autotune_configs.json"
    out.parent.mkdir()
    procs = [cli_merge(tmp_path / "store", src, "-o", out) for src in sources]
    results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else b"") for p in procs]
    assert [code for code, _ in results] == [0] * 16, results
    merged = load(out)
    assert merged.entries == load(GEMM_618).entries
    assert list(v1.defects(merged)) == []
    assert out.read_text() == GEMM_618.read_text()  # the union is exactly the real file


TRIALS = 50


def _kill_trial(root: Path, old: bytes, src: Path, delay: float) -> tuple[Path, float]:
    """Merge `src` into an OUT holding `old`; SIGKILL the merge `delay` seconds after its start."""
    root.mkdir()
    out = root / "autotune_configs.json"
    out.write_bytes(old)
    start = time.monotonic()
    proc = cli_merge(root / "store", src, "-o", out)
    try:
        proc.wait(timeout=delay)  # finished before its moment came: a "new" outcome
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return out, time.monotonic() - start


def test_sigkill_at_random_moments_leaves_old_or_new_never_torn(tmp_path: Path) -> None:
    half_a, half_b = split(load(MOE_618_FUSED), 2)
    old = v1.dumps(half_a).encode()
    new = MOE_618_FUSED.read_bytes()  # what a finished merge of the two halves writes
    src = write(tmp_path / "rank1.json", half_b)
    workers = max(2, min(4, os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:

        def trial(name: str, delay: float) -> tuple[Path, float]:
            return _kill_trial(tmp_path / name, old, src, delay)

        # Uninterrupted runs, as many at once as the trials will run: a merge's length here.
        calibration = list(pool.map(trial, [f"c{i}" for i in range(workers)], [60.0] * workers))
        assert all(out.read_bytes() == new for out, _ in calibration)
        span = sorted(took for _, took in calibration)[workers // 2]
        rng = random.Random(1234)
        # Half the kills anywhere in the run, half near its end, where the write happens.
        delays = [rng.uniform(0, span) for _ in range(TRIALS // 2)]
        delays += [rng.uniform(0.7 * span, 1.3 * span) for _ in range(TRIALS - TRIALS // 2)]
        trials = list(pool.map(trial, [f"t{i}" for i in range(TRIALS)], delays))
    for out, took in trials:
        data = out.read_bytes()
        assert data in (old, new), f"torn file after a kill at {took:.3f}s"
        assert list(v1.defects(v1.loads(data))) == []
        for leftover in {p.name for p in out.parent.iterdir()} - {out.name, f".{out.name}.lock"}:
            assert OUR_TMP.match(leftover) and TMP_PATTERN.match(leftover), leftover
        # The kernel dropped the dead writer's lock: the next merge goes through.
        merge_into([src], out, timeout=5)
        assert out.read_bytes() == new


def test_module_exports_the_documented_api() -> None:
    assert mergemod.PREFER_CHOICES == ("first", "last")
    assert {f.name for f in dataclasses.fields(mergemod.MergeResult)} == {
        "file",
        "conflicts",
        "sources",
        "entries",
        "added",
    }
    assert [f.name for f in dataclasses.fields(Conflict)] == [
        "key",
        "kept",
        "dropped",
        "kept_from",
        "dropped_from",
    ]
