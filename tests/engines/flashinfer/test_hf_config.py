"""A tuning plan from a model's config.json: the shapes a user checks against the model card."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.flashinfer import plan
from fi_cache.engines.flashinfer.hf_config import describe, load_config, moe_table, plan_from_config
from fi_cache.engines.flashinfer.plan import DEFAULT_TOKENS, MoeOp, PlanError
from fi_cache.errors import EXIT_REFUSED
from tests.conftest import FIXTURES, no_hang

HF = FIXTURES / "hf"
MIXTRAL = HF / "mixtral-8x7b-v0.1.json"
QWEN3 = HF / "qwen3-30b-a3b.json"
DSV3 = HF / "deepseek-v3.json"
DSV2_LITE = HF / "deepseek-v2-lite.json"
LLAMA31 = HF / "llama-3.1-8b.json"


def _shape(op: Any) -> tuple[str, int, int, int, int]:
    assert isinstance(op, MoeOp)
    return (op.dtype, op.hidden_size, op.intermediate_size, op.num_experts, op.top_k)


def _one_op(path: Path, **kw: Any) -> MoeOp:
    p = plan_from_config(load_config(path), str(path), **kw)
    assert len(p.ops) == 1
    op = p.ops[0]
    assert isinstance(op, MoeOp)
    return op


def _llama4() -> dict[str, Any]:
    """Llama-4-Scout-like: every text field under text_config, vision elsewhere."""
    return {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_act": "silu",
            "hidden_size": 5120,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "num_hidden_layers": 48,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {"hidden_size": 1408, "intermediate_size": 5632, "model_type": "llama4"},
    }


# --- real configs -------------------------------------------------------------------------------


def test_qwen3_30b_a3b_uses_the_expert_width_not_the_dense_one() -> None:
    op = _one_op(QWEN3)
    assert _shape(op) == ("bf16", 2048, 768, 128, 8)
    assert op.intermediate_size != 6144  # the config's dense `intermediate_size`
    assert op.finalize == ("fused", "unfused")
    assert op.tokens == DEFAULT_TOKENS
    assert (op.tp_size, op.ep_size) == (1, 1)


def test_mixtral_intermediate_size_is_the_expert_width() -> None:
    assert _shape(_one_op(MIXTRAL)) == ("bf16", 4096, 14336, 8, 2)


def test_deepseek_v2_lite_ignores_shared_experts() -> None:
    op = _one_op(DSV2_LITE)
    assert _shape(op) == ("bf16", 2048, 1408, 64, 6)  # not 64 + 2 experts, not 10944


def test_deepseek_v3_fp8_is_refused() -> None:
    config = load_config(DSV3)
    with pytest.raises(PlanError, match=r"quantised.*'fp8'.*\[128, 128\].*unquantised") as exc:
        plan_from_config(config, str(DSV3))
    assert exc.value.exit_code == EXIT_REFUSED
    assert str(exc.value).startswith(f"{DSV3}: quantization_config")
    assert "\n" not in str(exc.value)


def test_deepseek_v3_stays_refused_with_a_forced_dtype() -> None:
    """An FP8 engine never calls the bf16 kernel, and FlashInfer 0.6.17's MoE keys carry no
    dtype: bf16 tactic ids in its cache would be replayed by the FP8 runner."""
    for dtype in ("bf16", "fp16"):
        with pytest.raises(PlanError, match=r"quantised"):
            plan_from_config(load_config(DSV3), str(DSV3), dtype=dtype)


def test_models_whose_experts_are_not_plain_swiglu_are_refused() -> None:
    base = load_config(MIXTRAL)
    with pytest.raises(PlanError, match=r"mlp_hidden_act = 'relu2'"):
        plan_from_config({**base, "mlp_hidden_act": "relu2"}, "nemotron-h.json")
    with pytest.raises(PlanError, match=r"moe_latent_size: experts run in a latent width"):
        plan_from_config({**base, "moe_latent_size": 1024}, "nemotron-h.json")
    with pytest.raises(PlanError, match=r"gpt_oss: gpt-oss experts have biases"):
        plan_from_config({**base, "model_type": "gpt_oss"}, "gpt-oss.json")


def test_a_sharded_model_gets_one_op_per_rank() -> None:
    """FlashInfer 0.6.18 - 0.7.3 keys MoE entries by tp_rank and ep_rank."""
    p = plan_from_config(load_config(MIXTRAL), str(MIXTRAL), tp_size=2, ep_size=2)
    ranks = [(op.tp_rank, op.ep_rank) for op in p.ops]  # type: ignore[union-attr]
    assert ranks == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(op.tp_size, op.ep_size) for op in p.ops} == {(2, 2)}  # type: ignore[union-attr]


def test_dense_llama_is_refused() -> None:
    with pytest.raises(PlanError, match=r"no MoE fields .*num_local_experts.*dense model") as exc:
        plan_from_config(load_config(LLAMA31), str(LLAMA31))
    assert exc.value.path == str(LLAMA31)


def test_text_config_nesting_llama4() -> None:
    p = plan_from_config(_llama4(), "llama4/config.json")
    assert _shape(p.ops[0]) == ("bf16", 5120, 8192, 16, 1)


def test_text_config_dtype_falls_back_to_the_top_level() -> None:
    config = _llama4()
    del config["text_config"]["torch_dtype"]
    config["torch_dtype"] = "float16"
    assert _shape(plan_from_config(config, "x").ops[0])[0] == "fp16"


def test_text_config_field_errors_name_the_nested_field() -> None:
    config = _llama4()
    del config["text_config"]["hidden_size"]
    with pytest.raises(PlanError, match=r"missing text_config\.hidden_size"):
        moe_table(config, "x")


def test_top_level_moe_fields_win_over_text_config() -> None:
    config = json.loads(QWEN3.read_text())
    config["text_config"] = {"num_experts": 4, "num_experts_per_tok": 1, "hidden_size": 8}
    assert moe_table(config, "x")["num_experts"] == 128


def test_describe() -> None:
    assert describe(load_config(QWEN3)) == "qwen3_moe (Qwen3MoeForCausalLM)"
    assert describe(load_config(MIXTRAL)) == "mixtral (MixtralForCausalLM)"
    assert describe(_llama4()) == "llama4 (Llama4ForConditionalGeneration)"
    assert describe({"model_type": "x"}) == "x"
    assert describe({"architectures": ["A", "B"]}) == "A, B"
    assert describe({}) == "unknown model"
    # It goes into a TOML comment: one line, whatever the file holds.
    assert "\n" not in describe({"model_type": "evil\n[[ops]]", "architectures": ["A\rB"]})


# --- the table and the plan ---------------------------------------------------------------------


def test_moe_table_is_what_plan_py_reads() -> None:
    table = moe_table(load_config(QWEN3), str(QWEN3))
    assert table == {
        "op": "cutlass_fused_moe",
        "dtype": "bf16",
        "hidden_size": 2048,
        "intermediate_size": 768,
        "num_experts": 128,
        "top_k": 8,
        "finalize": ["fused", "unfused"],
    }
    split = moe_table(load_config(QWEN3), str(QWEN3), tp_size=2, ep_size=4, finalize=("fused",))
    assert (split["tp_size"], split["ep_size"], split["finalize"]) == (2, 4, ["fused"])


def test_tp_ep_split_errors_come_from_plan_py() -> None:
    config = load_config(MIXTRAL)
    with pytest.raises(PlanError, match=r"num_experts = 8 does not split over ep_size = 3"):
        plan_from_config(config, str(MIXTRAL), ep_size=3)
    with pytest.raises(PlanError, match=r"intermediate_size = 768 does not split over tp_size = 5"):
        plan_from_config(load_config(QWEN3), str(QWEN3), tp_size=5)
    ops = plan_from_config(config, str(MIXTRAL), tp_size=2, ep_size=4).ops
    assert {(op.local_intermediate, op.local_experts) for op in ops} == {(7168, 2)}  # type: ignore[union-attr]


def test_bad_finalize_and_tokens_come_from_plan_py() -> None:
    config = load_config(QWEN3)
    with pytest.raises(PlanError, match=r"finalize 'both'"):
        plan_from_config(config, "x", finalize=("both",))
    with pytest.raises(PlanError, match=r"tokens: expected a non-empty list"):
        plan_from_config(config, "x", tokens=())


def test_written_plan_reads_back_to_the_same_ops() -> None:
    p = plan_from_config(load_config(QWEN3), str(QWEN3), tokens=(1024, 8, 8, 64), ep_size=2)
    text = plan.dumps(p, header=[f"from {describe(load_config(QWEN3))}"])
    assert text.startswith("# from qwen3_moe (Qwen3MoeForCausalLM)\n")
    back = plan.loads(text, "plan.toml")
    assert back.ops == p.ops
    assert back.ops[0].tokens == (8, 64, 1024)


def test_forced_dtype_must_be_unquantised() -> None:
    with pytest.raises(PlanError, match=r"dtype 'fp8'"):
        moe_table(load_config(QWEN3), "x", dtype="fp8")


# --- config field rules -------------------------------------------------------------------------


def _qwen3(**changes: Any) -> dict[str, Any]:
    config = json.loads(QWEN3.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"hidden_size": None}, r"missing hidden_size"),
        ({"num_experts_per_tok": None}, r"missing num_experts_per_tok"),
        (
            {"moe_intermediate_size": None, "intermediate_size": None},
            r"missing moe_intermediate_size \(or intermediate_size\)",
        ),
        ({"hidden_size": "2048"}, r"hidden_size = '2048': expected a positive whole number"),
        ({"num_experts": 0}, r"num_experts = 0"),
        ({"num_experts_per_tok": True}, r"num_experts_per_tok = True"),
        ({"moe_intermediate_size": 768.0}, r"moe_intermediate_size = 768.0"),
        ({"hidden_act": "gelu"}, r"hidden_act = 'gelu'.*SwiGLU"),
        ({"torch_dtype": "float32"}, r"torch_dtype = 'float32'.*--dtype bf16"),
        ({"torch_dtype": None}, r"no dtype or torch_dtype: pass --dtype"),
        ({"torch_dtype": None, "dtype": "float8_e4m3fn"}, r"dtype = 'float8_e4m3fn'"),
        ({"num_experts_per_tok": 129}, r"top_k = 129 is more than"),
    ],
)
def test_config_field_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(PlanError, match=match) as exc:
        plan_from_config(_qwen3(**changes), "m/config.json")
    assert str(exc.value).startswith("m/config.json: ")


def test_moe_intermediate_wins_over_intermediate_even_when_it_is_first_absent() -> None:
    # Without moe_intermediate_size the (Mixtral-style) intermediate_size is the expert width.
    assert moe_table(_qwen3(moe_intermediate_size=None), "x")["intermediate_size"] == 6144


def test_newer_transformers_dtype_field_wins() -> None:
    config = _qwen3(dtype="float16")  # transformers >= 4.56 writes `dtype`; keep both here
    assert moe_table(config, "x")["dtype"] == "fp16"


def test_expert_fields_in_order_of_precedence() -> None:
    base = _qwen3(num_experts=None)
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        assert moe_table({**base, key: 64}, "x")["num_experts"] == 64
    both = {**base, "num_local_experts": 16, "n_routed_experts": 64}
    assert moe_table(both, "x")["num_experts"] == 16


def test_a_null_expert_field_counts_as_absent() -> None:
    with pytest.raises(PlanError, match=r"no MoE fields"):
        moe_table(_qwen3(num_experts=None) | {"num_local_experts": None}, "x")


@pytest.mark.parametrize(
    ("quant", "match"),
    [
        ({"quant_method": "compressed-tensors", "format": "float-quantized"}, r"'compressed-te"),
        ({"quant_method": "mxfp4"}, r"quant_method = 'mxfp4'\)"),
        ({"quant_method": "awq", "bits": 4}, r"'awq'"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, r"'modelopt'"),
        ({"bits": 4}, r"\(no quant_method\)"),
    ],
)
def test_any_quantization_config_is_refused_even_with_a_dtype(
    quant: dict[str, Any], match: str
) -> None:
    config = _qwen3(quantization_config=quant)
    for dtype in (None, "bf16"):
        with pytest.raises(PlanError, match=match):
            moe_table(config, "x", dtype=dtype)


def test_quantization_config_under_text_config_is_refused_too() -> None:
    config = _llama4()
    config["quantization_config"] = {"quant_method": "fbgemm_fp8"}
    with pytest.raises(PlanError, match=r"^x: quantization_config.*'fbgemm_fp8'"):
        moe_table(config, "x")
    config = _llama4()
    config["text_config"]["quantization_config"] = {"quant_method": "fp8"}
    with pytest.raises(PlanError, match=r"^x: text_config\.quantization_config"):
        moe_table(config, "x")


# --- load_config ---------------------------------------------------------------------------------


def test_load_config_file_and_model_directory(tmp_path: Path) -> None:
    assert load_config(QWEN3)["num_experts"] == 128
    model = tmp_path / "Qwen3-30B-A3B"
    model.mkdir()
    (model / "config.json").write_bytes(QWEN3.read_bytes())
    assert load_config(model) == load_config(QWEN3)


def test_load_config_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(PlanError, match=r"no such file") as exc:
        load_config(missing)
    assert exc.value.path == str(missing)
    assert exc.value.exit_code == EXIT_REFUSED


def test_load_config_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"no config\.json in this directory") as exc:
        load_config(tmp_path)
    assert exc.value.path == str(tmp_path)


def test_load_config_invalid_json(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 2048,\n}')
    with pytest.raises(PlanError, match=r"not valid JSON \(line 2") as exc:
        load_config(bad)
    assert str(exc.value).startswith(f"{bad}: ")
    assert "\n" not in str(exc.value)


def test_load_config_json_array(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(PlanError, match=r"not a JSON object \(a list\)") as exc:
        load_config(bad)
    assert exc.value.path == str(bad)


def test_load_config_not_text(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x80\x81\xff" * 10)
    with pytest.raises(PlanError, match=r"not UTF-8"):
        load_config(bad)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_load_config_unreadable(tmp_path: Path) -> None:
    locked = tmp_path / "config.json"
    locked.write_text("{}")
    locked.chmod(0)
    try:
        with pytest.raises(PlanError, match=r"permission denied"):
            load_config(locked)
    finally:
        locked.chmod(0o600)


def test_absurd_tp_and_ep_sizes_are_refused_at_once() -> None:
    """10^6 x 1000 ranks were 10^9 op tables built before any was checked (minutes, gigabytes)."""
    config = load_config(QWEN3)
    with no_hang(1.0), pytest.raises(PlanError, match=r"does not split over ep_size = 1000"):
        plan_from_config(config, str(QWEN3), tp_size=10**6, ep_size=1000)
    with no_hang(1.0), pytest.raises(PlanError, match=r"8192 ranks, over the 4096 a plan covers"):
        plan_from_config(config, str(QWEN3), tp_size=64, ep_size=128)
    largest = plan_from_config(config, str(QWEN3), tp_size=32, ep_size=128)
    text = plan.dumps(largest)
    assert len(largest.ops) == 4096 and len(text.encode()) <= plan.MAX_PLAN_BYTES
    assert len(plan.loads(text, "plan.toml").ops) == 4096  # what it writes, `plan --check` reads
