"""`fi-cache merge` as a user runs it: JSON contract, conflict lines, exit codes, errors."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from fi_cache.cli import cli
from fi_cache.cli.merge import COMMANDS
from fi_cache.model import v1
from tests.conftest import (
    GEMM_617,
    GEMM_618,
    MOE_617_FUSED,
    MOE_617_UNFUSED,
    MOE_618_FUSED,
    VLLM_026_FUSED,
    VLLM_026_REL,
    no_hang,
    vllm_026_namespace,
)

for _command in COMMANDS:
    cli.add_command(_command)  # the lead registers it in fi_cache.cli; idempotent here

MERGE_FIELDS = {
    "dry_run",
    "output",
    "sources",
    "entries",
    "new",
    "conflicts",
    "generation",
    "gemm2_finalize_conflicts",
}
CONFLICT_FIELDS = {"key", "kept", "dropped", "kept_from", "dropped_from"}


def test_json_follows_the_contract(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    both = (MOE_617_FUSED, MOE_617_UNFUSED, "-o", out, "--allow-mixed-finalize")
    r = run("--format", "json", "merge", *both)
    assert r.code == 0, r.err  # conflicts are reported and resolved, not a failure
    doc = r.json()
    assert set(doc) == MERGE_FIELDS and doc["dry_run"] is False
    assert doc["output"] == str(out) and doc["sources"] == 2
    assert doc["entries"] == doc["new"] == 32 and doc["generation"] is False
    assert doc["conflicts"] and all(set(c) == CONFLICT_FIELDS for c in doc["conflicts"])
    fused, unfused = json.loads(MOE_617_FUSED.read_text()), json.loads(MOE_617_UNFUSED.read_text())
    for c in doc["conflicts"]:
        assert c["kept"] == fused[c["key"]] and c["dropped"] == unfused[c["key"]]
        assert (c["kept_from"], c["dropped_from"]) == (str(MOE_617_FUSED), str(MOE_617_UNFUSED))
    assert out.read_bytes() == MOE_617_FUSED.read_bytes()


def test_prefer_last_keeps_the_later_file(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    r = run(
        "--format",
        "json",
        "merge",
        MOE_617_FUSED,
        MOE_617_UNFUSED,
        "-o",
        out,
        "--prefer",
        "last",
        "--allow-mixed-finalize",
    )
    assert r.code == 0
    assert all(c["kept_from"] == str(MOE_617_UNFUSED) for c in r.json()["conflicts"])
    assert out.read_bytes() == MOE_617_UNFUSED.read_bytes()


def test_human_output_lists_the_first_conflicts_then_a_summary(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The first 5 conflicts, then how many more and where they all are (issue 43: two 200,000
    -entry files printed 88,754 lines), then the summary with the full count."""
    out = tmp_path / "out.json"
    r = run("merge", MOE_617_FUSED, MOE_617_UNFUSED, "-o", out, "--allow-mixed-finalize")
    assert r.code == 0
    *conflicts, more, summary = r.out.splitlines()
    assert len(conflicts) == 5 and all(
        line.startswith("conflict ('trtllm::fused_moe::gemm2'") for line in conflicts
    )
    assert more == "  … 11 more (--format json lists them all)"
    first = conflicts[0]
    assert f"from {MOE_617_FUSED}" in first and f"from {MOE_617_UNFUSED}" in first
    assert 'kept ["MoERunner",' in first and 'dropped ["MoERunner",' in first
    assert summary.startswith("merged 2 files into ")
    assert summary.endswith("32 entries (32 new), 16 conflicts kept from first")


def test_merged_file_verifies_clean_with_generation(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cf = v1.loads(GEMM_618.read_bytes())
    keys = sorted(cf.entries)
    for i in range(2):
        part = v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys[i::2]}, None, "x")
        (tmp_path / f"autotune_configs_dp0_rank{i}.json").write_text(v1.dumps(part))
    out = tmp_path / "merged.json"
    ranks = sorted(tmp_path.glob("autotune_configs_dp0_rank*.json"))
    r = run("--format", "json", "merge", *ranks, "-o", out)
    assert r.code == 0 and r.json()["generation"] is True and r.json()["conflicts"] == []
    assert out.read_text() == GEMM_618.read_text()
    assert run("verify", out).code == 0
    again = run("merge", GEMM_618, "-o", out)  # into an existing OUT: nothing new
    assert again.code == 0 and "38 entries (0 new), 0 conflicts kept from first" in again.out


def test_metadata_mismatch_exits_2_and_writes_nothing(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    r = run("merge", GEMM_617, GEMM_618, "-o", out)
    assert r.code == 2 and not out.exists()
    assert len(r.err.strip().splitlines()) == 1 and "flashinfer_version" in r.err
    assert str(GEMM_617) in r.err and str(GEMM_618) in r.err
    j = run("--format", "json", "merge", GEMM_617, GEMM_618, "-o", out)
    assert j.code == 2 and j.json()["error"]["exit_code"] == 2


def test_corrupt_out_is_refused_and_untouched(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    torn = MOE_618_FUSED.read_bytes()[:777]
    out.write_bytes(torn)
    r = run("merge", MOE_618_FUSED, "-o", out)
    assert r.code == 1 and "refusing to overwrite" in r.err and str(out) in r.err
    assert out.read_bytes() == torn


def test_bad_input_is_refused_with_one_line(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    missing = run("merge", tmp_path / "nope.json", "-o", out)
    assert missing.code == 2 and "no such file" in missing.err
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"_metadata": {"gpu": "NVIDIA H200"}, "(')
    bad = run("merge", corrupt, "-o", out)
    assert bad.code == 1 and str(corrupt) in bad.err and "Traceback" not in bad.err
    env_dir = tmp_path / "v2" / "0123456789abcdef"
    env_dir.mkdir(parents=True)
    (env_dir / "manifest.json").write_text("{}")
    v2 = run("merge", env_dir, "-o", out)
    assert v2.code == 2 and "merge takes v1 files" in v2.err
    assert run("merge", GEMM_618).code == 2  # -o is required
    assert run("merge", "-o", out).code == 2  # so is a source
    assert run("merge", GEMM_618, "-o", out, "--prefer", "newest").code == 2
    assert not out.exists()


def test_the_cli_offers_the_policies_merge_knows() -> None:
    from fi_cache.cli import merge as merging
    from fi_cache.maintenance import merge

    assert merging.PREFER_CHOICES == merge.PREFER_CHOICES


def test_a_fifo_source_or_output_is_refused_at_once_writing_nothing(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    out = tmp_path / "out.json"
    for args in (["merge", fifo, "-o", out], ["merge", GEMM_618, "-o", fifo]):
        with no_hang():
            r = run(*args)
        assert r.code == 2 and f"{fifo}: is a FIFO" in r.err and r.err.count("\n") == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]  # no OUT, no lock file
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_full_disk_is_a_storage_failure_naming_out(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    run("merge", GEMM_617, "-o", out)
    before = out.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    r = run("merge", GEMM_617, "-o", out)
    assert r.code == 1 and r.err.count("\n") == 1, r.err  # exit 1: storage, not bad input
    assert f"{out}: cannot write: No space left on device" in r.err
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_fused_and_unfused_gemm2_conflicts_are_named_for_what_they_are(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """<= 0.6.17 keys do not record the finalize mode: a fused and an unfused file collide on
    every GEMM2 key and agree on GEMM1, and merge says so instead of listing bare conflicts."""
    both = (MOE_617_FUSED, MOE_617_UNFUSED, "--allow-mixed-finalize")
    r = run("merge", *both, "-o", tmp_path / "out.json")
    assert "16 conflicts kept from first" in r.out
    [why] = r.err.splitlines()
    assert "16 conflicts are MoE GEMM2 entries" in why
    assert "different MoE finalize modes (fused and unfused)" in why
    assert "Invalid gemm2 profile id" in why and "fi-cache serve --deterministic" in why
    doc = run("--format", "json", "merge", *both, "-o", tmp_path / "j")
    assert doc.json()["gemm2_finalize_conflicts"] == len(doc.json()["conflicts"]) == 16
    plain = run("merge", GEMM_617, GEMM_617, "-o", tmp_path / "gemm.json")
    assert plain.err == ""


RUN_617 = Path(__file__).parent.parent / "fixtures" / "h200-moe-run" / "0.6.17"
FUSED_NS, UNFUSED_NS = RUN_617 / "fused-namespace.json", RUN_617 / "unfused-namespace.json"


def test_a_fused_and_an_unfused_0617_file_are_not_mixed_unless_asked(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 42: the two namespace files a real H200 warm wrote (FlashInfer 0.6.17): merged, the
    file doctor calls stale-gemm2-profile, the crash the tool exists to prevent."""
    out = tmp_path / "out.json"
    r = run("merge", FUSED_NS, UNFUSED_NS, "-o", out)
    assert r.code == 1 and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert str(FUSED_NS) in r.err and str(UNFUSED_NS) in r.err
    assert "12 MoE GEMM2 entries" in r.err and "finalize modes" in r.err
    assert "--allow-mixed-finalize" in r.err and "nothing written" in r.err
    assert not out.exists()
    out.write_bytes(FUSED_NS.read_bytes())  # into an existing OUT alike: it is a source too
    r = run("merge", UNFUSED_NS, "-o", out)
    assert r.code == 1 and out.read_bytes() == FUSED_NS.read_bytes()
    asked = run("merge", UNFUSED_NS, "-o", out, "--allow-mixed-finalize")
    assert asked.code == 0 and "finalize modes" in asked.err  # merged, and still warned
    assert "24 entries (0 new), 15 conflicts kept from first" in asked.out


def test_dry_run_says_what_would_be_written_and_writes_nothing(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    out.write_bytes(GEMM_617.read_bytes())
    real = tmp_path / "real.json"
    real.write_bytes(GEMM_617.read_bytes())
    dry = run("merge", MOE_617_FUSED, "-o", out, "--dry-run")
    done = run("merge", MOE_617_FUSED, "-o", real)
    assert dry.code == done.code == 0, dry.err
    assert dry.out == done.out.replace("merged 1 file into", "would merge 1 file into").replace(
        str(real), str(out)
    )
    assert out.read_bytes() == GEMM_617.read_bytes() and real.read_bytes() != out.read_bytes()
    assert not (tmp_path / ".out.json.lock").exists()  # no lock taken either
    j = run("--format", "json", "merge", MOE_617_FUSED, "-o", out, "--dry-run").json()
    assert j["dry_run"] is True and j["entries"] == 38 + 32 and j["new"] == 32
    mixed = run("merge", MOE_617_FUSED, MOE_617_UNFUSED, "-o", out, "--dry-run")
    assert mixed.code == 1 and "--allow-mixed-finalize" in mixed.err  # what the real run does


def test_out_in_a_missing_directory_is_refused_as_export_does(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 42 F14: merge -o made the missing tree; export -o and plan -o refuse it."""
    out = tmp_path / "nonexist" / "dir" / "o.json"
    r = run("merge", GEMM_618, "-o", out)
    assert r.code == 2 and f"{out.parent}: no such directory" in r.err and r.err.count("\n") == 1
    assert not (tmp_path / "nonexist").exists()


def test_dry_run_into_a_pinned_namespace_says_it_would_be_refused(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    ns = vllm_026_namespace(store)
    assert run("pin", ns).code == 0
    r = run("merge", VLLM_026_FUSED, "-o", ns / VLLM_026_REL, "--dry-run")
    assert r.code == 2 and "pinned" in r.err and r.err.count("\n") == 1, r.err


def test_files_of_two_environments_are_refused_input_not_a_problem_found(
    run, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Neither file is wrong: the user asked to join two environments' caches (docs/cli.md: 2 is
    refused input, 1 a problem found in the caches, as a corrupt source is)."""
    out = tmp_path / "out.json"
    for dry in ([], ["--dry-run"]):
        r = run("merge", GEMM_617, GEMM_618, "-o", out, *dry)
        assert r.code == 2 and len(r.err.splitlines()) == 1 and "one environment" in r.err
        assert not out.exists() and not list(tmp_path.iterdir())


def test_a_conflicts_key_reaches_the_terminal_escaped(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A key holding a terminal escape (set title, clear screen) is printed as text in the
    conflict line, as show/diff/evict print it (issue 42 F11; shared attack rerun)."""
    meta = v1.loads(GEMM_618.read_bytes()).metadata
    op = "bf16_gemm\x1b]0;PWNED\x07\x1b[2J"
    key = f"('{op}', 'CublasltBf16GemmRunner', ((1, 4096), (4096, 2048)), ())"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(v1.dumps(v1.CacheFile(meta, {key: ["CublasltBf16GemmRunner", 1]})))
    b.write_text(v1.dumps(v1.CacheFile(meta, {key: ["CublasltBf16GemmRunner", 2]})))
    r = run("merge", a, b, "-o", tmp_path / "out.json")
    assert r.code == 0
    assert "\x1b" not in r.out and "\x07" not in r.out
    assert "bf16_gemm\\x1b]0;PWNED\\x07\\x1b[2J" in r.out


def test_a_0617_file_whose_records_its_loader_crashes_on_is_not_merged(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """FlashInfer 0.6.17 reads `_records` as an entry: one it crashes on makes verify fail, so
    merge refuses it (exit 1, nothing written) instead of copying it on (shared attack's
    fuzz_new.py mutant 93: merge and align wrote a file verify rejects)."""
    doc = json.loads(GEMM_617.read_text())
    doc["_records"] = {"a": [1, {"b": None}]}
    src, out = tmp_path / "a.json", tmp_path / "out.json"
    src.write_text(json.dumps(doc))
    assert run("verify", src).code == 1
    r = run("merge", src, "-o", out)
    assert r.code == 1 and not out.exists()
    assert "_records" in r.err and "not merged (see `fi-cache verify`)" in r.err
