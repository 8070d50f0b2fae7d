"""`fi-cache doctor --log`: what vLLM / FlashInfer logs say about autotune caches."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fi_cache.doctor import logs
from fi_cache.doctor.logs import (
    CacheEvent,
    Fallback,
    LogFacts,
    ProfileIdError,
    parse_log,
    read_log,
)
from fi_cache.errors import EXIT_REFUSED, Refused
from tests.conftest import FIXTURES, no_hang
from tests.growth import growth

H200 = FIXTURES / "h200"

# Prefixes exactly as FlashInfer's and vLLM's formatters write them.
FI_INFO = "2026-11-30 02:00:00,000 - INFO - autotuner.py:2789 - flashinfer.jit: "
FI_WARN = "2026-11-30 02:00:00,000 - WARNING - autotuner.py:2748 - flashinfer.jit: "
HARD = (
    "Results will not be saved to this file to avoid overwriting configs from a different "
    "environment. Use a different cache path for the current environment, or delete the file to "
    "re-prime it."
)
SOFT = (
    "The file's recorded environment is indeterminate, so the next save will replace it with "
    "freshly tuned configs for the current environment."
)
CACHE = "/root/.cache/vllm/flashinfer/0.6.18/90a/" + "ab" * 32 + "/autotune_configs.json"
TQDM = "\r[AutoTuner]: Tuning bf16_gemm: 100%|██████████| 12/12 [00:00<00:00, 70.20profile/s]"


def ignored_line(path: str, mismatches: str, consequence: str) -> str:
    return (
        f"{FI_WARN}[Autotuner]: Cache file {path} was created in a different environment "
        f"({mismatches}). Ignoring cached configs. {consequence}"
    )


def tuning_lines(start: str, end: str) -> list[str]:
    return [
        f"{start}[Autotuner]: Autotuning process starts ...",
        "INFO 11-30 02:00:01 [gpu_model_runner.py:3012] Model loading took 15.2 GiB",
        f"{end}[Autotuner]: Autotuning process ends",
    ]


@pytest.mark.parametrize(
    ("log", "saved_as", "seconds"),
    [
        ("flashinfer-0.6.17-tune.log", "h200-617.json", 94.477),
        ("flashinfer-0.6.18-tune.log", "h200-618.json", 68.453),
    ],
)
def test_real_h200_logs_name_the_saved_file_and_tuning_time(
    log: str, saved_as: str, seconds: float
) -> None:
    facts = read_log(H200 / log)
    assert facts.events == (CacheEvent("saved", saved_as, 17, count=38),)
    assert facts.errors == ()
    assert facts.tuning_seconds == pytest.approx((seconds,))
    # The file has no final newline: its last line still counts, as in an editor.
    assert facts.lines == 67
    assert facts.path == str(H200 / log)


def test_loaded_and_saved_files_with_counts() -> None:
    facts = parse_log(
        [
            "INFO 11-30 02:00:00 [core.py:1] noise",
            f"{FI_INFO}[Autotuner]: Loaded 38 configs from /srv/my caches/autotune.json  ",
            f"{FI_INFO}[Autotuner]: Saved 40 configs to /srv/my caches/autotune.json "
            "(2 new, 38 from previous config)",
        ]
    )
    assert facts.events == (
        CacheEvent("loaded", "/srv/my caches/autotune.json", 2, count=38),
        CacheEvent("saved", "/srv/my caches/autotune.json", 3, count=40),
    )
    assert facts.lines == 3


def test_hard_ignore_parses_each_mismatch_including_a_gpu_name_with_spaces() -> None:
    mismatches = (
        "gpu: saved=NVIDIA H100 80GB HBM3 vs current=NVIDIA H200, "
        "cuda_version: saved=12.8 vs current=13.0"
    )
    facts = parse_log([ignored_line(CACHE, mismatches, HARD)])
    assert facts.events == (
        CacheEvent(
            "ignored",
            CACHE,
            1,
            hard=True,
            mismatches=(
                ("gpu", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
                ("cuda_version", "12.8", "13.0"),
            ),
        ),
    )


def test_soft_ignore_means_the_next_save_replaces_the_file() -> None:
    mismatches = (
        "cublas_version: saved=unknown vs current=13.1.0, gpu: saved=None vs current=NVIDIA H200"
    )
    (event,) = parse_log([ignored_line(CACHE, mismatches, SOFT)]).events
    assert event.kind == "ignored" and event.hard is False
    assert event.mismatches == (
        ("cublas_version", "unknown", "13.1.0"),
        ("gpu", "None", "NVIDIA H200"),
    )


def test_mismatch_values_may_hold_commas_and_colons() -> None:
    dsl = "cpython-312;nvidia-cutlass-dsl==4.2.0:9f2c, build: 7"
    mismatches = (
        f"flashinfer_version: saved=0.7.0 vs current=0.7.4, "
        f"cutlass_dsl_version: saved={dsl} vs current=unknown"
    )
    (event,) = parse_log([ignored_line(CACHE, mismatches, HARD)]).events
    assert event.mismatches == (
        ("flashinfer_version", "0.7.0", "0.7.4"),
        ("cutlass_dsl_version", dsl, "unknown"),
    )


@pytest.mark.parametrize(("saved", "hard"), [("NVIDIA H100 80GB HBM3", True), ("unknown", False)])
def test_cut_off_ignore_line_judges_severity_from_the_saved_value(saved: str, hard: bool) -> None:
    line = ignored_line(CACHE, f"gpu: saved={saved} vs current=NVIDIA H200", "")
    (event,) = parse_log([line]).events
    assert event.hard is hard


def test_skipped_legacy_cudnn_configs_are_counted() -> None:
    line = (
        f"{FI_WARN}[Autotuner]: Skipped 3 legacy cuDNN config(s) using integer plan-index "
        "tactics. They will be re-tuned when autotuning is enabled."
    )
    assert parse_log([line]).events == (CacheEvent("skipped-cudnn", None, 1, count=3),)


def test_gemm2_crash_names_the_cache_loaded_just_before() -> None:
    facts = parse_log(
        [
            f"{FI_INFO}[Autotuner]: Loaded 12 configs from /tmp/old.json",
            f"(EngineCore_DP0 pid=1234) {FI_INFO}[Autotuner]: Loaded 38 configs from {CACHE}",
            "(EngineCore_DP0 pid=1234) Traceback (most recent call last):",
            "(EngineCore_DP0 pid=1234) RuntimeError: Check failed: (id2 >= mGemm1TacticCount && "
            "id2 < mGemm1TacticCount + mGemm2TacticCount) is false: Invalid gemm2 profile id: 50",
            f"{FI_INFO}[Autotuner]: Loaded 1 configs from /tmp/later.json",
        ]
    )
    expected = ProfileIdError(gemm=2, tactic_id=50, line_no=4, last_loaded=CACHE, process="1234")
    assert facts.errors == (expected,)


def test_gemm1_crash_from_a_worker_without_any_loaded_cache() -> None:
    line = (
        "(VllmWorker rank=1 pid=99) ERROR 11-30 02:00:05 [multiproc_executor.py:596] "
        "RuntimeError: Check failed: (id1 >= 0 && id1 < mGemm1TacticCount) is false: "
        "Invalid gemm1 profile id: -7"
    )
    facts = parse_log(["noise", line])
    expected = ProfileIdError(gemm=1, tactic_id=-7, line_no=2, last_loaded=None, process="99")
    assert facts.errors == (expected,)


def _pid_crash_log(n: int) -> list[str]:
    return [
        f"(EngineCore_DP0 pid={i}) ERROR 12-01 20:55:27 [core.py:1] RuntimeError: "
        f"Invalid gemm2 profile id: {i}"
        for i in range(n)
    ]


def test_gemm_crashes_of_many_processes_are_read_in_linear_work() -> None:
    # One crash line per pid: each line looked back over every earlier crash (20,000: 5.8 s).
    facts = parse_log(_pid_crash_log(3))
    assert [(e.process, e.tactic_id) for e in facts.errors] == [("0", 0), ("1", 1), ("2", 2)]
    assert growth(lambda n: lambda: parse_log(_pid_crash_log(n)), 400) < 2.5


def test_a_crash_logged_by_one_process_is_not_merged_with_another_processs_copy() -> None:
    logged = "ERROR 11-30 02:00:05 [core.py:1] RuntimeError: Invalid gemm2 profile id: 50"
    facts = parse_log(
        [
            f"(EngineCore_DP0 pid=1) {logged}",
            f"(EngineCore_DP1 pid=2) {logged}",
            "(EngineCore_DP0 pid=1) RuntimeError: Invalid gemm2 profile id: 50",
            "(EngineCore_DP1 pid=3) RuntimeError: Invalid gemm2 profile id: 50",
        ]
    )
    assert [(e.process, e.line_no) for e in facts.errors] == [("1", 1), ("2", 2), ("3", 4)]


@pytest.mark.parametrize(
    ("start", "end", "seconds"),
    [
        (
            "2026-11-30 01:28:35,989 - INFO - autotuner.py:829 - flashinfer.jit: ",
            "2026-11-30 01:30:10,466 - INFO - autotuner.py:852 - flashinfer.jit: ",
            94.477,
        ),
        (
            "(EngineCore_DP0 pid=123) INFO 11-30 02:00:00 [autotuner.py:972] ",
            "(EngineCore_DP0 pid=123) INFO 11-30 02:01:05 [autotuner.py:995] ",
            65.0,
        ),
        # vLLM stamps have no year: tuning across New Year still takes 20 s.
        (
            "INFO 12-31 23:59:50 [autotuner.py:972] ",
            "INFO 01-01 00:00:10 [autotuner.py:995] ",
            20.0,
        ),
    ],
)
def test_tuning_time_from_flashinfer_and_vllm_timestamps(
    start: str, end: str, seconds: float
) -> None:
    facts = parse_log(tuning_lines(start, end))
    assert facts.tuning_seconds == pytest.approx((seconds,))


def test_tuning_without_timestamps_gives_no_duration() -> None:
    facts = parse_log(tuning_lines("", "INFO 11-30 02:01:05 [autotuner.py:995] "))
    assert facts.tuning_seconds == ()


def test_tuning_of_two_workers_is_timed_per_process() -> None:
    facts = parse_log(
        [
            "(VllmWorker rank=0 pid=10) INFO 11-30 02:00:00 [a.py:1] "
            "[Autotuner]: Autotuning process starts ...",
            "(VllmWorker rank=1 pid=11) INFO 11-30 02:00:05 [a.py:1] "
            "[Autotuner]: Autotuning process starts ...",
            "(VllmWorker rank=0 pid=10) INFO 11-30 02:00:30 [a.py:1] "
            "[Autotuner]: Autotuning process ends",
            "(VllmWorker rank=1 pid=11) INFO 11-30 02:00:50 [a.py:1] "
            "[Autotuner]: Autotuning process ends",
        ]
    )
    assert facts.tuning_seconds == (30.0, 45.0)


def test_tqdm_redraws_sharing_a_line_do_not_hide_or_pollute_messages(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        f"{FI_INFO}[Autotuner]: Autotuning process starts ...\n"
        f"{TQDM}{TQDM}\r{FI_INFO[:10]} 02:00:42,500{FI_INFO[23:]}"
        "[Autotuner]: Autotuning process ends\n"
        f"{FI_INFO}[Autotuner]: Loaded 38 configs from {CACHE}{TQDM}\n",
        encoding="utf-8",
    )
    facts = read_log(log)
    # Only "\n" ends a line, so the line number is the one an editor or `grep -n` shows.
    assert facts.events == (CacheEvent("loaded", CACHE, 3, count=38),)
    assert facts.tuning_seconds == pytest.approx((42.5,))
    assert facts.lines == 3


def test_windows_line_endings_do_not_end_up_in_paths(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(f"{FI_INFO}[Autotuner]: Loaded 38 configs from {CACHE}\r\n".encode())
    assert read_log(log).events == (CacheEvent("loaded", CACHE, 1, count=38),)


def test_undecodable_bytes_in_a_text_log_are_tolerated(tmp_path: Path) -> None:
    log = tmp_path / "latin1.log"
    log.write_bytes(
        "Modèle chargé\n".encode("latin-1")
        + f"{FI_INFO}[Autotuner]: Saved 5 configs to /tmp/x.json (5 new, 0 from previous config)"
        "\n".encode()
    )
    assert read_log(log).events == (CacheEvent("saved", "/tmp/x.json", 2, count=5),)


def test_big_log_with_a_huge_line_keeps_exact_line_numbers(tmp_path: Path) -> None:
    noise = "INFO 11-30 02:00:00 [gpu_model_runner.py:3012] " + "x" * 60
    lines = [noise] * 40_000  # ~4.4 MB: crosses the 64 KiB head and several 1 MiB chunks
    for at in (0, 600, 601, 9_000, 9_001, 19_000, 39_999):
        lines[at] = f"{FI_INFO}[Autotuner]: Loaded {at} configs from /c/{at}.json"
    lines[20_000] = "x" * 2_500_000 + " Invalid gemm2 profile id: 9"  # one line over 2 chunks
    log = tmp_path / "big.log"
    log.write_text("\n".join(lines), encoding="utf-8")
    facts = read_log(log)
    assert facts == parse_log(lines, str(log))
    assert [e.line_no for e in facts.events] == [1, 601, 602, 9_001, 9_002, 19_001, 40_000]
    assert facts.errors == (ProfileIdError(2, 9, 20_001, "/c/19000.json"),)
    assert facts.lines == 40_000


def test_a_megabyte_line_of_near_miss_messages_is_read_in_time_and_its_messages_found(
    tmp_path: Path,
) -> None:
    # Heads of the messages with free text in the middle, never their tails: once each regex
    # was retried at every head (issue 25: 11.6 s for 32 KB, hours for this line).
    near = (
        "[Autotuner]: Cache file /c/x.json was created in a different environment (gpu: saved="
        "[Autotuner]: Saved 1 configs to /c/x.json (1 new, "
        "No tuned config covers bf16_gemm input_shapes=[(1, 2)]; "
        "a.b.c.d. 45%|████▌     | 45/100 [00:01<00:02, 30.0it/s] "
    )
    ignored = ignored_line(CACHE, "gpu: saved=NVIDIA H200 vs current=NVIDIA H100", HARD)
    fallback = (
        "[AutoTuner]: No tuned config covers bf16_gemm input_shapes=[(1, 4096)]; "
        "falling back to runner=CublasltBf16GemmRunner tactic=-1"
    )
    saved = f"{FI_INFO}[Autotuner]: Saved 38 configs to {CACHE} (0 new, 38 from previous config)"
    line = near * (1_000_000 // len(near)) + f"{TQDM}\r{ignored}{TQDM}\r{fallback}"
    log = tmp_path / "vllm.log"
    log.write_text(f"INFO 11-30 02:00:00 [api_server.py:1] vLLM\n{line}\n{saved}\n")
    with no_hang(10.0):  # a hang guard, not a timing (it takes ~0.02 s)
        facts = read_log(log)
    assert facts.events == (
        CacheEvent(
            "ignored", CACHE, 2, hard=True, mismatches=(("gpu", "NVIDIA H200", "NVIDIA H100"),)
        ),
        CacheEvent("saved", CACHE, 3, count=38),
    )
    assert facts.fallbacks == (Fallback("bf16_gemm", -1, 2, "[(1, 4096)]"),)


@pytest.mark.parametrize("read_size", [1, 7, 64])
def test_line_numbers_stay_exact_however_the_file_is_cut_into_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    lines = [
        f"{FI_INFO}[Autotuner]: Autotuning process starts ...",
        f"noise{TQDM}",
        "",
        f"{FI_WARN}[Autotuner]: Skipped 2 legacy cuDNN config(s) using integer plan-index tactics.",
        f"{FI_INFO}[Autotuner]: Loaded 3 configs from /c/a.json\r",
        "RuntimeError: Invalid gemm2 profile id: 9",
        f"{FI_INFO}[Autotuner]: Autotuning process ends",
    ]
    log = tmp_path / "small.log"
    log.write_text("\n".join(lines), encoding="utf-8")
    monkeypatch.setattr(logs, "_HEAD_BYTES", read_size)
    monkeypatch.setattr(logs, "_CHUNK_BYTES", read_size)
    facts = read_log(log)
    assert facts == parse_log(lines, str(log))
    assert facts.events == (
        CacheEvent("skipped-cudnn", None, 4, count=2),
        CacheEvent("loaded", "/c/a.json", 5, count=3),
    )
    assert facts.errors == (ProfileIdError(2, 9, 6, "/c/a.json"),)
    assert facts.lines == 7


def test_empty_log_gives_empty_facts(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_bytes(b"")
    assert read_log(log) == LogFacts(str(log), (), (), (), 0)


def refusal(path: Path) -> Refused:
    with pytest.raises(Refused) as info:
        read_log(path)
    assert info.value.exit_code == EXIT_REFUSED
    assert info.value.path == str(path)
    assert "\n" not in str(info.value)
    return info.value


def test_missing_file_is_refused(tmp_path: Path) -> None:
    assert "no such file" in refusal(tmp_path / "nope.log").message


def test_directory_is_refused(tmp_path: Path) -> None:
    assert "directory" in refusal(tmp_path).message


def test_binary_file_with_nul_bytes_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "core.dump"
    log.write_bytes(b"ELF\x00\x01" + b"[Autotuner]: Loaded 1 configs from x\n" * 10)
    assert "binary" in refusal(log).message


def test_binary_file_without_nul_bytes_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "log.zst"
    log.write_bytes(bytes(range(0x80, 0x100)) * 64)
    assert "binary" in refusal(log).message


def test_unreadable_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "root-only.log"
    log.write_text("x\n")

    def denied(self: Path, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    # Tests may run as root, where chmod 000 does not stop reading.
    monkeypatch.setattr(Path, "open", denied)
    assert "permission denied" in refusal(log).message


def test_a_fifo_is_refused_without_a_writer_and_read_with_one(tmp_path: Path) -> None:
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    with no_hang(), pytest.raises(Refused, match="FIFO nothing is writing to") as info:
        read_log(fifo)
    assert info.value.exit_code == EXIT_REFUSED and info.value.path == str(fifo)
    r, w = os.pipe()  # what `--log <(kubectl logs POD)` hands over, as /dev/fd/N
    try:
        os.write(w, (H200 / "flashinfer-0.6.18-tune.log").read_bytes())
        threading.Timer(0.2, os.close, [w]).start()  # the writer finishes after doctor opens it
        with no_hang():
            facts = read_log(Path(f"/dev/fd/{r}"))
    finally:
        os.close(r)
    assert [e.kind for e in facts.events] == ["saved"] and facts.tuning_seconds


def test_a_device_is_not_a_log(tmp_path: Path) -> None:
    with no_hang(), pytest.raises(Refused, match="character device"):
        read_log(Path("/dev/null"))  # /dev/tty would wait for a keyboard


START_FAILED = FIXTURES / "vllm-cpu" / "start-failed-kv-memory.log"


def test_a_failed_starts_root_cause_is_the_first_exception_not_the_last_line() -> None:
    cause = read_log(START_FAILED).root_cause
    assert cause is not None and cause.line_no == 56 and cause.process == "10756"
    assert cause.text.startswith("ValueError: Available memory on node 0 (16.68/18.09 GiB)")


def test_no_root_cause_without_vllms_failed_start_line() -> None:
    lines = [ln for ln in START_FAILED.read_text().splitlines() if "root cause above" not in ln]
    assert parse_log(lines).root_cause is None  # an exception alone is not a failed start
    quoted = "(APIServer pid=1) WARNING 12-03 15:13:04 [x.py:1] like `OSError: [Errno 24] Too many`"
    bare = "RuntimeError: Engine core initialization failed. See root cause above."
    assert parse_log([quoted, bare]).root_cause is None  # a warning that quotes one is not it
