"""`fi-cache coverage` through the CLI on the real H200 tunes (tests/fixtures): the CI gate, the
JSON document, a log's fallbacks, and bad input refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import FIXTURES, ROOT

CACHE = FIXTURES / "h200-tuned" / "fi-0.6.18" / "flashinfer" / "autotune_configs.json"
MOE = FIXTURES / "h200-moe-run" / "0.6.18"
GEMM_PLAN = ROOT / "examples" / "plans" / "h200-gemm.toml"
MOE_PLAN = ROOT / "examples" / "plans" / "qwen3-30b-a3b-moe.toml"


def _one_line(r) -> bool:  # type: ignore[no-untyped-def]
    return len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_min_coverage_is_a_gate_and_json_lists_every_pair(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok = run("coverage", CACHE, "--plan", GEMM_PLAN, "--min-coverage", "100")
    assert ok.code == 0 and "coverage 100.0%: 24 of 24" in ok.out
    longer = tmp_path / "longer.toml"
    longer.write_text(GEMM_PLAN.read_text().replace("1024]", "2048]"))
    low = run("coverage", CACHE, "--plan", longer, "--min-coverage", "90%")
    assert low.code == 1 and "coverage 75.0%" in low.out
    assert "bucket 1280, 1536, 1792, 2048: bucket never warmed" in low.out
    assert "under --min-coverage 90%" in low.err
    assert run("coverage", CACHE, "--plan", longer).code == 0  # no gate: a report
    gate = ("--min-coverage", "75")
    doc = run("--format", "json", "coverage", CACHE, "--plan", longer, *gate).json()
    assert (doc["tuned"], doc["pairs"], doc["coverage"], doc["ok"]) == (24, 32, 75.0, True)
    missing = [e for e in doc["entries"] if not e["tuned"]]
    assert {(e["op"], e["bucket"]) for e in missing} == {
        (op, b) for op in ("bf16_gemm", "fp8_gemm") for b in (1280, 1536, 1792, 2048)
    }
    assert all(e["found"] for e in doc["entries"] if e["tuned"])


def test_the_finalize_mode_is_the_caches_own_unless_asked(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    fused = MOE / "fused-namespace.json"
    own = run("--format", "json", "coverage", fused, "--plan", MOE_PLAN).json()
    assert own["modes"] == ["fused"] and own["coverage"] == 100.0
    other = run("coverage", fused, "--plan", MOE_PLAN, "--finalize", "unfused")
    assert other.code == 0 and "finalize-mode miss: tuned fused only" in other.out
    assert "(unfused): 0 of 12 tuned" in other.out


def test_a_log_that_fell_back_exits_1_naming_why(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = MOE / "call-unfused-under-fused.log"
    r = run("coverage", MOE / "fused-namespace.json", "--log", log)
    assert r.code == 1 and "2 (op, bucket) pair(s)" in r.out and "finalize-mode miss" in r.out
    doc = run("--format", "json", "coverage", MOE / "fused-namespace.json", "--log", log).json()
    assert doc["fell_back"] == 2 and all(e["fell_back"] for e in doc["entries"])
    quiet = tmp_path / "quiet.log"
    quiet.write_text(
        "2026-12-01 20:55:27,268 - INFO - autotuner.py:2789 - flashinfer.jit: "
        "[Autotuner]: Loaded 24 configs from x.json\n"
    )
    clean = run("coverage", MOE / "fused-namespace.json", "--log", quiet)
    assert clean.code == 0 and "no call fell back" in clean.out


def test_bad_input_is_one_line_and_a_documented_code(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cases = [
        (("coverage", CACHE), 2, "give one target"),
        (("coverage", CACHE, "--plan", GEMM_PLAN, "--log", GEMM_PLAN), 2, "give one target"),
        (("coverage", CACHE, "--plan", GEMM_PLAN, "--min-coverage", "120"), 2, "percentage"),
        (("coverage", CACHE, "--plan", GEMM_PLAN, "--min-coverage", "most"), 2, "percentage"),
        (("coverage", CACHE, "--log", GEMM_PLAN, "--min-coverage", "50"), 2, "needs --plan"),
        (("coverage", tmp_path / "gone.json", "--plan", GEMM_PLAN), 2, "gone.json"),
        (("coverage", CACHE, "--plan", tmp_path / "gone.toml"), 2, "gone.toml"),
    ]
    bad_plan = tmp_path / "bad.toml"
    bad_plan.write_text('[[ops]]\nop = "mm_bf16"\nn = 0\nk = 1\n')
    cases.append((("coverage", CACHE, "--plan", bad_plan), 2, "bad.toml"))
    corrupt = tmp_path / "autotune_configs.json"
    shutil.copy(CACHE, corrupt)
    corrupt.write_text(corrupt.read_text()[:300])
    cases.append((("coverage", corrupt, "--plan", GEMM_PLAN), 1, "autotune_configs.json"))
    for args, code, words in cases:
        r = run(*args)
        assert r.code == code and _one_line(r) and words in r.err, (args, r.code, r.err)
