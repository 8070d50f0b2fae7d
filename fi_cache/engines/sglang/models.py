"""What SGLang sets for a model after parsing its arguments, where that moves the MoE layout
(the a2a backend, the EP size, DP attention) and so the key dir and rank names: its model
overrides, read from the model's HF config.json (engines/hf.py), the way SGLang reads them
before its a2a passes (versions: SGLANG_DEEPSEEK_FAMILY, SGLANG_MINIMAX_M3).

Only the overrides that change what fi-cache predicts are here; an input SGLang reads that
fi-cache cannot (no config.json, the GPU family not detected) is said, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fi_cache.engines.sglang.args import SglangArgs, resolve_moe
from fi_cache.versions import (
    SGLANG_BLACKWELL,
    SGLANG_DEEPSEEK_FAMILY,
    SGLANG_DSA_ARCHS,
    SGLANG_MINIMAX_M3,
    SGLANG_MINIMAX_M3_ARCHS,
    SGLANG_MINIMAX_M3_NVFP4,
    parse_version,
)

Overrides = dict[str, Any]


def architecture(config: Mapping[str, Any] | None) -> str | None:
    """`architectures[0]`, the name SGLang's overrides are registered under."""
    archs = (config or {}).get("architectures")
    first = archs[0] if isinstance(archs, list) and archs else None
    return first if isinstance(first, str) else None


def blackwell(caps: Sequence[str], cuda: str | None) -> bool | None:
    """SGLang's is_blackwell for this host's GPUs ("10.0") and CUDA ("12.8"); None: unknown."""
    majors, least = SGLANG_BLACKWELL
    try:
        found = {int(c.split(".")[0]) for c in caps}
        cu = tuple(int(p) for p in (cuda or "").split(".")[:2])
    except ValueError:
        return None
    if len(found) != 1 or len(cu) != 2:
        return None  # none, or mixed GPUs: SGLang asks the one each rank runs on
    return found.pop() in majors and cu >= least


def _deepseek(args: SglangArgs, config: Mapping[str, Any], arch: str) -> Overrides:
    if not args.prefill_cp:
        return {}
    inner = config.get("text_config")
    text: Mapping[str, Any] = inner if isinstance(inner, dict) else config
    dsa = arch in SGLANG_DSA_ARCHS and config.get("index_topk") is not None
    mla = arch != "PixtralForConditionalGeneration" or text.get("kv_lora_rank") is not None
    out: Overrides = {"attn_dp": args.attn_dp * args.dp, "dp": 1}  # DP attention over the DP ranks
    if (dsa and args.cp_strategy == "zigzag") or (not dsa and mla):
        out.update(a2a="deepep", ep=args.tp)
    return out if dsa or mla else {}


def _minimax_m3(
    args: SglangArgs, config: Mapping[str, Any], on_blackwell: bool | None
) -> tuple[Overrides, str | None]:
    quant = args.quantization or _m3_quantization(config)
    if quant != SGLANG_MINIMAX_M3_NVFP4:
        return {}, None
    out: Overrides = {"quantization": quant}
    runner, a2a = args.moe_given
    auto = runner in (None, "auto")
    if on_blackwell is None:
        return out, (
            "MiniMax-M3 NVFP4: SGLang moves the MoE to megamoe (EP = TP) on Blackwell GPUs "
            "only, and this host's GPU family is not known: the EP size is taken as given"
        )
    if not on_blackwell:
        return {**out, **({"runner": "marlin"} if auto else {})}, None
    if runner == "flashinfer_trtllm_routed" or a2a not in ("none", "megamoe"):
        return out, None  # kept, or refused by SGLang itself
    return {**out, "a2a": "megamoe", **({"runner": "deep_gemm"} if auto else {})}, None


def _m3_quantization(config: Mapping[str, Any]) -> str | None:
    qc = config.get("quantization_config")
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if not isinstance(qc, dict) or method != "mxfp8":
        return method if isinstance(method, str) else None
    packed = str(qc.get("moe_quant_algo", "")).upper() == "NVFP4" and (
        qc.get("moe_quant_format") == "nvfp4-pack-quantized"
    )
    return SGLANG_MINIMAX_M3_NVFP4 if packed else method


def for_model(
    args: SglangArgs,
    config: Mapping[str, Any] | None,
    version: str | None,
    on_blackwell: bool | None,
    megamoe_env: bool = False,
) -> tuple[SglangArgs, str | None]:
    """`args` with what SGLang `version`'s overrides for this model set, and SGLang's a2a
    passes run again over them (`megamoe_env`: 0.5.17's SGLANG_MEGAMOE_ENV is on); a note
    when an input they read is not known here."""
    arch = architecture(config)
    if megamoe_env:
        args = _rerun(args, {}, megamoe_env)
    if config is None or arch is None:
        why = None
        if args.prefill_cp:
            why = (
                "--enable-prefill-cp: SGLang may move DeepSeek-family models to DP attention "
                "and deepep (EP = TP), and no config.json of the model is here to tell"
            )
        return args, why
    note = None
    if arch in SGLANG_DEEPSEEK_FAMILY:
        found = _deepseek(args, config, arch)
    elif arch in SGLANG_MINIMAX_M3_ARCHS and parse_version(version) in SGLANG_MINIMAX_M3:
        found, note = _minimax_m3(args, config, on_blackwell)
    else:
        return args, None
    return (_rerun(args, found, megamoe_env) if found else args), note


def _rerun(args: SglangArgs, found: Overrides, megamoe_env: bool) -> SglangArgs:
    """SGLang's a2a passes over the parsed values with the model's overrides on them."""
    runner, a2a = args.moe_given
    runner, a2a = found.get("runner", runner), found.get("a2a", a2a)
    ep = found.get("ep", args.ep_given)
    runner, a2a, ep = resolve_moe(runner, a2a, args.tp, ep, args.waterfill, megamoe_env)
    keep = {k: found[k] for k in ("attn_dp", "dp", "quantization") if k in found}
    return replace(args, moe_backend=runner, a2a=a2a, ep=ep, **keep)
