"""`fi-cache verify` as a user runs it: clean files, hand edits, bad files one line each, exit 2
for refused input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache.model import v2
from tests.conftest import (
    ENCODINGS,
    GEMM_617,
    GEMM_618,
    HASH_A,
    MOE_618_FUSED,
    cli_main_exit,
    hand_v2_store,
    undecodable,
)
from tests.maintenance.test_prune import killed_import, make_namespace


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


def test_verify_without_paths_checks_the_store(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    assert run("verify").code == 0 and "no caches in the store" in run("verify").err
    ns = store / "namespaces" / "0.6.18" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    good, bad = ns / "vllm" / ("a" * 64), ns / "vllm" / ("b" * 64)
    for d in (good, bad):
        d.mkdir(parents=True)
    shutil.copy(GEMM_618, good / "autotune_configs.json")
    (bad / "autotune_configs.json").write_text('{"_metadata": {}, "(')
    r = run("verify")
    assert r.code == 1 and "(38 entries, _generation ok)" in r.out
    assert f"{bad / 'autotune_configs.json'}: truncated" in r.err
    assert "1 ok, 1 with problems" in r.err
    doc = run("--format", "json", "verify").json()
    assert {(x["path"], x["ok"]) for x in doc["results"]} == {
        (str(good / "autotune_configs.json"), True),
        (str(bad / "autotune_configs.json"), False),
    }


def test_missing_path_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = cli_main_exit(["--store", str(tmp_path), "verify", str(tmp_path / "nope.json")])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err.strip() == f"fi-cache: {tmp_path / 'nope.json'}: no such file or directory"
    )


def test_huge_file_refused_exit_2(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_MAX_FILE_MB", "1")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(3 * 1024 * 1024)
    r = run("verify", big)
    assert r.code == 2 and "3.0 MB is over the 1 MB limit that FI_CACHE_MAX_FILE_MB sets" in r.err


def test_a_zero_limit_says_it_is_the_limit_not_the_file(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_MAX_FILE_MB", "0")
    r = run("verify", GEMM_618)
    size = GEMM_618.stat().st_size
    assert (
        r.code == 2
        and f"{size} bytes is over the 0 MB limit that FI_CACHE_MAX_FILE_MB sets" in r.err
    )
    assert "far larger" not in r.err


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


def test_one_gigabyte_file_is_refused_before_reading(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    huge = tmp_path / "autotune_configs.json"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB on paper, nothing on disk
    r = run("verify", huge)
    assert r.code == 2 and "1024 MB is far larger than any autotune cache" in r.err


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


def test_verify_of_the_store_skips_a_killed_imports_staging_dir(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    """The half-written cache in `.import-*` is not the store's: no "corrupt" for it."""
    ns = make_namespace(store)
    killed_import(store, age=3600)
    r = run("verify", store)
    assert r.code == 0 and ".import-" not in r.out + r.err, r.out + r.err
    assert str(ns) in r.out and "1 ok" in r.err + r.out


def test_human_output_prints_whole_paths(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    """A path the user pastes into `show` or `doctor` is never cut (vLLM's 64-hex hash dirs)."""
    out = run("verify", vllm_root).out
    assert f"ok    {vllm_root}/0.6.17/90a/{HASH_A}/autotune_configs.json (32 entries)" in out
    assert "…" not in out


def test_verify_checks_every_rank_file_of_an_sglang_dir(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from tests.conftest import GEMM_618
    from tests.sglang_layout import sglang_paths

    good, bad = (sglang_paths("0.5.23", tmp_path, tp=2, tp_rank=r)[0] for r in (0, 1))
    shutil.copy(GEMM_618, good)
    bad.write_text("")  # SGLang killed mid-save: nothing to sniff, still its rank file
    r = run("--format", "json", "verify", good.parent)
    assert r.code == 1
    assert {x["path"]: x["ok"] for x in r.json()["results"]} == {str(good): True, str(bad): False}


META_618 = json.loads(MOE_618_FUSED.read_text())["_metadata"]


@pytest.mark.parametrize("how", ENCODINGS)
@pytest.mark.parametrize("which", ["entry", "manifest"])
def test_v2_json_flashinfer_cannot_decode_is_corrupt(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, how: str, which: str
) -> None:
    env_dir = hand_v2_store(tmp_path / "root", META_618)
    entries = sorted((env_dir / "entries").iterdir())
    target = env_dir / "manifest.json" if which == "manifest" else entries[0]
    written = undecodable(target, how)
    if target.name == "manifest.json":  # its dir named by its hash, as FlashInfer names them
        env_dir = env_dir.rename(env_dir.with_name(v2.env_hash(written)))
        target = env_dir / target.name
    r = run("verify", env_dir)
    assert r.code == 1 and target.name in r.err and "Traceback" not in r.err, r.err


def test_quiet_keeps_the_results_on_stdout(run) -> None:  # type: ignore[no-untyped-def]
    """-q silences notes and warnings (docs/cli.md); what verify found is its result."""
    loud, quiet = run("verify", GEMM_618), run("-q", "verify", GEMM_618)
    assert quiet.code == loud.code == 0
    assert quiet.out == loud.out and "ok    " in quiet.out and "1 ok, 0 with problems" in quiet.out
    assert quiet.err == ""
