"""cli/render.py: text from files (keys, metadata, a log's paths) reaches the terminal escaped,
through the one function every human renderer uses (issue 42 F11: an OSC "set title" escape in
a key went out raw from show, diff, evict, align and doctor --log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fi_cache.cli.render import printable
from fi_cache.model import v1
from tests.conftest import GEMM_618

TITLE = "\x1b]0;PWNED\x07\x1b[2J"
KEY = "('bf16_gemm" + TITLE + "', 'CublasltBf16GemmRunner', ((1, 4096), (4096, 2048)), ())"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("bf16_gemm", "bf16_gemm"),
        (TITLE, "\\x1b]0;PWNED\\x07\\x1b[2J"),
        ("a\u202eb\x9bc", "a\\u202eb\\x9bc"),
        ("two\nlines\t", "two\\x0alines\\x09"),
    ],
)
def test_control_characters_are_escaped_and_text_is_kept(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_a_messages_own_line_breaks_stay_when_asked() -> None:
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"


def _ranks(hdir: Path, tactics: list[int]) -> None:
    meta = json.loads(GEMM_618.read_text())["_metadata"]
    hdir.mkdir(parents=True)
    for rank, tactic in enumerate(tactics):
        cf = v1.CacheFile(meta, {KEY: ["CublasltBf16GemmRunner", tactic]})
        (hdir / f"autotune_configs_dp0_rank{rank}.json").write_text(v1.dumps(cf))


def test_no_renderer_sends_a_keys_escape_sequence_raw(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hdir = tmp_path / "0.6.18" / "90a" / ("a" * 64)
    _ranks(hdir, [1, 2])
    one, two = hdir / "autotune_configs_dp0_rank0.json", hdir / "autotune_configs_dp0_rank1.json"
    for args in (
        ["show", one],
        ["diff", one, two],
        ["evict", one, "--bucket", "1", "--dry-run"],
        ["align", hdir, "--dry-run"],
    ):
        r = run(*args)
        assert "PWNED" in r.out + r.err, (args, r.out, r.err)
        assert "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err, args


def test_doctor_log_escapes_a_logs_paths(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "start.log"
    path = f"/tmp/x{TITLE}/autotune_configs.json"
    log.write_text(
        f"2026-11-30 02:00:00,000 - INFO - autotuner.py:2789 - flashinfer.jit: [Autotuner]: "
        f"Loaded 12 configs from {path}\n"
    )
    r = run("doctor", "--log", log)
    assert "PWNED" in r.out and "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err


def test_a_long_list_is_one_item_a_line_and_the_same_json() -> None:
    # indent=2 runs json's pure-Python encoder: 12 s of `--format json diff` on 200,000 entries.
    from fi_cache.cli.render import LONG_LIST, json_text

    entries = [{"op": f"op{i}", "a": {"tactic": [i, []]}} for i in range(LONG_LIST + 1)]
    doc = {"path": "x", "entries": entries, "ranks": [{"entries": entries}, {"entries": [1]}]}
    text = json_text(doc)
    assert json.loads(text) == doc
    assert '\n    {"op": "op7", "a": {"tactic": [7, []]}},\n' in text
    assert '\n        {"op": "op7", "a": {"tactic": [7, []]}},\n' in text  # nested: deeper
    small = {"path": "x", "entries": entries[:3]}
    assert json_text(small) == json.dumps(small, indent=2)  # short lists: as before


def test_rows_are_made_as_they_are_printed_and_print_as_a_list() -> None:
    from fi_cache.cli.render import Rows, json_text

    made: list[int] = []

    def make(i: int) -> dict[str, int]:
        made.append(i)
        return {"i": i}

    rows = Rows(range(1500), make)
    assert len(rows) == 1500 and made == []  # nothing made before it is printed
    assert json.loads(json_text({"entries": rows})) == {"entries": [{"i": i} for i in range(1500)]}
    assert json.loads(json_text({"entries": Rows([1, 2], make)})) == {
        "entries": [{"i": 1}, {"i": 2}]
    }
