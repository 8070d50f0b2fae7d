"""The tuning plan: TOML in, frozen ops out; every bad input is one PlanError naming file and op."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fi_cache.engines.flashinfer import plan
from fi_cache.engines.flashinfer.plan import (
    DEFAULT_BACKEND,
    DEFAULT_TOKENS,
    KNOWN_OPS,
    MAX_DIM,
    MAX_TOKENS,
    GemmOp,
    MoeOp,
    Plan,
    PlanError,
    from_mapping,
    loads,
    op_from_json,
    op_to_json,
)
from fi_cache.errors import EXIT_REFUSED

SRC = "plans/qwen3.toml"

FULL = """\
tokens = [1024, 1, 128, 16, 16]

[[ops]]
op = "mm_bf16"
n = 2048
k = 4096
backends = ["cublaslt", "cudnn"]

[[ops]]
op = "bmm_fp8"
batch = 4
n = 512
k = 7168
tokens = [8, 2]

[[ops]]
op = "mm_fp8"
n = 1536
k = 7168

[[ops]]
op = "cutlass_fused_moe"
dtype = "fp16"
hidden_size = 2048
intermediate_size = 768
num_experts = 128
top_k = 8
finalize = ["unfused", "fused"]
tp_size = 2
tp_rank = 1
ep_size = 4
ep_rank = 3
tune_max_num_tokens = 8192
"""

MOE = {
    "op": "cutlass_fused_moe",
    "hidden_size": 2048,
    "intermediate_size": 768,
    "num_experts": 128,
    "top_k": 8,
}
GEMM = {"op": "mm_bf16", "n": 2048, "k": 4096}


def _one(**op: Any) -> plan.Op:
    return from_mapping({"ops": [op]}, SRC).ops[0]


def _refused(data: dict[str, Any] | str, match: str) -> PlanError:
    with pytest.raises(PlanError, match=match) as exc:
        if isinstance(data, str):
            loads(data, SRC)
        else:
            from_mapping(data, SRC)
    err = exc.value
    assert err.exit_code == EXIT_REFUSED
    assert err.path == SRC
    assert str(err).startswith(f"{SRC}: ")
    assert "\n" not in str(err)
    return err


def _op_refused(op: dict[str, Any], match: str, index: int = 2) -> PlanError:
    """`op` as the second of two ops, so the message must say which one."""
    err = _refused({"ops": [GEMM, op]}, match)
    assert f"op {index}" in err.message
    return err


# --- reading ------------------------------------------------------------------------------------


def test_full_plan() -> None:
    p = loads(FULL, SRC)
    assert p.source == SRC
    mm, bmm, fp8, moe = p.ops
    assert mm == GemmOp("mm_bf16", 2048, 4096, (1, 16, 128, 1024), ("cublaslt", "cudnn"), 1, 1)
    assert isinstance(bmm, GemmOp)
    assert (bmm.batch, bmm.tokens, bmm.backends, bmm.index) == (4, (2, 8), ("cublas",), 2)
    assert isinstance(fp8, GemmOp)
    assert fp8.backends == ("trtllm_low_latency",)
    assert isinstance(moe, MoeOp)
    assert moe.op == "cutlass_fused_moe"
    assert moe.finalize == ("fused", "unfused")  # canonical order, whatever the file says
    assert (moe.tp_size, moe.tp_rank, moe.ep_size, moe.ep_rank) == (2, 1, 4, 3)
    assert (moe.local_intermediate, moe.local_experts, moe.max_tokens) == (384, 32, 8192)
    assert moe.label == "cutlass_fused_moe fp16 h=2048 i=768 e=128 top_k=8 tp=2 ep=4"
    assert bmm.label == "bmm_fp8 batch=4 n=512 k=7168"
    assert mm.label == "mm_bf16 n=2048 k=4096"


def test_defaults() -> None:
    moe = _one(**MOE)
    assert isinstance(moe, MoeOp)
    assert moe.tokens == DEFAULT_TOKENS == (1, 16, 128, 1024)
    assert moe.dtype == "bf16"
    assert moe.finalize == ("fused",)
    assert (moe.tp_size, moe.tp_rank, moe.ep_size, moe.ep_rank) == (1, 0, 1, 0)
    assert moe.tune_max_num_tokens == 0
    assert moe.max_tokens == 1024  # the largest token count
    assert moe.label == "cutlass_fused_moe bf16 h=2048 i=768 e=128 top_k=8"
    expected = {"mm_bf16": "cudnn", "bmm_fp8": "cublas", "mm_fp8": "trtllm_low_latency"}
    for name, backend in expected.items():  # FlashInfer's own `backend=` defaults
        op = _one(op=name, n=2048, k=4096)
        assert isinstance(op, GemmOp)
        assert op.backends == (backend,) == (DEFAULT_BACKEND[name],)
        assert op.batch == 1


def test_tokens_sorted_and_deduplicated() -> None:
    p = from_mapping({"tokens": [64, 1, 64, 8], "ops": [GEMM, {**MOE, "tokens": [3, 3, 2]}]})
    assert p.ops[0].tokens == (1, 8, 64)
    assert p.ops[1].tokens == (2, 3)
    assert from_mapping({"tokens": 7, "ops": [GEMM]}).ops[0].tokens == (7,)  # a bare number


def test_backends_and_finalize_deduplicated_a_bare_string_accepted() -> None:
    op = _one(**GEMM, backends=["cudnn", "cutlass", "cudnn"])
    assert isinstance(op, GemmOp)
    assert op.backends == ("cudnn", "cutlass")
    moe = _one(**MOE, finalize="unfused")
    assert isinstance(moe, MoeOp)
    assert moe.finalize == ("unfused",)


def test_indexes_are_one_based() -> None:
    p = from_mapping({"ops": [GEMM, MOE, GEMM]})
    assert [op.index for op in p.ops] == [1, 2, 3]


# --- modes and namespaces -----------------------------------------------------------------------


def test_gemm_only_plan_fills_the_fused_namespace() -> None:
    p = from_mapping({"ops": [GEMM, {**GEMM, "op": "bmm_fp8"}]})
    assert p.modes == ("fused",)
    assert p.for_mode("fused") == p.ops
    assert p.for_mode("unfused") == p.ops  # GEMMs are not finalize-dependent


def test_unfused_only_moe_sends_gemms_to_the_unfused_namespace() -> None:
    p = from_mapping({"ops": [GEMM, {**MOE, "finalize": ["unfused"]}]})
    assert p.modes == ("unfused",)
    assert p.for_mode("unfused") == p.ops
    assert p.for_mode("fused") == (p.ops[0],)


def test_modes_in_canonical_order() -> None:
    p = from_mapping(
        {"ops": [{**MOE, "finalize": ["unfused"]}, {**MOE, "finalize": ["fused"]}, GEMM]}
    )
    assert p.modes == ("fused", "unfused")
    fused, unfused = p.for_mode("fused"), p.for_mode("unfused")
    assert [op.index for op in fused] == [2, 3]
    assert [op.index for op in unfused] == [1, 3]


# --- writing ------------------------------------------------------------------------------------


def test_round_trip() -> None:
    p = loads(FULL, SRC)
    text = plan.dumps(p, header=["written by a test", "", "second line"])
    assert text.startswith("# written by a test\n#\n# second line\n\n[[ops]]\n")
    back = loads(text, SRC)
    assert back == p
    assert plan.dumps(back) == plan.dumps(p)


def test_dumps_leaves_defaults_implicit_but_always_writes_finalize() -> None:
    text = plan.dumps(from_mapping({"ops": [GEMM, MOE]}))
    assert "batch" not in text
    assert "tp_size" not in text and "tune_max_num_tokens" not in text
    assert 'finalize = ["fused"]' in text
    assert 'backends = ["cudnn"]' in text
    assert "tokens = [1, 16, 128, 1024]" in text
    assert loads(text) == from_mapping({"ops": [GEMM, MOE]})


def test_dumps_of_an_empty_header_is_just_the_ops() -> None:
    text = plan.dumps(from_mapping({"ops": [GEMM]}))
    assert text.startswith("[[ops]]\n")
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_op_json_round_trip() -> None:
    for op in loads(FULL, SRC).ops:
        data = json.loads(json.dumps(op_to_json(op)))  # the pipe to the tuning child
        assert data["op"] == op.op
        assert op_from_json(data) == op
    moe = loads(FULL, SRC).ops[3]
    assert isinstance(moe, MoeOp)
    assert op_from_json(op_to_json(replace(moe, index=9))).index == 9


_tokens = st.lists(st.integers(1, MAX_TOKENS), min_size=1, max_size=6)
_gemm = st.builds(
    lambda name, n, k, batch, tokens, out, scales: (
        {"op": name, "n": n * 128, "k": k * 128, "tokens": tokens}
        | ({"out_dtype": out} if name != "mm_fp8" else {})
        | (
            {"batch": batch, "a_scale_shape": scales[0], "b_scale_shape": scales[1]}
            if name == "bmm_fp8"
            else {}
        )
    ),
    st.sampled_from(["mm_bf16", "bmm_fp8", "mm_fp8"]),
    st.integers(1, MAX_DIM // 128),
    st.integers(1, MAX_DIM // 128),
    st.integers(1, 64),
    _tokens,
    st.sampled_from(["bf16", "fp16"]),
    st.tuples(st.sampled_from([[], [1]]), st.sampled_from([[], [1]])),
)
_moe = st.builds(
    lambda tp, ep, k, fin, tokens, extra: {
        **MOE,
        "intermediate_size": 768 * tp,
        "num_experts": 8 * ep,
        "top_k": k,
        "tp_size": tp,
        "ep_size": ep,
        "tp_rank": tp - 1,
        "ep_rank": ep - 1,
        "finalize": fin,
        "tokens": tokens,
        "tune_max_num_tokens": min(max(tokens) + extra, MAX_TOKENS),
    },
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(1, 8),
    st.lists(st.sampled_from(["fused", "unfused"]), min_size=1, max_size=3),
    _tokens,
    st.integers(0, 1000),
)


@given(st.lists(st.one_of(_gemm, _moe), min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_any_valid_plan_round_trips(ops: list[dict[str, Any]]) -> None:
    try:
        p = from_mapping({"ops": ops}, SRC)
    except PlanError as exc:  # MoE ops with different maxima: refused, tested below
        assume("one tune_max_num_tokens" not in exc.message)
        raise
    assert loads(plan.dumps(p), SRC) == p
    assert tuple(op_from_json(json.loads(json.dumps(op_to_json(op)))) for op in p.ops) == p.ops


def test_a_header_cannot_inject_toml() -> None:
    p = from_mapping({"ops": [GEMM]})
    text = plan.dumps(p, header=["model x\n[[ops]]\nop = 'mm_bf16'\nn = 9\nk = 9"])
    assert loads(text) == p


def test_call_style_defaults_are_flashinfers_own() -> None:
    """Without call-style keys fi-cache calls as FlashInfer's docs do: bf16 out, 0-d scales."""
    op = _one(op="bmm_fp8", n=64, k=64)
    assert isinstance(op, GemmOp)
    assert (op.out_dtype, op.a_scale_shape, op.b_scale_shape) == ("bf16", (), ())
    assert "out_dtype" not in plan.dumps(Plan((op,)))


def test_call_style_as_vllm_calls_bmm_fp8() -> None:
    """vLLM's dynamic per-tensor activation scale is a (1,) tensor: a plan can say so."""
    op = _one(op="bmm_fp8", n=64, k=64, out_dtype="fp16", a_scale_shape=[1])
    assert isinstance(op, GemmOp)
    assert (op.out_dtype, op.a_scale_shape, op.b_scale_shape) == ("fp16", (1,), ())
    assert op.label == "bmm_fp8 batch=1 n=64 k=64 out=fp16 a_scale=[1]"
    assert loads(plan.dumps(Plan((op,)))).ops == (op,)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("out_dtype", "fp32", r"out_dtype 'fp32': expected bf16 or fp16"),
        ("a_scale_shape", [2], r"a_scale_shape = \[2\]: expected \[\] \(a 0-d tensor\) or \[1\]"),
        ("b_scale_shape", [1, 1], r"b_scale_shape = \[1, 1\]: expected"),
        ("a_scale_shape", [True], r"a_scale_shape = \[True\]: expected"),
        ("a_scale_shape", "1", r"a_scale_shape = '1': expected"),
    ],
)
def test_bad_call_style(key: str, value: Any, match: str) -> None:
    _op_refused({"op": "bmm_fp8", "n": 64, "k": 64, key: value}, match)


@pytest.mark.parametrize("backend", ["tgv", "tinygemm", "cute-dsl"])
def test_fp16_output_on_a_bf16_only_mm_bf16_backend(backend: str) -> None:
    """FlashInfer's requirement check for these backends raises for any other out_dtype."""
    op = {"op": "mm_bf16", "n": 64, "k": 64, "backends": ["cublaslt", backend], "out_dtype": "fp16"}
    _op_refused(op, f"the {backend} backend writes bf16 only, not out_dtype 'fp16'")


def test_fp16_output_on_backends_that_write_it() -> None:
    backends = ["cudnn", "cublaslt", "cutlass", "cutile", "auto"]
    op = _one(op="mm_bf16", n=64, k=64, backends=backends, out_dtype="fp16")
    assert isinstance(op, GemmOp) and op.out_dtype == "fp16"


@pytest.mark.parametrize("name, key", [("mm_bf16", "a_scale_shape"), ("mm_fp8", "out_dtype")])
def test_call_style_keys_only_where_the_op_takes_them(name: str, key: str) -> None:
    _op_refused({"op": name, "n": 128, "k": 128, key: "bf16"}, f"unknown key '{key}'")


# --- refusals -----------------------------------------------------------------------------------


def test_unknown_op_lists_the_known_ones() -> None:
    err = _op_refused({"op": "mm_fp4", "n": 1, "k": 1}, r"op 2: unknown op 'mm_fp4'")
    for name in KNOWN_OPS:
        assert name in err.message


def test_missing_op_key() -> None:
    err = _op_refused({"n": 16, "k": 16}, r"op 2: has no `op = \.\.\.`; known: mm_bf16")
    assert "cutlass_fused_moe" in err.message


def test_op_that_is_not_a_table() -> None:
    _refused({"ops": [GEMM, "mm_bf16"]}, r"op 2: each \[\[ops\]\] entry must be a table")


def test_unknown_key_typo() -> None:
    # The typo itself is named (with the known keys), not the field it failed to set.
    bad = {k: v for k, v in MOE.items() if k != "hidden_size"} | {"hiden_size": 2048}
    err = _op_refused(bad, r"op 2 \(cutlass_fused_moe\): unknown key 'hiden_size'")
    assert "hidden_size" in err.message
    no_hidden = {k: v for k, v in MOE.items() if k != "hidden_size"}
    _op_refused(no_hidden, r"op 2 \(cutlass_fused_moe\): missing 'hidden_size'")
    _op_refused(
        {**MOE, "hiden_size": 2048}, r"op 2 \(cutlass_fused_moe\): unknown key 'hiden_size'"
    )
    _op_refused({**GEMM, "batch": 2}, r"op 2 \(mm_bf16\): unknown key 'batch'")
    _op_refused({**GEMM, "finalize": ["fused"]}, r"unknown key 'finalize'")


def test_missing_shape_keys() -> None:
    for key in ("hidden_size", "intermediate_size", "num_experts", "top_k"):
        _op_refused({k: v for k, v in MOE.items() if k != key}, rf"missing '{key}'")
    for key in ("n", "k"):
        _op_refused({k: v for k, v in GEMM.items() if k != key}, rf"missing '{key}'")


def test_unknown_backend() -> None:
    err = _op_refused({**GEMM, "backends": ["cudnn", "cublas"]}, r"unknown backend 'cublas'")
    assert "cublaslt" in err.message  # the known ones are listed
    _op_refused({**GEMM, "op": "mm_fp8", "backends": ["cutlass"]}, r"for mm_fp8")


@pytest.mark.parametrize(
    "value", [0, -1, True, False, 2048.0, "2048", MAX_DIM + 1, 1 << 40, None, [2048]]
)
def test_bad_dims(value: Any) -> None:
    _op_refused({**MOE, "hidden_size": value}, r"hidden_size = .*expected a whole number from 1")
    _op_refused({**GEMM, "n": value}, r"op 2 \(mm_bf16\): n = .*expected a whole number")


def test_largest_dim_accepted() -> None:
    op = _one(**{**GEMM, "n": MAX_DIM})
    assert isinstance(op, GemmOp)
    assert op.n == MAX_DIM


@pytest.mark.parametrize("key", ["tp_size", "ep_size", "batch"])
def test_bad_sizes(key: str) -> None:
    base = {**GEMM, "op": "bmm_fp8", "n": 16, "k": 16} if key == "batch" else MOE
    _op_refused({**base, key: 0}, rf"{key} = 0: expected a whole number from 1")
    _op_refused({**base, key: 1.5}, rf"{key} = 1.5")


def test_bad_ranks() -> None:
    _op_refused({**MOE, "tp_rank": -1}, r"tp_rank = -1: expected a whole number from 0")
    _op_refused({**MOE, "ep_rank": True}, r"ep_rank = True")
    _op_refused({**MOE, "tp_size": 2, "tp_rank": 2}, r"tp_rank/ep_rank \(2/0\) must be below")
    _op_refused(
        {**MOE, "ep_size": 4, "ep_rank": 4}, r"\(0/4\) must be below tp_size/ep_size \(1/4\)"
    )


def test_top_k_more_than_experts() -> None:
    _op_refused({**MOE, "top_k": 129}, r"top_k = 129 is more than num_experts = 128")
    assert isinstance(_one(**{**MOE, "top_k": 128}), MoeOp)


def test_experts_must_split_over_ep() -> None:
    _op_refused({**MOE, "ep_size": 3}, r"num_experts = 128 does not split over ep_size = 3")


def test_intermediate_must_split_over_tp() -> None:
    _op_refused({**MOE, "tp_size": 5}, r"intermediate_size = 768 does not split over tp_size = 5")


def test_tune_max_num_tokens() -> None:
    _op_refused(
        {**MOE, "tune_max_num_tokens": 512},
        r"tune_max_num_tokens = 512 is below the largest token count 1024",
    )
    _op_refused({**MOE, "tune_max_num_tokens": 0}, r"tune_max_num_tokens = 0")
    op = _one(**{**MOE, "tune_max_num_tokens": 1024})
    assert isinstance(op, MoeOp)
    assert op.max_tokens == 1024


@pytest.mark.parametrize("name", ["bmm_fp8", "mm_fp8"])
def test_fp8_n_and_k_multiple_of_16(name: str) -> None:
    _op_refused({"op": name, "n": 24, "k": 128}, rf"op 2 \({name}\): n = 24: FP8 GEMMs need a mul")
    _op_refused({"op": name, "n": 16, "k": 8}, r"k = 8: FP8 GEMMs need a multiple of 16")


def test_mm_fp8_k_multiple_of_128() -> None:
    _op_refused({"op": "mm_fp8", "n": 16, "k": 144}, r"k = 144: .*multiple of 128")
    assert isinstance(_one(op="bmm_fp8", n=16, k=144), GemmOp)  # bmm_fp8 only needs 16


def test_mm_bf16_has_no_alignment_rule() -> None:
    assert isinstance(_one(op="mm_bf16", n=7, k=9), GemmOp)


@pytest.mark.parametrize(
    ("finalize", "match"),
    [
        (["both"], r"finalize 'both': expected fused or unfused"),
        ([], r"finalize = \[\]: expected a non-empty list of strings"),
        ([1], r"finalize = \[1\]"),
        (True, r"finalize = True"),
    ],
)
def test_bad_finalize(finalize: Any, match: str) -> None:
    _op_refused({**MOE, "finalize": finalize}, match)


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4", "bfloat16", "int4"])
def test_quantised_or_unknown_dtype(dtype: str) -> None:
    _op_refused({**MOE, "dtype": dtype}, rf"dtype '{dtype}': fi-cache tunes cutlass_fused_moe for")


def test_non_string_dtype() -> None:
    _op_refused({**MOE, "dtype": 16}, r"dtype = 16: expected a string")


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        ([], r"expected a non-empty list of token counts"),
        ("16", r"expected a non-empty list of token counts"),
        ([0], r"0 is not a token count from 1"),
        ([16, True], r"True is not a token count"),
        ([1.5], r"1.5 is not a token count"),
        ([MAX_TOKENS + 1], rf"{MAX_TOKENS + 1} is not a token count"),
    ],
)
def test_bad_tokens(tokens: Any, match: str) -> None:
    err = _refused({"tokens": tokens, "ops": [GEMM]}, r"^.*tokens: " + match)
    assert err.message.startswith("tokens: ")
    err = _op_refused({**MOE, "tokens": tokens}, match)
    assert err.message.startswith("op 2 (cutlass_fused_moe): tokens: ")


def test_invalid_toml() -> None:
    err = _refused('[[ops]]\nop = "mm_bf16\n', r"not valid TOML")
    assert "line" in err.message


def test_an_integer_too_long_to_read_is_refused_in_one_line() -> None:
    err = _refused("x = " + "9" * 5000, r"not a plan: Exceeds the limit \(4300 digits\)")
    assert "\n" not in err.message and "set_int_max_str_digits" not in err.message


def test_no_ops() -> None:
    _refused("tokens = [1]\n", r"no operations: add at least one \[\[ops\]\] table")
    _refused("", r"no operations")
    _refused({"ops": []}, r"no operations")
    _refused({"ops": {"op": "mm_bf16"}}, r"no operations")


def test_unknown_top_level_key() -> None:
    _refused(
        "token = [1]\n[[ops]]\nop = 'mm_bf16'\nn = 1\nk = 1\n", r"unknown top-level key 'token'"
    )


def test_first_problem_wins_and_names_its_op() -> None:
    err = _refused({"ops": [GEMM, MOE, {**MOE, "top_k": 0}, {"op": "nope"}]}, r"op 3 ")
    assert "top_k = 0" in err.message


def test_default_source() -> None:
    with pytest.raises(PlanError) as exc:
        loads("")
    assert str(exc.value).startswith("<plan>: ")


def test_plan_is_frozen() -> None:
    p = Plan((_one(**GEMM),))
    with pytest.raises(AttributeError):
        p.source = "x"  # type: ignore[misc]


def test_moe_ops_with_different_maxima_are_refused() -> None:
    """FlashInfer keeps one MoE bucket list per process (refine_tuning_config is cached per
    value): the first op would be tuned with the second op's buckets."""
    big = {**MOE, "tokens": [1, 4096]}
    small = {**MOE, "tokens": [1, 16]}
    _refused({"ops": [big, small]}, r"one tune_max_num_tokens .* not \[16, 4096\]")
    assert len(from_mapping({"ops": [big, {**small, "tune_max_num_tokens": 4096}]}).ops) == 2


def test_hostile_op_names_and_nesting_stay_one_line() -> None:
    err = _op_refused({"op": "x\n[[ops]]", "n": 1, "k": 1}, r"op 2: unknown op 'x\\n\[\[ops\]\]'")
    assert "\n" not in str(err)
    deep = "a = " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(PlanError, match=r"x\.toml: ") as exc:
        loads(deep, "x.toml")
    assert "\n" not in str(exc.value)
