"""env, ls, show, verify as a user runs them: JSON contract, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GEMM_617, GEMM_618, HASH_A, MOE_617_FUSED, MOE_618_FUSED, cli_main_exit

_ROOT = Path(__file__).resolve().parents[2]

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


def test_ls_human_table_fits_80_columns(run, vllm_root: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(vllm_root)
    monkeypatch.setattr("fi_cache.cli.render.terminal_width", lambda: 80)  # an 80-column tty
    r = run("ls", ".")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0].split() == ["FLASHINFER", "ARCH", "GPU", "ENTRIES", "FINALIZE", "PATH"]
    assert all(len(line) <= 80 for line in lines), lines
    assert any("unknown" in line and "aaaaaaaa…/autotune_configs.json" in line for line in lines)
    long_lines = run("ls", "-l", ".").out.splitlines()
    assert "SIZE" in long_lines[0] and any("trtllm::fused_moe::gemm2" in x for x in long_lines)


def test_ls_lists_the_store_too(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = store / "namespaces" / "0.6.17" / "90a" / "nvidia-h200" / "unfused-0123456789ab"
    target = ns / "vllm" / HASH_A / "autotune_configs.json"
    target.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, target)
    [c] = run("--format", "json", "ls").json()["caches"]
    assert c["namespace"] == str(ns)
    assert c["finalize"] == "unfused"  # 0.6.17 keys cannot say; the namespace does


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


def test_show_decodes_moe_extras_by_name(run) -> None:  # type: ignore[no-untyped-def]
    doc = run("--format", "json", "show", MOE_618_FUSED).json()
    assert doc["format"] == "v1" and doc["metadata"]["gpu"] == "NVIDIA H200"
    gemm2 = [e for e in doc["entries"] if e["op"] == "trtllm::fused_moe::gemm2"]
    assert len(gemm2) == 16
    e = gemm2[0]
    assert e["runner"] == "MoERunner" and e["finalize"] == "fused"
    assert e["extras"]["use_fused_finalize"] is True and e["extras"]["x_dtype"] == "torch.bfloat16"
    assert isinstance(e["tactic"], int) and isinstance(e["profile"], list)


def test_show_human_groups_by_op(run) -> None:  # type: ignore[no-untyped-def]
    r = run("show", GEMM_618)
    assert r.code == 0
    assert "bf16_gemm · CublasltBf16GemmRunner  (13 entries)" in r.out
    assert "bf16_gemm · CudnnBf16GemmRunner  (13 entries)" in r.out
    assert "fp8_gemm · CublasFp8GemmRunner  (12 entries)" in r.out
    assert "NVIDIA H200" in r.out


def test_verify_clean_files(run) -> None:  # type: ignore[no-untyped-def]
    r = run("--format", "json", "verify", GEMM_617, GEMM_618, MOE_618_FUSED)
    assert r.code == 0
    states = {Path(x["path"]).name: x["generation"] for x in r.json()["results"]}
    assert states == {GEMM_617.name: "absent", GEMM_618.name: "ok", MOE_618_FUSED.name: "ok"}


def test_verify_finds_hand_edits(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(GEMM_618.read_text())
    key = next(k for k in data if k.startswith("("))
    data[key] = ["CublasltBf16GemmRunner", 7]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data, indent=2))
    r = run("--format", "json", "verify", edited)
    assert r.code == 1
    [res] = r.json()["results"]
    assert res["generation"] == "mismatch" and res["problems"][0]["check"] == "generation-mismatch"


@pytest.mark.parametrize(
    "content, code, words",
    [
        (b'{"_metadata": {"gpu": "NVIDIA H200"}, "(\'bf16', 1, "truncated"),
        (b"", 1, "empty file"),
        (b"\x00\x01binary\xff", 1, "not UTF-8"),
        (b"{\"('op', 'R', ((1,),), ())\": {\"runner\": 1}}", 1, "not [runner, tactic]"),
        (b"{\"('op', 'R', ((1,),), ()\": [\"R\", 1]}", 1, "does not parse"),
        (b"[" * 200000 + b"]" * 200000, 1, "nested too deeply"),
    ],
)
def test_verify_bad_files_one_line_each(
    run,
    tmp_path: Path,
    content: bytes,
    code: int,  # type: ignore[no-untyped-def]
    words: str,
) -> None:
    path = tmp_path / "autotune_configs.json"
    path.write_bytes(content)
    r = run("verify", path)
    assert r.code == code
    problem_lines = [line for line in r.err.splitlines() if str(path) in line]
    assert len(problem_lines) == 1 and words in problem_lines[0]


def test_missing_path_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = cli_main_exit(["--store", str(tmp_path), "verify", str(tmp_path / "nope.json")])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err.strip() == f"fi-cache: {tmp_path / 'nope.json'}: no such file or directory"
    )


def test_usage_error_exit_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main_exit(["ls", "--no-such-flag"]) == 2
    assert cli_main_exit(["verify"]) == 2


def test_huge_file_refused_exit_2(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_MAX_FILE_MB", "1")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(3 * 1024 * 1024)
    r = run("verify", big)
    assert r.code == 2 and "larger than any autotune cache" in r.err


def test_unreadable_file_refused_exit_2(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "autotune_configs.json"
    shutil.copy(GEMM_618, path)
    real = Path.read_bytes

    def deny(self: Path) -> bytes:
        if self == path:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", deny)  # root ignores chmod, so simulate it
    r = run("--format", "json", "verify", path)
    assert r.code == 2
    assert r.json()["results"][0]["problems"][0]["check"] == "unreadable-permissions"


def test_env_json_names_a_namespace_per_finalize_mode(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    doc = run("--format", "json", "env", "--no-exact").json()
    assert set(doc["metadata"]) >= {
        "flashinfer_version",
        "cuda_version",
        "cublas_version",
        "cudnn_version",
        "cudnn_frontend_version",
        "gpu",
    }
    fused, unfused = doc["namespaces"]["fused"], doc["namespaces"]["unfused"]
    assert fused != unfused and fused.startswith(str(store)) and "/fused-" in fused
    assert "supports_fused_finalize_env" in doc["vllm"]


def _subprocess(
    *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, check=False
    )


def test_python_m_entry_point_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    p = _subprocess("-m", "fi_cache", "--store", str(tmp_path / "s"), "verify", str(bad))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert (
        p.stderr.strip().endswith(
            "truncated: Expecting property name enclosed in double quotes at line 1 column 2"
        )
        or "truncated" in p.stderr
    )


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["ls", "--help"],
        ["verify", str(GEMM_618)],
        ["show", str(GEMM_618)],
        ["ls", str(GEMM_618)],
        ["plan", "--check", str(_ROOT / "examples" / "plans" / "h200-gemm.toml")],
        [
            "plan",
            "--from-hf-config",
            str(_ROOT / "tests" / "fixtures" / "hf" / "qwen3-30b-a3b.json"),
        ],
        ["warm", "--engine", "flashinfer", "--plan", str(_ROOT / "no-such-plan.toml")],
    ],
)
def test_read_only_commands_import_no_heavy_package(command: list[str], tmp_path: Path) -> None:
    code = (
        "import sys; from fi_cache.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'flashinfer', 'vllm') if m in sys.modules)\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))"
    )
    p = _subprocess("-c", code, "--store", str(tmp_path), *command)
    assert p.stderr.strip().endswith("HEAVY="), p.stderr[-300:]


def test_json_mode_failure_still_prints_one_json_document(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ["--store", str(tmp_path), "--format", "json", "show", str(tmp_path / "gone.json")]
    assert cli_main_exit(args) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["error"]["exit_code"] == 2 and doc["error"]["path"] == str(tmp_path / "gone.json")
    assert captured.err.count("\n") == 1


def test_one_gigabyte_file_is_refused_before_reading(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    huge = tmp_path / "autotune_configs.json"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB on paper, nothing on disk
    r = run("verify", huge)
    assert r.code == 2 and "1024 MB is far larger than any autotune cache" in r.err


def test_show_fits_80_columns_for_moe_and_gemm(run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("fi_cache.cli.render.terminal_width", lambda: 80)
    for path in (MOE_618_FUSED, MOE_617_FUSED, GEMM_618):
        lines = run("show", path).out.splitlines()
        assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    out = run("show", "--op", "gemm2", MOE_618_FUSED).out
    assert "trtllm::fused_moe::gemm2 · MoERunner  (16 entries)" in out
    assert "1x2048 128x1536x2048 0 128x2048x768 0" in out and "fused top_k=8 ep=1 tp=1" in out


@pytest.mark.parametrize(
    "content, words",
    [
        (b"{\"('a', 'b', ((1,),), ())\": [\"R\", " + b"9" * 5000 + b"]}", "invalid JSON"),
        (b"{\"('a', 'b', ((1,),), ('\\\\UFFFFFFFF',))\": [\"R\", 1]}", "last Unicode code point"),
    ],
)
def test_numbers_and_escapes_past_python_limits_are_corrupt_not_a_crash(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "autotune_configs.json"
    path.write_bytes(content)
    r = run("verify", path)
    assert r.code == 1 and words in r.err


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


def test_usage_errors_in_json_mode_still_print_one_json_document(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main_exit(["--store", str(tmp_path), "--format", "json", "ls", "--bogus"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == 2


def test_a_relative_store_works(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = run("--store", "rel-store", "--format", "json", "env", "--no-exact")
    assert r.json()["store"] == str(tmp_path / "rel-store")
