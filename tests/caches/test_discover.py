"""Finding caches in every layout vLLM and FlashInfer use, and reading them into data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache.caches.discover import (
    STAGING_PREFIX,
    TRASH_DIR,
    classify_file,
    discover,
    tmp_leftovers,
)
from fi_cache.caches.inventory import read, scan
from fi_cache.errors import Refused
from fi_cache.model import v2
from fi_cache.store import install, trash
from tests.conftest import GEMM_618, HASH_A, HASH_B, MOE_618_FUSED


def test_vllm_layout_gives_version_arch_and_rank(vllm_root: Path) -> None:
    found, problems = discover(vllm_root.parent)
    assert problems == []
    by_name = {(f.path.parent.parent.parent.name, f.path.name): f for f in found}
    single = by_name[("0.6.17", "autotune_configs.json")]
    assert (single.layout, single.arch, single.dir_version, single.rank) == (
        "vllm",
        "90a",
        "0.6.17",
        None,
    )
    rank1 = by_name[("0.6.18", "autotune_configs_dp0_rank1.json")]
    assert rank1.rank == (0, 1) and rank1.arch == "90a"
    assert len(found) == 3


def test_override_dir_has_no_version_or_arch_level(tmp_path: Path) -> None:
    path = tmp_path / "override" / HASH_A / "autotune_configs.json"
    path.parent.mkdir(parents=True)
    shutil.copy(GEMM_618, path)
    [f] = discover(tmp_path / "override")[0]
    assert (f.layout, f.arch, f.dir_version) == ("vllm-override", None, None)


def test_plain_files_are_sniffed_and_other_json_is_ignored(tmp_path: Path) -> None:
    shutil.copy(GEMM_618, tmp_path / "my-cache.json")
    (tmp_path / "package.json").write_text('{"name": "not a cache"}')
    (tmp_path / "manifest.json").write_text('{"_metadata": {}}')
    [f] = discover(tmp_path)[0]
    assert f.path.name == "my-cache.json" and f.layout == "file"


def _make_v2(root: Path) -> Path:
    meta = json.loads(GEMM_618.read_text())["_metadata"]
    manifest = {**meta, "cache_schema": "v2"}
    env_dir = root / "v2" / v2.env_hash(manifest)
    (env_dir / "entries").mkdir(parents=True)
    (env_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    data = json.loads(GEMM_618.read_text())
    for key in [k for k in data if k.startswith("(")][:5]:
        entry = {"key": key, "runner": data[key][0], "tactic": data[key][1]}
        (env_dir / "entries" / v2.entry_file_name(key)).write_text(json.dumps(entry))
    return env_dir


def test_v2_store_is_one_cache_with_its_entries(tmp_path: Path) -> None:
    env_dir = _make_v2(tmp_path / "autotune")
    [f] = discover(tmp_path)[0]
    assert f.format == "v2" and f.path == env_dir
    cache = read(f)
    assert len(cache.file.entries) == 5 and cache.read_defects == ()
    assert cache.metadata is not None and cache.metadata["gpu"] == "NVIDIA H200"


def test_v2_bad_entry_is_a_defect_not_an_abort(tmp_path: Path) -> None:
    env_dir = _make_v2(tmp_path)
    victim = next((env_dir / "entries").iterdir())
    victim.write_text('{"key": "(')
    moved = env_dir / "entries" / ("0" * 24 + ".json")
    shutil.copy(next(p for p in (env_dir / "entries").iterdir() if p != victim), moved)
    cache = read(discover(tmp_path)[0][0])
    assert len(cache.file.entries) == 4
    messages = " | ".join(d.message for d in cache.read_defects)
    assert victim.name in messages and "does not hash to its file name" in messages


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="no such file"):
        discover(tmp_path / "nope")


def test_scan_reports_a_corrupt_file_and_reads_the_rest(vllm_root: Path) -> None:
    bad = vllm_root / "0.6.17" / "90a" / HASH_B
    bad.mkdir()
    (bad / "autotune_configs.json").write_text('{"_metadata": {')
    inv = scan([vllm_root])
    assert len(inv.caches) == 3
    [p] = inv.problems
    assert p.check == "corrupt-file" and "truncated" in p.message and p.exit_code == 1


def test_oversized_file_is_refused_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FI_CACHE_MAX_FILE_MB", "1")
    big = tmp_path / "autotune_configs.json"
    with open(big, "wb") as f:
        f.truncate(2 * 1024 * 1024)
    [p] = scan([big]).problems
    assert (
        p.exit_code == 2 and "2.0 MB is over the 1 MB limit that FI_CACHE_MAX_FILE_MB" in p.message
    )


def test_tmp_leftovers_of_killed_writers(tmp_path: Path) -> None:
    names = [
        ".autotuner_x1.tmp",
        ".autotune_y2.tmp",
        ".autotune_configs.json.ab12cd34.tmp",
        ".fi-cache-z.tmp",
        "keep.tmp",
    ]
    for n in names:
        (tmp_path / n).write_text("")
    assert [p.name for p in tmp_leftovers(tmp_path)] == sorted(names[:4])


def test_classify_rank_file_outside_vllm_layout() -> None:
    f = classify_file(Path("/x/autotune_configs_dp1_rank3.json"))
    assert f.layout == "file" and f.rank == (1, 3)


def test_scan_deduplicates_overlapping_paths(vllm_root: Path) -> None:
    inv = scan([vllm_root, vllm_root / "0.6.17"])
    assert len(inv.caches) == 3


def test_real_moe_file_summary_fields(tmp_path: Path) -> None:
    shutil.copy(MOE_618_FUSED, tmp_path / "c.json")
    [cache] = scan([tmp_path / "c.json"]).caches
    assert cache.flashinfer_version == "0.6.18" and cache.finalize() == "fused"
    assert cache.file.ops() == ["trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"]


def test_fi_caches_work_dirs_are_not_caches_and_staging_dirs_are_leftovers(tmp_path: Path) -> None:
    """A killed import's `<store>/.import-*` and a killed prune's `.trash/` hold namespaces that
    are not the store's: scans skip them; a staging dir is one leftover; so is a killed pull's
    download in the state dir."""
    store = tmp_path / "store"
    real = store / "namespaces" / "0.6.18" / "90a" / "h200" / "fused-0123456789ab" / "vllm" / HASH_A
    for top in (
        real,
        store / ".import-k1ll3d" / "namespaces" / "x" / HASH_A,
        store / ".trash" / "123-4-fused-x" / "vllm" / HASH_A,
    ):
        top.mkdir(parents=True)
        shutil.copy(MOE_618_FUSED, top / "autotune_configs.json")
        (top / ".autotuner_dead.tmp").write_text("")
    (store / ".fi-cache").mkdir()
    pull = store / ".fi-cache" / ".fi-cache-pull-42-abcdef.tar.gz.tmp"
    pull.write_text("")
    found, problems = discover(store)
    assert [f.path.parent for f in found] == [real] and problems == []
    assert (STAGING_PREFIX, TRASH_DIR) == (install.STAGING_PREFIX, trash.TRASH_DIR)  # one name
    assert tmp_leftovers(store) == sorted(
        [pull, store / ".import-k1ll3d", real / ".autotuner_dead.tmp"]
    )


# --- SGLang: files at the paths SGLang's own code computes (tests/sglang_layout.py) ------------


def test_sglang_rank_and_runs_files_give_version_arch_rank_and_key(tmp_path: Path) -> None:
    from tests.sglang_layout import sglang_paths

    rank_file, run_file = sglang_paths("0.5.18", tmp_path, tp=2, tp_rank=1)
    for path in (rank_file, run_file):
        shutil.copy(MOE_618_FUSED, path)
    found, problems = discover(tmp_path)
    assert problems == []
    by_run = {f.run is not None: f for f in found}
    rank, run = by_run[False], by_run[True]
    assert (rank.layout, rank.arch, rank.dir_version) == ("sglang", "sm90", "0.6.18")
    assert rank.rank == (1, 0, 0)
    assert rank.key_dir == rank_file.parent.name and rank.group == rank_file.parent
    assert run.layout == "sglang" and run.rank == (1, 0, 0) and run.group == rank_file.parent
    assert run.run is not None and run.run in run_file.name


def test_sglang_megamoe_gpu_uuid_and_0_5_22_run_names(tmp_path: Path) -> None:
    from tests.sglang_layout import sglang_paths

    rank_file, run_file = sglang_paths(
        "0.5.23", tmp_path, flashinfer="0.7.2", capability=(10, 3), backend="flashinfer_megamoe"
    )
    for path in (rank_file, run_file):
        shutil.copy(GEMM_618, path)
    found = {f.path: f for f in discover(tmp_path)[0]}
    assert found[rank_file].gpu_uuid == "1b2c3d4e-0000-1111-2222-333344445555"
    assert found[rank_file].arch == "sm103" and found[rank_file].dir_version == "0.7.2"
    assert found[run_file].run is not None and found[run_file].gpu_uuid == found[rank_file].gpu_uuid


def test_sglang_rank_file_is_found_even_when_it_is_not_flashinfer_json(tmp_path: Path) -> None:
    """A torn rank file is a corrupt cache to report, not something to skip."""
    from tests.sglang_layout import sglang_paths

    rank_file, _ = sglang_paths("0.5.23", tmp_path)
    rank_file.write_text('{"trunc')
    inv = scan([tmp_path])
    assert [p.path for p in inv.problems] == [rank_file] and inv.problems[0].check == "corrupt-file"
