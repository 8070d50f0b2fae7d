"""The v1 file: FlashInfer's exact layout and `_generation`, integrity defects."""

from __future__ import annotations

import json

import pytest

from fi_cache.model import v1
from tests.conftest import GEMM_617, GEMM_618, MOE_618_FUSED


def test_generation_matches_the_real_h200_file() -> None:
    cf = v1.loads(GEMM_618.read_bytes())
    assert cf.generation == v1.compute_generation(cf)
    assert list(v1.defects(cf)) == []


def test_rewrite_is_byte_identical_to_what_flashinfer_wrote() -> None:
    for path in (GEMM_617, GEMM_618, MOE_618_FUSED):
        text = path.read_text()
        assert v1.dumps(v1.loads(text)) == text


def test_0617_file_stays_without_generation_when_rewritten() -> None:
    out = json.loads(v1.dumps(v1.loads(GEMM_617.read_bytes())))
    assert "_generation" not in out  # a 0.6.17 reader would load it as a bogus entry


def test_unknown_fields_and_extra_value_elements_survive_a_rewrite() -> None:
    data = json.loads(GEMM_618.read_text())
    first = next(k for k in data if k.startswith("("))
    data[first] = [*data[first], {"source": "measured"}, {"time_ms": 0.01, "candidates": 4}]
    data["_future_field"] = {"x": 1}
    data["_records"] = {"ns": {"a": 1}}
    cf = v1.loads(json.dumps(data))
    again = json.loads(v1.dumps(cf))
    assert again[first] == data[first]
    assert again["_future_field"] == {"x": 1}
    assert again["_records"] == {"ns": {"a": 1}}
    assert again["_generation"] == v1.compute_generation(v1.loads(json.dumps(again)))
    assert list(again)[:2] == ["_metadata", "_records"] and list(again)[-1] == "_generation"


def test_edited_file_reports_generation_mismatch() -> None:
    data = json.loads(GEMM_618.read_text())
    first = next(k for k in data if k.startswith("("))
    data[first][1] = 99
    found = list(v1.defects(v1.loads(json.dumps(data))))
    assert [d.check for d in found] == ["generation-mismatch"]


@pytest.mark.parametrize(
    "value, why",
    [
        ({"runner": "x"}, "not [runner, tactic]"),
        (["OnlyRunner"], "1 elements"),
        ([1, 2], "runner name"),
        (["R", True], "tactic"),
        (["R", {"a": 1}], "tactic"),
        (["R", 1, 2, 3, 4], "5 elements"),
    ],
)
def test_malformed_values_are_named(value: object, why: str) -> None:
    data = {"('op', 'R', ((1,),), ())": value}
    found = list(v1.defects(v1.loads(json.dumps(data))))
    assert len(found) == 1 and why in found[0].message and found[0].check == "corrupt-file"


def test_real_tactic_shapes_are_accepted() -> None:
    for tactic in (3, [0, []], [12, [["k", 1], ["v", 2.5]]], [1, [2, None]]):
        assert v1.value_problem(["R", tactic]) is None


def test_unparsable_key_is_a_corrupt_entry() -> None:
    data = {"('op', 'R', ((1,),), ())": ["R", 1], "('op', 'R', ((1,),": ["R", 2]}
    found = list(v1.defects(v1.loads(json.dumps(data))))
    assert [d.check for d in found] == ["corrupt-file"] and "does not parse" in found[0].message


def test_many_defects_are_capped_with_a_count() -> None:
    data = {f"('op', 'R', (({i},),), ())": "bad" for i in range(50)}
    found = list(v1.defects(v1.loads(json.dumps(data)), limit=5))
    assert len(found) == 6 and "45 more" in found[-1].message


@pytest.mark.parametrize(
    "text, why",
    [
        (b'{"_metadata": {"gpu": "NVIDIA H200"}, "(\'a', "truncated"),
        (b"not json at all", "invalid JSON"),
        (b"[1, 2]", "JSON array"),
        (b'{"_metadata": []}', "_metadata is a JSON array"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ],
)
def test_files_flashinfer_cannot_load_are_refused_with_a_reason(text: bytes, why: str) -> None:
    with pytest.raises(v1.FormatError, match=why):
        v1.loads(text)


def test_a_control_character_in_a_key_is_reported_once_with_its_place() -> None:
    with pytest.raises(v1.FormatError) as info:
        v1.loads(b'{"a\tb": ["R", 0]}')
    assert str(info.value) == "invalid JSON: Invalid control character at line 1 column 4"


def test_what_flashinfer_loads_as_an_entry_is_checked_as_one() -> None:
    """load_configs reads every top-level field but the reserved ones as [runner, tactic]
    (tests/model/test_flashinfer_compat.py runs the real loaders on each shape)."""
    found = list(v1.defects(v1.loads(b'{"x": [1, 2], "note": "fine", "n": 5}')))
    assert [d.check for d in found] == ["corrupt-file", "corrupt-file"]
    assert "'x'" in found[0].message and "AttributeError" in found[0].message
    assert "'n'" in found[1].message and "TypeError" in found[1].message


def test_generation_and_records_are_judged_by_the_flashinfer_that_reads_the_file() -> None:
    unstamped = list(v1.defects(v1.loads(b'{"_generation": 5, "_records": {}}')))
    assert [d.check for d in unstamped] == ["records-unreadable", "corrupt-file"]
    assert "<= 0.6.17" in unstamped[1].message  # it reads `_generation` as an entry
    meta = json.loads(GEMM_618.read_text())["_metadata"]
    stamped = {"_metadata": meta, "_generation": 5, "_records": {}}
    assert [d.check for d in v1.defects(v1.loads(json.dumps(stamped)))] == [
        "generation-mismatch"  # only 0.6.18 reads it, and it does not care
    ]
    stamped["_records"] = None
    [bad, _] = v1.defects(v1.loads(json.dumps(stamped)))
    assert bad.check == "corrupt-file" and "ValueError" in bad.message


def test_ops_and_finalize_of_gemm_file() -> None:
    cf = v1.loads(GEMM_618.read_bytes())
    assert cf.ops() == ["bf16_gemm", "fp8_gemm"]
    assert cf.finalize() is None


def test_finalize_is_per_file_even_when_shapes_repeat_across_files() -> None:
    fused = v1.loads(MOE_618_FUSED.read_bytes())
    unfused_text = MOE_618_FUSED.read_text().replace(", True))", ", False))")
    assert v1.loads(unfused_text).finalize() == "unfused"
    assert fused.finalize() == "fused"  # the shared per-signature memo keeps modes apart


def test_finalize_of_a_key_with_an_unusual_head() -> None:
    raw = (
        "(\"it's\", 'MoERunner', ((1, 2),), (torch.bfloat16, torch.bfloat16, "
        "torch.bfloat16, 8, 1, 0, 1, 0, 1, 0, False, False, False, False, False, False, True, "
        "3, False, True))"
    )
    cf = v1.CacheFile(None, {raw: ["MoERunner", 1]})
    assert cf.finalize() is None  # not a MoE op, parsed the slow way without crashing
    assert cf.ops() == ["it's"]


def test_dumps_is_json_dumps_indent_2_byte_for_byte() -> None:
    """v1.dumps joins flat entry values itself (the C encoder; indent=2 runs the pure-Python
    one): the text is still what json.dumps(indent=2) writes, for every value shape."""
    entries = {
        "('op', 'R', ((1, 2),), ())": ["R", 3],
        "k\u00e9y \x1b[31m": ["R\u00e9", -1, 2, "x"],
        "nested": ["R", [1, [2, "a"]]],
        "empty": [],
        "flt": ["R", 1.5, True, None],
        "obj": {"a": [1, {"b": "c\nd"}]},
        "scalar": 7,
    }
    cf = v1.CacheFile({"gpu": "NVIDIA H200", "n": [1, 2]}, entries, generation=None)
    assert v1.dumps(cf) == json.dumps(v1._ordered(cf, True), indent=2)
    empty = v1.CacheFile(None, {}, generation=None)
    assert v1.dumps(empty) == json.dumps({}, indent=2)
