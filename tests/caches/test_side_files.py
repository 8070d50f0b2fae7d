"""Files that are not their engine's own tune, told apart in ls, show and diff: FlashInfer's dump
named `autotune_config.json` (no vLLM reads it; here the real H200 file FlashInfer 0.6.18 wrote)
and vLLM 0.32+'s sparse-MLA decode file, `<hash>/autotune_configs.json` beside the per-rank files
(here written by FlashInfer 0.6.18's real AutoTuner under the sparse-MLA op's own name)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, GEMM_618, HASH_A, HASH_B, ROOT, flashinfer_dir

VLLM_026 = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"


@pytest.fixture(scope="module")
def sparse_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sparse") / "autotune_configs.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(flashinfer_dir("0.6.18")), str(ROOT)])}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.real_flashinfer.named_writer",
            str(path),
            "sparse_mla_sm120_decode_dsv3_2",
            "_SparseMlaDecodeDsv3Runner",
        ],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=180,
    )
    return path


def _hash_dir(root: Path, name: str, sparse: Path | None) -> Path:
    """A vLLM 0.32 hash dir on an SM120 GPU: rank 0's file, and the sparse-MLA file beside it."""
    d = root / "flashinfer_autotune_cache" / "0.6.18" / "120a" / name
    d.mkdir(parents=True)
    shutil.copy(GEMM_618, d / "autotune_configs_dp0_rank0.json")
    if sparse is not None:
        shutil.copy(sparse, d / "autotune_configs.json")
    return d


def _roles(doc: dict) -> dict[str, str | None]:  # type: ignore[type-arg]
    return {Path(c["path"]).name: c["role"] for c in doc["caches"]}


def test_a_flashinfer_dump_is_found_by_name_and_read_by_no_vllm(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shutil.copy(GEMM_618, tmp_path / "autotune_config.json")
    shutil.copy(GEMM_618, tmp_path / "my.json")
    doc = run("--format", "json", "ls", "--no-store", tmp_path).json()
    assert _roles(doc) == {"autotune_config.json": "flashinfer-dump", "my.json": None}
    human = run("ls", "--no-store", tmp_path).out
    assert "autotune_config.json: FlashInfer's own dump" in human and "no vLLM release" in human
    shown = run("show", tmp_path / "autotune_config.json")
    assert shown.code == 0 and "no vLLM release reads it" in shown.out
    assert run("--format", "json", "show", tmp_path / "autotune_config.json").json()["role"] == (
        "flashinfer-dump"
    )
    (tmp_path / "autotune_config.json").write_text("")  # a killed dump: named, so reported
    empty = run("ls", "--no-store", tmp_path)
    assert empty.code == 1 and "autotune_config.json" in empty.err and "empty file" in empty.err


def test_the_sparse_mla_file_beside_the_rank_files_is_told_apart(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, sparse_file: Path
) -> None:
    a = _hash_dir(tmp_path / "a", HASH_A, sparse_file)
    doc = run("--format", "json", "ls", "--no-store", a).json()
    assert _roles(doc) == {
        "autotune_configs.json": "sparse-mla",
        "autotune_configs_dp0_rank0.json": None,
    }
    human = run("ls", "--no-store", a).out
    assert "autotune_configs.json: vLLM 0.32+'s sparse-MLA decode file" in human
    shown = run("--format", "json", "show", a)  # the hash dir: rank 0's file, the other named
    assert shown.code == 0 and shown.json()["path"] == str(a / "autotune_configs_dp0_rank0.json")
    assert shown.json()["role"] is None and "left out" in shown.err and "sparse-MLA" in shown.err
    side = run("--format", "json", "show", a / "autotune_configs.json").json()
    assert side["role"] == "sparse-mla"
    assert {e["op"] for e in side["entries"]} == {"sparse_mla_sm120_decode_dsv3_2"}
    b = _hash_dir(tmp_path / "b", HASH_B, None)
    same = run("--format", "json", "diff", a, b)  # rank files compared, the side file left out
    assert same.code == 0 and same.json()["a_role"] is None and same.json()["differs"] is False
    against = run("diff", a / "autotune_configs.json", b)
    assert against.code == 1 and "A is vLLM 0.32+'s sparse-MLA decode file" in against.out


def test_vllms_plain_file_alone_is_the_tune_unless_it_holds_sparse_mla_ops(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, sparse_file: Path
) -> None:
    old = tmp_path / "old" / "0.6.17" / "90a" / HASH_A
    old.mkdir(parents=True)
    shutil.copy(VLLM_026, old / "autotune_configs.json")  # vLLM 0.26's own one file
    new = tmp_path / "new" / HASH_B  # an override dir; the rank files went to a v2 store
    new.mkdir(parents=True)
    shutil.copy(sparse_file, new / "autotune_configs.json")
    doc = run("--format", "json", "ls", "--no-store", old, new).json()
    assert {c["path"]: c["role"] for c in doc["caches"]} == {
        str(old / "autotune_configs.json"): None,
        str(new / "autotune_configs.json"): "sparse-mla",
    }
    assert json.loads(run("--format", "json", "show", old).out)["role"] is None
