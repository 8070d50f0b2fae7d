"""The EP size, a2a backend and DP attention SGLang sets after parsing, as fi-cache reads them
(args.resolve_moe, models.for_model), against SGLang's own passes and model overrides from its
wheels (wheel_overrides.py): the key dir hashes EP and attention DP, the rank names follow DP."""

from __future__ import annotations

from typing import Any

import pytest

from fi_cache.engines.sglang import keydir, models
from fi_cache.engines.sglang.args import parse_sglang_args
from fi_cache.engines.sglang.layout import rank_layout
from tests.engines.sglang.wheel_overrides import a2a_passes, attention_dp, model_override

M = ["--model-path", "m"]
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}
DEEPSEEK_V32 = {**DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048}
M3_NVFP4 = {
    "architectures": ["MiniMaxM3SparseForCausalLM"],
    "quantization_config": {
        "quant_method": "mxfp8",
        "moe_quant_algo": "NVFP4",
        "moe_quant_format": "nvfp4-pack-quantized",
    },
}


def _fields(argv: list[str]) -> dict[str, Any]:
    """The argument fields SGLang's parser gives for `argv` (the few these passes read)."""
    a = parse_sglang_args([*M, *argv])
    runner, a2a = a.moe_given
    return {
        "tp_size": a.tp,
        "ep_size": a.ep_given,
        "dp_size": a.dp,
        "attn_dp_size": a.attn_dp,
        "moe_a2a_backend": a2a,
        "moe_runner_backend": runner or "auto",
        "enable_waterfill": a.waterfill,
        "enable_prefill_cp": a.prefill_cp,
        "cp_strategy": a.cp_strategy,
        "quantization": a.quantization,
    }


@pytest.mark.parametrize("version", ["0.5.17", "0.5.18", "0.5.21", "0.5.23"])
@pytest.mark.parametrize(
    "argv",
    [
        ["--tp-size", "4", "--enable-waterfill"],
        ["--tp-size", "4", "--ep-size", "2", "--enable-waterfill", "--moe-a2a-backend", "mooncake"],
        ["--tp-size", "8", "--enable-waterfill", "--moe-a2a-backend", "deepep"],
        ["--tp-size", "4", "--ep-size", "2"],
        ["--tp-size", "4", "--moe-a2a-backend", "nixl"],
    ],
)
def test_waterfill_moves_the_a2a_to_deepep_and_ep_to_tp_as_sglang_does(
    version: str, argv: list[str]
) -> None:
    sglang = a2a_passes(version, _fields(argv))
    a = parse_sglang_args([*M, *argv])
    assert (a.a2a, a.ep) == (sglang["moe_a2a_backend"], sglang["ep_size"])


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
@pytest.mark.parametrize(
    ("config", "argv", "mla"),
    [
        (DEEPSEEK_V3, ["--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "zigzag"], True),
        (
            DEEPSEEK_V3,
            [
                "--tp-size",
                "8",
                "--dp-size",
                "2",
                "--enable-prefill-cp",
                "--cp-strategy",
                "interleave",
            ],
            True,
        ),
        (DEEPSEEK_V32, ["--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "zigzag"], True),
        (
            DEEPSEEK_V32,
            ["--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "interleave"],
            True,
        ),
        (DEEPSEEK_V3, ["--tp-size", "8", "--ep-size", "2"], True),
        (
            {"architectures": ["PixtralForConditionalGeneration"]},
            ["--tp-size", "4", "--enable-prefill-cp", "--cp-strategy", "zigzag"],
            False,
        ),
    ],
)
def test_deepseek_prefill_cp_sets_the_layout_sglangs_override_sets(
    version: str, config: dict[str, Any], argv: list[str], mla: bool
) -> None:
    sglang = model_override(version, config, _fields(argv), mla=mla)
    a, note = models.for_model(parse_sglang_args([*M, *argv]), config, version, False)
    assert note is None
    assert (a.a2a, a.ep) == (sglang["moe_a2a_backend"], sglang["ep_size"])
    assert keydir.sizes(a)["attn_dp"] == attention_dp(sglang)
    replicas = 1 if attention_dp(sglang) > 1 else sglang["dp_size"]
    assert len(rank_layout(a).ranks) == replicas * sglang["tp_size"]


@pytest.mark.parametrize(
    ("blackwell", "argv"),
    [
        (True, []),
        (True, ["--moe-runner-backend", "flashinfer_cutlass"]),
        (True, ["--moe-runner-backend", "flashinfer_trtllm_routed"]),
        (False, []),
        (False, ["--moe-runner-backend", "flashinfer_cutlass"]),
    ],
)
def test_minimax_m3_nvfp4_moves_to_megamoe_on_blackwell_as_sglang_does(
    blackwell: bool, argv: list[str]
) -> None:
    full = ["--tp-size", "4", *argv]
    sglang = model_override("0.5.23", M3_NVFP4, _fields(full), blackwell=blackwell)
    a, _ = models.for_model(parse_sglang_args([*M, *full]), M3_NVFP4, "0.5.23", blackwell)
    assert (a.a2a, a.ep, a.quantization) == (
        sglang["moe_a2a_backend"],
        sglang["ep_size"],
        sglang["quantization"],
    )
    assert (a.moe_backend or "auto") == sglang["moe_runner_backend"]


def test_what_the_host_cannot_tell_is_said_not_guessed() -> None:
    cp = parse_sglang_args([*M, "--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "zigzag"])
    same, why = models.for_model(cp, None, "0.5.23", None)
    assert same == cp and "no config.json" in (why or "")
    m3 = parse_sglang_args([*M, "--tp-size", "4", "--moe-runner-backend", "flashinfer_cutlass"])
    kept, why = models.for_model(m3, M3_NVFP4, "0.5.23", None)
    assert kept.ep == 1 and "GPU family is not known" in (why or "")
    assert models.blackwell(["10.0"], "12.8") and not models.blackwell(["10.0"], "12.6")
    assert models.blackwell(["9.0", "10.0"], "12.8") is None
    assert models.blackwell([], "13.0") is None


def test_0_5_17s_megamoe_variable_spans_ep_as_its_a2a_pass_does() -> None:
    argv = ["--tp-size", "4", "--ep-size", "2"]
    sglang = a2a_passes("0.5.17", _fields(argv), SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE=True)
    a, _ = models.for_model(parse_sglang_args([*M, *argv]), None, "0.5.17", None, True)
    assert (a.a2a, a.ep) == (sglang["moe_a2a_backend"], sglang["ep_size"]) == ("megamoe", 4)
