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
