"""`fi-cache show` as a user runs it: MoE extras by name, entries grouped by op, 80 columns."""

from __future__ import annotations

import json

import pytest

from tests.conftest import GEMM_618, MOE_617_FUSED, MOE_618_FUSED, SURROGATE_SPOTS, with_surrogate


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


def test_show_fits_80_columns_for_moe_and_gemm(run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("fi_cache.cli.render.terminal_width", lambda: 80)
    for path in (MOE_618_FUSED, MOE_617_FUSED, GEMM_618):
        lines = run("show", path).out.splitlines()
        assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    out = run("show", "--op", "gemm2", MOE_618_FUSED).out
    assert "trtllm::fused_moe::gemm2 · MoERunner  (16 entries)" in out
    assert "1x2048 128x1536x2048 0 128x2048x768 0" in out and "fused top_k=8 ep=1 tp=1" in out


@pytest.mark.parametrize("spot", SURROGATE_SPOTS)
def test_a_lone_surrogate_is_a_corrupt_file_not_a_traceback(run, tmp_path, spot) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text(with_surrogate(GEMM_618, spot))
    for args in (["show", bad], ["--format", "json", "show", bad]):
        r = run(*args)
        assert r.code == 1, r.err  # corrupt, as verify says: exit 1
        assert str(bad) in r.err and "lone UTF-16 surrogate" in r.err


def test_deep_nesting_is_a_corrupt_file_named_with_exit_1(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "deep.json"
    key = "('bf16_gemm', 'R', ((1, 2),), ())"
    deep = "[" * 600 + "]" * 600
    bad.write_text(json.dumps({"_metadata": {}, key: ["R", 1]}).replace("1]", deep + "]"))
    r = run("show", bad)
    assert r.code == 1 and r.err.count("\n") == 1, r.err
    assert str(bad) in r.err and "nested deeper than" in r.err
    assert run("verify", bad).code == 1


def test_an_op_filter_that_matches_nothing_lists_the_ops(run) -> None:  # type: ignore[no-untyped-def]
    r = run("show", GEMM_618, "--op", "moe")
    assert r.code == 2
    assert r.err.strip() == (
        f"fi-cache: {GEMM_618}: no op matches --op 'moe'; its ops: bf16_gemm, fp8_gemm"
    )
    assert run("show", GEMM_618, "--op", "fp8").code == 0


def test_show_reads_an_sglang_deployment_dir_as_one_cache_with_ranks(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from tests.sglang_layout import sglang_paths

    files = [sglang_paths("0.5.18", tmp_path, tp=2, tp_rank=r)[0] for r in (0, 1)]
    for f in files:
        shutil.copy(MOE_618_FUSED, f)
    doc = run("--format", "json", "show", files[0].parent).json()
    assert doc["layout"] == "sglang" and doc["path"] == str(files[0].parent)
    assert [r["rank"] for r in doc["ranks"]] == [[0, 0, 0], [1, 0, 0]]
    assert all(len(r["entries"]) == 32 for r in doc["ranks"])
    human = run("show", files[0].parent)
    assert human.code == 0 and "rank tp1 pp0 dp0" in human.out and "2 rank files" in human.out


def _gemm_cache(path, tokens, op="bf16_gemm", tactic=1):  # type: ignore[no-untyped-def]
    from fi_cache.model import v1

    meta = json.loads(GEMM_618.read_text())["_metadata"]
    entries = {
        f"('{op}', 'CublasltBf16GemmRunner', (({m}, 4096), (4096, 2048)), ())": [
            "CublasltBf16GemmRunner",
            tactic,
        ]
        for m in tokens
    }
    path.write_text(v1.dumps(v1.CacheFile(meta, entries)))
    return path


def test_show_lists_buckets_in_numeric_order_not_as_strings(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A string sort printed 1x4096, 1024x4096, 128x4096, 16x4096, 2x4096 ...
    cache = _gemm_cache(tmp_path / "c.json", [1024, 2, 128, 1, 16])
    out = run("show", cache).out
    rows = [line.split()[0] for line in out.splitlines() if "x4096 4096x2048 " in line]
    assert rows == ["1x4096", "2x4096", "16x4096", "128x4096", "1024x4096"], out


def test_show_escapes_terminal_control_characters_from_keys(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    op = "bf16_gemm\x1b]0;PWNED\x07\x1b[2J"
    cache = _gemm_cache(tmp_path / "c.json", [1, 2], op=op)
    r = run("show", cache)
    assert r.code == 0 and "\x1b" not in r.out and "\x07" not in r.out
    assert "bf16_gemm\\x1b]0;PWNED\\x07\\x1b[2J · CublasltBf16GemmRunner  (2 entries)" in r.out
    assert run("--format", "json", "show", cache).json()["entries"][0]["op"] == op
