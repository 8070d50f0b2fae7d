"""`fi-cache diff A B`: one summary line, groups by op, JSON, and exit codes a CI job gates on."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURES

FUSED = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"
UNFUSED = FIXTURES / "h200-vllm" / "vllm-0.26-unfused-autotune_configs.json"


def test_two_tunes_differ_exit_1_with_a_summary_and_the_gemm2_rows(run) -> None:  # type: ignore[no-untyped-def]
    r = run("diff", FUSED, UNFUSED)
    assert r.code == 1
    first = r.out.splitlines()[0]
    assert first == (
        "differ: 0 only in A; 0 only in B; 25 with another runner or tactic; 17 the same"
    )
    assert "trtllm::fused_moe::gemm2 · MoERunner  (21 differ)" in r.out
    assert "75 (finalize|swap_base)" in r.out and "53 (base)" in r.out


def test_json_and_op_filter_and_same_files(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = run("--format", "json", "diff", FUSED, UNFUSED, "--op", "gemm1")
    doc = r.json()
    assert r.code == 1 and doc["changed"] == 25 and len(doc["entries"]) == 4
    assert {e["op"] for e in doc["entries"]} == {"trtllm::fused_moe::gemm1"}
    same = run("diff", FUSED, FUSED)
    assert same.code == 0 and same.out.startswith("same: 42 entries, equal _metadata")


def test_bad_input_is_one_line_and_exit_2(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in ([FUSED, tmp_path / "missing.json"], [FUSED, bad], [FUSED, tmp_path]):
        r = run("diff", *args)
        assert r.code in (1, 2) and "Traceback" not in r.err
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert run("diff", FUSED, tmp_path / "missing.json").code == 2


KEY = "('bf16_gemm', 'CublasltBf16GemmRunner', (({m}, 4096), (4096, 2048)), ())"
META = {"flashinfer_version": "0.6.18", "gpu": "NVIDIA H200"}


def _cache(path: Path, tactics: dict[int, int], meta: object = None, op: str = "") -> Path:
    from fi_cache.model import v1

    key = KEY.replace("bf16_gemm", op) if op else KEY
    entries = {key.format(m=m): ["CublasltBf16GemmRunner", t] for m, t in tactics.items()}
    path.write_text(v1.dumps(v1.CacheFile(dict(meta or META), entries)))  # type: ignore[call-overload]
    return path


def test_metadata_that_is_no_string_is_compared_not_a_traceback(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # verify passes these; diff died in parse_version (list) and sm_of_gpu (object).
    a = _cache(tmp_path / "a.json", {1: 1}, {"flashinfer_version": ["0.6.18"], "gpu": "H200"})
    b = _cache(tmp_path / "b.json", {1: 1}, {"flashinfer_version": "0.6.18", "gpu": {"x": 1}})
    assert run("diff", a, a).code == 0 and run("diff", b, b).code == 0
    r = run("diff", a, b)
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert "_metadata flashinfer_version: A ['0.6.18'], B '0.6.18'" in r.out
    assert "_metadata gpu: A 'H200', B {'x': 1}" in r.out


def test_buckets_differ_in_numeric_order(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a = _cache(tmp_path / "a.json", {m: 1 for m in (1024, 2, 128, 1, 16)})
    b = _cache(tmp_path / "b.json", {m: 2 for m in (1024, 2, 128, 1, 16)})
    doc = run("--format", "json", "diff", a, b).json()
    assert [e["bucket"].split()[0] for e in doc["entries"]] == [
        "1x4096",
        "2x4096",
        "16x4096",
        "128x4096",
        "1024x4096",
    ]


def test_control_characters_of_keys_are_escaped(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    op = "bf16_gemm\x1b]0;PWNED\x07"
    a = _cache(tmp_path / "a.json", {1: 1}, op=op)
    b = _cache(tmp_path / "b.json", {1: 2}, op=op)
    r = run("diff", a, b)
    assert r.code == 1 and "\x1b" not in r.out and "\x07" not in r.out
    assert "bf16_gemm\\x1b]0;PWNED\\x07 · CublasltBf16GemmRunner  (1 differ)" in r.out


def test_entries_both_files_hold_alike_are_not_decoded(tmp_path: Path) -> None:
    # Two 200,000-entry files that mostly agree took 23 s: every key of both was parsed.
    from fi_cache.model import v1
    from fi_cache.model.diff import diff
    from tests.growth import lines_run

    def pair(n: int) -> tuple[v1.CacheFile, v1.CacheFile]:
        same = {KEY.format(m=m): ["R", 1] for m in range(n)}
        return v1.CacheFile(META, same), v1.CacheFile(META, {**same, KEY.format(m=-1): ["R", 2]})

    small, big = pair(50), pair(400)
    assert diff(*big).same == 400 and diff(*big).count("only-b") == 1
    assert lines_run(lambda: diff(*big)) < lines_run(lambda: diff(*small)) + 8 * 350
