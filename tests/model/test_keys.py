"""The key parser: real keys from FlashInfer, odd-but-legal reprs, garbage."""

from __future__ import annotations

import contextlib
import json
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fi_cache.model import keys
from fi_cache.model.keys import CacheKey, KeyError_, Symbol, TorchSize
from tests.conftest import FI, GEMM_617, H200, Result
from tests.growth import lines_run

ALL_FIXTURES = sorted(H200.glob("*.json")) + sorted(FI.glob("*.json"))


def _real_keys() -> list[str]:
    out = []
    for path in ALL_FIXTURES:
        out.extend(k for k in json.loads(path.read_text()) if k.startswith("("))
    return out


def test_every_real_key_parses_and_prints_back_identically() -> None:
    real = _real_keys()
    assert len(real) > 200
    for raw in real:
        assert keys.format_key(keys.parse_key(raw)) == raw


def test_gemm_key_fields() -> None:
    raw = (
        "('bf16_gemm', 'CublasltBf16GemmRunner', ((1, 4096), (4096, 2048), (0,), (0,), "
        "(-1, 2048), (33554432,)), (1, 2048, 4096, torch.bfloat16))"
    )
    key = keys.parse_key(raw)
    assert key == CacheKey(
        "bf16_gemm",
        "CublasltBf16GemmRunner",
        ((1, 4096), (4096, 2048), (0,), (0,), (-1, 2048), (33554432,)),
        (1, 2048, 4096, Symbol("torch.bfloat16")),
        True,
    )


def test_three_tuple_key_of_old_flashinfer_has_no_extras() -> None:
    key = keys.parse_key("('fp8_gemm', 'CublasFp8GemmRunner', ((1, 16, 4096), (-1,)))")
    assert key.has_extras is False and key.extras is None
    assert keys.format_key(key) == "('fp8_gemm', 'CublasFp8GemmRunner', ((1, 16, 4096), (-1,)))"


@pytest.mark.parametrize(
    "text, value",
    [
        ("torch.Size([2, 3])", TorchSize((2, 3))),
        ("torch.Size([])", TorchSize(())),
        ("(None, True, False, -7, 'x')", (None, True, False, -7, "x")),
        (
            "('it\\'s', \"say \\\"hi\\\"\", 'tab\\there', '\\x00\\u00e9')",
            ("it's", 'say "hi"', "tab\there", "\x00é"),
        ),
        ("[1, [2, (3,)]]", [1, [2, (3,)]]),
        ("(1.5, -2e-05)", (1.5, -2e-05)),
        ("()", ()),
    ],
)
def test_repr_values(text: str, value: object) -> None:
    assert keys.parse_value(text) == value


@pytest.mark.parametrize(
    "text, reason",
    [
        ("('a', 'b', (1,)", "expected ')'"),
        ("('a', 'b', (1,), ()) junk", "after the key"),
        ("('a', 'b')", "tuple of (op, runner, profile"),
        ("(1, 'b', ())", "must be strings"),
        ("('a', 'b', 5)", "profile must be a tuple"),
        ("('a', 'b', ((1)), ())", "without a comma"),
        ("('a', 'b', (torch.Size(['x']),), ())", "list of ints"),
        ("__import__('os').system('true')", "expected"),
        ("('a', 'b', (), (1 2))", "expected ')'"),
        ("('a', 'b', (), ('\\q',))", "unknown escape"),
        ("('a' + 'b', 'c', ())", "unexpected '+'"),
    ],
)
def test_bad_keys_say_why(text: str, reason: str) -> None:
    with pytest.raises(KeyError_, match=re.escape(reason)):
        keys.parse_key(text)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    text = "('a', 'b', " + "(" * 5000 + ")" * 5000 + ", ())"
    with pytest.raises(KeyError_, match="nested deeper"):
        keys.parse_key(text)


def test_verify_reports_a_key_longer_than_flashinfer_writes_as_a_defect_naming_it(
    tmp_path: Path, run: Callable[..., Result]
) -> None:
    # A 1 MB op name (issue 25): the tokenizer's backtracking stack once took ~175x the key.
    data = json.loads(GEMM_617.read_text())
    data["('" + "a" * (1 << 20) + "', 'R', ((1,),), ())"] = ["R", 1]
    path = tmp_path / "huge-key.json"
    path.write_text(json.dumps(data))
    r = run("verify", str(path))
    assert r.code == 1
    (line,) = [ln for ln in r.err.splitlines() if "huge-key.json" in ln]
    assert "key ('aaaa" in line and "does not parse" in line and "65,536" in line
    assert "Traceback" not in r.err and "1 with problems" in r.err


def test_a_long_key_under_the_limit_parses_in_memory_proportional_to_it() -> None:
    raw = "('" + "a" * 60_000 + "\\n', 'R', ((1, 4096),), ())"
    tracemalloc.start()
    try:
        key = keys.parse_key(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert key.op == "a" * 60_000 + "\n" and key.profile == ((1, 4096),)
    assert peak < 20 * len(raw)  # the old tokenizer peaked at ~170x


def test_batch_check_agrees_with_the_parser_on_real_and_broken_keys() -> None:
    real = _real_keys()
    broken = [real[0][:-1], real[1].replace("(", "[", 1), "('a', 'b', (), (), ())", "nonsense"]
    mixed = real[:50] + broken + real[50:60]
    bad = keys.find_unparsable(mixed)
    assert sorted(bad) == [50, 51, 52, 53]
    assert keys.find_unparsable(real) == {}


def test_key_heads_fast_path_matches_full_parse() -> None:
    real = _real_keys()
    heads = keys.key_heads(real)
    assert heads == [(keys.parse_key(k).op, keys.parse_key(k).runner) for k in real]


# --- properties ---------------------------------------------------------------------------------

_dtypes = st.sampled_from(["torch.bfloat16", "torch.float8_e4m3fn", "torch.float16", "torch.int8"])
_atoms = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False),
    _dtypes.map(Symbol),
    st.lists(st.integers(0, 2**31), max_size=4).map(lambda d: TorchSize(tuple(d))),
)
_values = st.recursive(
    _atoms,
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(tuple), st.lists(inner, max_size=4)),
    max_leaves=25,
)
_shapes = st.lists(st.lists(st.integers(-1, 1 << 20), max_size=3).map(tuple), max_size=6).map(tuple)


@given(
    st.text(min_size=1, max_size=20),
    st.text(min_size=1, max_size=20),
    _shapes,
    st.one_of(st.none(), st.lists(_values, max_size=20).map(tuple)),
)
@settings(max_examples=400, deadline=None)
def test_round_trip_of_any_key_python_would_print(
    op: str,
    runner: str,
    profile: tuple,  # type: ignore[type-arg]
    extras: tuple | None,
) -> None:  # type: ignore[type-arg]
    value = (op, runner, profile) if extras is None else (op, runner, profile, extras)
    text = keys.format_value(value)
    key = keys.parse_key(text)
    assert keys.format_key(key) == text
    assert keys.find_unparsable([text]) == {}


@given(_values)
@settings(max_examples=300, deadline=None)
def test_format_matches_python_repr_for_plain_values(value: object) -> None:
    if not _has_torch(value):
        assert keys.format_value(value) == repr(value)  # type: ignore[arg-type]
    assert keys.parse_value(keys.format_value(value)) == value  # type: ignore[arg-type]


def _has_torch(value: object) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_has_torch(v) for v in value)
    return isinstance(value, (Symbol, TorchSize))


@given(st.text(max_size=200))
@settings(max_examples=500, deadline=None)
def test_garbage_never_crashes(text: str) -> None:
    with contextlib.suppress(KeyError_):  # any other exception fails the test
        keys.parse_key(text)
    keys.find_unparsable([text, text])


@given(st.text(alphabet="()[], '\"\\0123456789abcTrueNonetorch.Size-", max_size=120))
@settings(max_examples=500, deadline=None)
def test_near_miss_garbage_batch_and_parser_agree(text: str) -> None:
    try:
        keys.parse_key(text)
        ok = True
    except KeyError_:
        ok = False
    assert (keys.find_unparsable([text]) == {}) == ok


_SAME_SHAPE_KEYS = [
    "('bf16_gemm', 'CublasltBf16GemmRunner', ((7, 4096), (4096, 2048), (0,), (-1, 2048)), "
    "(7, 2048, 4096, torch.bfloat16))",
    "('bf16_gemm', 'CublasltBf16GemmRunner', ((9, 1024), (1024, 3072), (0,), (-1, 3072)), "
    "(9, 3072, 1024, torch.bfloat16))",
    "('op9', 'R', ([1, 2.5, 30.0], torch.Size([4, 5]), 'x1', torch.float16, True, None))",
    "('op7', 'R', ([8, 9.5, 60.0], torch.Size([2, 3]), 'x8', torch.float16, True, None))",
    "('fp8_gemm', 'R', ((3, 4),))",
    "('fp8_gemm', 'R', ((8, 1),))",
]


def test_keys_that_differ_only_in_digits_parse_to_what_the_parser_gives() -> None:
    for _ in range(3):  # the first sighting is parsed; later ones are built from its tree
        for raw in _SAME_SHAPE_KEYS:
            key = keys.parse_key(raw)
            assert key == keys._checked_key(keys.parse_value(raw))
            assert keys.format_key(key) == raw
    too_long = "('a', 'b', ((" + "1" * 5000 + ",),))"
    for _ in range(2):
        with pytest.raises(KeyError_, match="too long"):
            keys.parse_key(too_long)


def test_a_key_of_a_seen_shape_is_built_in_a_few_lines_not_parsed() -> None:
    # 200,000 entries of one cache share a handful of shapes: the parser ran 795 lines per key
    # (show, diff, coverage took 15-25 s on 200,000).
    raws = [_SAME_SHAPE_KEYS[0].replace("(7,", f"({m},") for m in range(100, 300)]
    keys.parse_key(raws[0]), keys.parse_key(raws[1])
    assert lines_run(lambda: [keys.parse_key(raw) for raw in raws]) < 30 * len(raws)  # was 795


def test_shapes_from_a_keys_text_are_the_parsed_profiles() -> None:
    odd = [
        _SAME_SHAPE_KEYS[0].replace("(7,", "(07,"),  # not as str(int) writes it
        _SAME_SHAPE_KEYS[0].replace("(-1,", "(-0,"),
    ]
    for _ in range(2):
        for raw in [*_SAME_SHAPE_KEYS, *odd]:
            key = keys.parse_key(raw)
            assert keys.shapes_text(raw) in (None, keys.shapes(key.profile))
    assert keys.shapes_text(_SAME_SHAPE_KEYS[1]) == "9x1024 1024x3072 0 -1x3072"
    for raw in odd:  # numbers as str(int) prints them, as the parsed key's
        assert keys.shapes_text(raw) == keys.shapes(keys.parse_key(raw).profile)
    assert keys.shapes_text(_SAME_SHAPE_KEYS[3]) is None  # a list and a torch.Size: parsed


def test_a_keys_row_read_from_its_text_is_what_the_parsed_key_shows() -> None:
    from fi_cache.cli.show import _extras_text

    def parsed_row(raw: str) -> keys.KeyRow:
        key = keys.parse_key(raw)
        return key.op, key.runner, keys.shapes(key.profile), key.profile, _extras_text(key, {})  # type: ignore[return-value]

    three = ["('a0', 'b', ((1, 2), ()))", "('a1', 'b', ((3, 4), ()))"]
    extras = [
        "('a', 'b', ((1, 2),), [True, None, x.y0])",
        "('a', 'b', ((1, 3),), [True, None, x.y1])",
    ]
    for _ in range(2):
        for raw in [*_SAME_SHAPE_KEYS, *three, *extras]:
            row = keys.key_row(raw)
            assert row is None or row == parsed_row(raw), raw
    assert keys.key_row(_SAME_SHAPE_KEYS[1]) == parsed_row(_SAME_SHAPE_KEYS[1])
    assert keys.key_row(three[1]) == ("a1", "b", "3x4 ()", ((3, 4), ()), "-")
    assert keys.key_row(extras[1]) == ("a", "b", "1x3", ((1, 3),), "[True,None,x.y1]")
    assert keys.key_row(_SAME_SHAPE_KEYS[3]) is None  # a torch.Size in the profile: parsed
    odd = _SAME_SHAPE_KEYS[1].replace("(-1,", "(-0,")  # the same shape of key
    assert keys.key_row(odd) == parsed_row(odd)  # numbers as str(int) prints them: 0
