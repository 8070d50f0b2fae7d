"""fi_cache/model/jsoncheck.py: JSON that json.loads accepts but no FlashInfer writes."""

from __future__ import annotations

import json

import pytest

from fi_cache.model import jsoncheck, v1
from tests.conftest import GEMM_618, MOE_618_FUSED

KEY = "('bf16_gemm', 'CublasltBf16GemmRunner', ((1, 4096),), ())"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"_metadata": {"gpu": "NVIDIA H200\\ud800"}}', "_metadata/gpu"),
        ('{"_generation": "\\udc00abc"}', "_generation"),
        ('{"' + KEY.replace("Runner", "Runner\\uDBFF") + '": ["r", 1]}', "key"),
        ('{"' + KEY + '": ["r\\ud800", 1]}', "[0]"),
    ],
)
def test_a_lone_surrogate_is_found_and_shown_escaped(text: str, where: str) -> None:
    data = json.loads(text)
    why = jsoncheck.problem(data, text)
    assert why is not None and "lone UTF-16 surrogate" in why and where in why
    why.encode("utf-8")  # the message itself prints anywhere


def test_a_surrogate_pair_and_an_escaped_backslash_are_text() -> None:
    text = '{"_metadata": {"gpu": "\\ud83d\\ude00", "x": "\\\\ud800"}}'
    assert jsoncheck.problem(json.loads(text), text) is None


def test_nesting_deeper_than_flashinfer_writes_is_found() -> None:
    deep = {"_metadata": {}, KEY: ["r", [[[[[[[[1]]]]]]]]]}
    assert jsoncheck.problem(deep, json.dumps(deep)) is None
    too_deep: list[object] = [1]
    for _ in range(jsoncheck.MAX_DEPTH):
        too_deep = [too_deep]
    why = jsoncheck.problem({"x": too_deep}, "")
    assert why is not None and "nested deeper" in why
    assert jsoncheck.problem({"x": too_deep}) == why  # without the text: the same answer


@pytest.mark.parametrize("fixture", [GEMM_618, MOE_618_FUSED])
def test_real_flashinfer_files_pass(fixture) -> None:  # type: ignore[no-untyped-def]
    raw = fixture.read_bytes()
    assert jsoncheck.problem(json.loads(raw), raw) is None
    assert jsoncheck.problem(json.loads(raw)) is None


def test_v1_loads_calls_it_a_format_error() -> None:
    text = GEMM_618.read_text().replace('"NVIDIA H200"', '"NVIDIA H200\\ud800"')
    with pytest.raises(v1.FormatError, match="lone UTF-16 surrogate"):
        v1.loads(text)
    deep = '{"_metadata": {}, "' + KEY + '": ["r", ' + "[" * 100 + "]" * 100 + "]}"
    with pytest.raises(v1.FormatError, match="nested deeper than 32"):
        v1.loads(deep)
