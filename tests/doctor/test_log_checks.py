"""log_checks as a user meets them: `doctor --log FILE` says what the file is."""

from __future__ import annotations

from pathlib import Path


def test_a_file_without_engine_output_is_said_to_hold_none(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A README names vLLM and FlashInfer on many lines; none of them is their output."""
    readme = tmp_path / "README.md"
    readme.write_text(
        "# fi-cache\n\nFlashInfer autotune caches for people who serve LLMs with vLLM.\n"
        "vLLM keeps them in `~/.cache/vllm/flashinfer_autotune_cache/`; SGLang in its own.\n"
    )
    r = run("--format", "json", "doctor", "--log", readme, "--check", "log-summary")
    [f] = r.json()["findings"]
    assert f["severity"] == "warning"
    assert f"no vLLM, SGLang or FlashInfer output in {readme}" in f["message"]
    assert "\n" not in f["message"]
    sglang = tmp_path / "sglang.log"  # SGLang's own lines are engine output
    sglang.write_text("[2026-01-05 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n")
    r = run("--format", "json", "doctor", "--log", sglang, "--check", "log-summary")
    [f] = r.json()["findings"]
    assert f["severity"] == "info" and "no autotune cache was loaded or saved" in f["message"]
