"""`fi-cache ls` as a user runs it: the JSON contract, an 80-column table, bad files reported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner

from tests.conftest import (
    GEMM_618,
    HASH_A,
    MOE_617_FUSED,
    MOE_618_FUSED,
    cli_main_exit,
    with_surrogate,
    write_v2_store,
)
from tests.maintenance.test_prune import killed_import, make_namespace

LS_FIELDS = {
    "path",
    "format",
    "flashinfer_version",
    "gpu",
    "arch",
    "entries",
    "size",
    "ops",
    "finalize",
    "modified",
}


def test_ls_json_follows_the_contract(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    r = run("--format", "json", "ls", vllm_root)
    assert r.code == 0
    caches = {Path(c["path"]).name + c["flashinfer_version"]: c for c in r.json()["caches"]}
    assert len(caches) == 3
    for c in caches.values():
        assert set(c) >= LS_FIELDS
        assert c["format"] == "v1" and c["arch"] == "90a" and isinstance(c["entries"], int)
    old = caches["autotune_configs.json0.6.17"]
    assert old["finalize"] == "unknown" and old["entries"] == 32 and old["gpu"] == "NVIDIA H200"
    assert old["ops"] == ["trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"]
    assert caches["autotune_configs_dp0_rank0.json0.6.18"]["finalize"] == "unfused"
    assert caches["autotune_configs_dp0_rank1.json0.6.18"]["finalize"] is None


def test_ls_human_table_prints_whole_paths_that_paste(run, vllm_root: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The columns before PATH fit 80 characters; PATH is never cut, on a terminal or not: it is
    what the user pastes into `fi-cache show`."""
    monkeypatch.chdir(vllm_root)
    monkeypatch.setattr("fi_cache.cli.render.terminal_width", lambda: 80)  # an 80-column tty
    r = run("ls", ".")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0].split() == ["FLASHINFER", "ARCH", "GPU", "ENTRIES", "FINALIZE", "PATH"]
    assert all(len(line) <= 80 for line in lines if not line.startswith("0.6"))
    [row] = [line for line in lines if "unknown" in line]
    path = row.split()[-1]
    assert path == f"0.6.17/90a/{HASH_A}/autotune_configs.json" and "…" not in r.out
    assert run("show", path).code == 0
    long_lines = run("ls", "-l", ".").out.splitlines()
    assert "SIZE" in long_lines[0] and any("trtllm::fused_moe::gemm2" in x for x in long_lines)


def test_store_caches_are_listed_with_their_whole_path(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = store / "namespaces" / "0.6.17" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    target = ns / "vllm" / HASH_A / "autotune_configs.json"
    target.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, target)
    out = run("ls").out
    assert f"namespace {ns}" in out and str(target) in out


def test_ls_lists_the_store_too(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = store / "namespaces" / "0.6.17" / "90a" / "nvidia-h200" / "unfused-0123456789ab"
    target = ns / "vllm" / HASH_A / "autotune_configs.json"
    target.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, target)
    [c] = run("--format", "json", "ls").json()["caches"]
    assert c["namespace"] == str(ns)
    assert c["finalize"] == "unfused"  # 0.6.17 keys cannot say; the namespace does


def test_ls_finds_flashinfers_own_v2_root(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """vLLM 0.33 with one rank and no override dir leaves the cache in FlashInfer's default root,
    written here by the real FlashInfer 0.7.2.post1; `ls` needs no path to find it."""
    root = tmp_path / "fi-root"
    env_dir = write_v2_store(root)
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_CACHE_DIR", str(root))
    [c] = run("--format", "json", "ls").json()["caches"]
    assert c["path"] == str(env_dir) and c["entries"] == 38 and c["namespace"] is None
    assert c["flashinfer_version"] == "0.7.2.post1"
    r = run("ls")
    assert "other caches" not in r.out and env_dir.name in r.out


def test_ls_finds_vllms_default_cache_root(run, vllm_root: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """$VLLM_CACHE_ROOT/flashinfer_autotune_cache (default ~/.cache/vllm/...), which doctor
    reads too, is listed with no path given; --no-store leaves it out."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(vllm_root.parent))
    caches = run("--format", "json", "ls").json()["caches"]
    assert len(caches) == 3 and all(c["layout"] == "vllm" for c in caches)
    assert {str(Path(c["path"]).relative_to(vllm_root).parts[0]) for c in caches} == {
        "0.6.17",
        "0.6.18",
    }
    assert run("--format", "json", "ls", "--no-store").json()["caches"] == []


def test_ls_empty_store_says_so(run) -> None:  # type: ignore[no-untyped-def]
    r = run("ls")
    assert r.code == 0 and "no caches in the store" in r.err


def test_ls_dir_without_caches_is_refused(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    r = run("ls", tmp_path / "empty")
    assert r.code == 2 and "no FlashInfer autotune caches found" in r.err


def test_ls_reports_a_bad_file_and_lists_the_rest(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    bad = vllm_root / "0.6.17" / "90a" / HASH_A / "autotune_configs.json"
    bad.write_text("{ not json")
    r = run("--format", "json", "ls", vllm_root)
    assert r.code == 1
    assert len(r.json()["caches"]) == 2
    [p] = r.json()["problems"]
    assert p["check"] == "corrupt-file" and p["path"] == str(bad)
    assert r.err.count("\n") == 1 and str(bad) in r.err


def test_a_path_inside_the_store_is_listed_once(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    target = store / "namespaces" / "0.6.17" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    (target / "vllm" / HASH_A).mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, target / "vllm" / HASH_A / "autotune_configs.json")
    assert len(run("--format", "json", "ls", store).json()["caches"]) == 1


def test_a_fifo_named_json_does_not_hang_the_scan(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    os.mkfifo(tmp_path / "x.json")
    shutil.copy(GEMM_618, tmp_path / "c.json")
    r = run("--format", "json", "ls", tmp_path)
    assert r.code == 0 and [Path(c["path"]).name for c in r.json()["caches"]] == ["c.json"]


def test_ls_of_the_store_lists_neither_staging_nor_trash(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    """What a killed import or prune left holds whole caches: they are not the store's."""
    make_namespace(store)
    killed_import(store, age=3600, cache=MOE_618_FUSED.read_bytes())
    half = store / ".trash" / "123-45-fused-0123456789ab" / "vllm" / HASH_A
    half.mkdir(parents=True)
    shutil.copy(MOE_618_FUSED, half / "autotune_configs.json")
    for args in ([], [store]):
        r = run("--format", "json", "ls", *args)
        assert r.code == 0 and [c["namespace"] is not None for c in r.json()["caches"]] == [True]


def test_one_cache_with_a_lone_surrogate_does_not_break_ls_for_the_store(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    good = store / "namespaces" / "0.6.18" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    bad = store / "namespaces" / "0.6.18" / "90a" / "nvidia-h200" / "fused-ba9876543210"
    for ns in (good, bad):
        (ns / "vllm" / HASH_A).mkdir(parents=True)
    shutil.copy(GEMM_618, good / "vllm" / HASH_A / "autotune_configs.json")
    broken = bad / "vllm" / HASH_A / "autotune_configs.json"
    broken.write_text(with_surrogate(GEMM_618, "gpu"))
    r = run("ls")
    assert r.code == 1  # a corrupt file was found
    assert "autotune_configs.json" in r.out and "H200" in r.out  # the good one is listed
    assert str(broken) in r.err and "lone UTF-16 surrogate" in r.err
    doc = run("--format", "json", "ls").json()
    assert [c["namespace"] for c in doc["caches"]] == [str(good)]
    assert [(p["path"], p["check"]) for p in doc["problems"]] == [(str(broken), "corrupt-file")]


def test_a_file_name_that_is_not_utf8_is_printed_not_a_traceback(tmp_path: Path) -> None:
    shutil.copy(GEMM_618, tmp_path / os.fsdecode(b"x\xff.json"))  # '\udcff' once decoded
    runner = CliRunner()  # its streams are strict UTF-8, as under a en_US.UTF-8 locale
    with runner.isolation() as (out, err, _):
        code = cli_main_exit(["--store", str(tmp_path / "s"), "ls", "--no-store", str(tmp_path)])
    assert code == 0, err.getvalue()
    assert b"x\xff.json" in out.getvalue() and b"H200" in out.getvalue()  # the name's own bytes


def test_ls_json_gives_sglang_rank_key_dir_and_runs(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from tests.conftest import GEMM_618
    from tests.sglang_layout import sglang_paths

    rank_file, run_file = sglang_paths("0.5.23", tmp_path, tp=4, tp_rank=3)
    shutil.copy(GEMM_618, rank_file)
    shutil.copy(GEMM_618, run_file)
    doc = run("--format", "json", "ls", "--no-store", tmp_path).json()
    rows = {r["path"]: r for r in doc["caches"]}
    row, runs = rows[str(rank_file)], rows[str(run_file)]
    assert (row["layout"], row["arch"], row["run"]) == ("sglang", "sm90", None)
    assert row["rank"] == [3, 0, 0]
    assert row["key_dir"] == rank_file.parent.name and row["flashinfer_version"] == "0.6.18"
    assert runs["run"] is not None and runs["key_dir"] == row["key_dir"]
