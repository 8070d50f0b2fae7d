"""The cutlass_fused_moe part of a tuning plan, derived from a Hugging Face model `config.json`.

Pure: reads one JSON file, never imports torch, transformers or FlashInfer, never prints. Every
problem is a PlanError (exit 2) naming the config field at fault.

The fields are the transformers conventions, as vLLM reads them for its fused MoE layer:

    hidden_size                                   the model width
    moe_intermediate_size, else intermediate_size one expert's width (Qwen2/3-MoE, DeepSeek:
                                                  `intermediate_size` is the DENSE MLP there)
    num_local_experts | num_experts | n_routed_experts
                                                  routed experts: Mixtral, Llama 4 | Qwen | DeepSeek
    num_experts_per_tok                           top-k
    dtype, else torch_dtype                       bfloat16 -> bf16, float16 -> fp16

Multimodal models (Llama 4, Qwen3-VL-MoE) keep these under `text_config`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fi_cache.engines.flashinfer.plan import DEFAULT_TOKENS, MOE_OP, Plan, PlanError, from_mapping
from fi_cache.errors import Refused, read_regular
from fi_cache.ranks import MAX_RANKS  # one op per (tp_rank, ep_rank): a ~1 MB plan at most
from fi_cache.versions import MOE_DTYPES

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; anything this big is the wrong file
# Routed-expert count, first present wins. Shared experts (n_shared_experts,
# shared_expert_intermediate_size) are a separate dense MLP in vLLM, not part of the fused MoE.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_FIELD = "num_experts_per_tok"
MOE_FIELDS = (*EXPERT_FIELDS, TOP_K_FIELD, "moe_intermediate_size")
DTYPE_FIELDS = ("dtype", "torch_dtype")  # transformers >= 4.56 writes `dtype`
HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
GATED_ACT = "silu"  # SwiGLU experts: the activation cutlass_fused_moe's Swiglu runs
DEFAULT_FINALIZE: tuple[str, ...] = ("fused", "unfused")


def load_config(path: Path) -> dict[str, Any]:
    """A model's config.json as a dict; `path` is the file or the model directory holding it."""
    path = Path(path)
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise PlanError(f"no {CONFIG_FILE} in this directory (not a model directory)", path)
        path = path / CONFIG_FILE
    try:  # a FIFO or /dev/zero is refused, never waited on or read whole
        raw = read_regular(path, CONFIG_FILE, MAX_CONFIG_BYTES)
    except Refused as exc:
        raise PlanError(exc.message, path) from None  # the one error type of plans
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PlanError(f"not UTF-8 text: not a {CONFIG_FILE}", path) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    except RecursionError:
        raise PlanError("not valid JSON (nested too deeply)", path) from None
    if not isinstance(data, dict):
        raise PlanError(
            f"not a JSON object (a {_json_kind(data)}): a {CONFIG_FILE} is one {{...}}", path
        )
    return data


# Fields (or model types) whose experts are not FlashInfer's plain SwiGLU without biases.
_UNLIKE_PLAIN_SWIGLU = {
    "moe_latent_size": "experts run in a latent width (Nemotron-H), not hidden_size",
    "gpt_oss": "gpt-oss experts have biases and a clamped SwiGLU; their keys differ",
}


def moe_table(
    config: Mapping[str, Any],
    source: str,
    *,
    dtype: str | None = None,
    finalize: tuple[str, ...] = DEFAULT_FINALIZE,
    tp_size: int = 1,
    ep_size: int = 1,
) -> dict[str, Any]:
    """One [[ops]] table for the model's fused MoE layer, as plan.parse_op reads it.

    Shapes are the whole model's (plan.py divides by tp_size / ep_size and checks they split).
    """
    fields, prefix = _text_fields(config)
    present = next((k for k in EXPERT_FIELDS if fields.get(k) is not None), None)
    if present is None:
        raise PlanError(
            f"no MoE fields ({', '.join(EXPERT_FIELDS[:-1])} or {EXPERT_FIELDS[-1]}): "
            f"a dense model has no {MOE_OP} to tune",
            source,
        )
    for key in ("hidden_act", "mlp_hidden_act"):  # Nemotron-H names its expert activation so
        act = fields.get(key)
        if act is not None and act != GATED_ACT:
            raise PlanError(
                f"{prefix}{key} = {act!r}: fi-cache tunes {MOE_OP} with SwiGLU experts "
                f"({key} = {GATED_ACT!r}) only",
                source,
            )
    for key, why in _UNLIKE_PLAIN_SWIGLU.items():
        if fields.get(key) is not None or config.get("model_type") == key:
            raise PlanError(f"{prefix}{key}: {why}; fi-cache cannot plan this MoE yet", source)
    # Quantised weights are refused even with --dtype: an FP8/NVFP4 engine never calls the bf16
    # kernel, and FlashInfer 0.6.17 keys both alike (no dtype in the key): bf16 tactic ids would
    # be replayed by the quantised runner.
    _refuse_quantised(config, fields, prefix, source)
    if dtype is None:
        moe_dtype = _config_dtype(config, fields, prefix, source)
    elif dtype in MOE_DTYPES:
        moe_dtype = dtype
    else:
        raise PlanError(
            f"dtype {dtype!r}: fi-cache tunes {MOE_OP} in {' or '.join(MOE_DTYPES)}", source
        )
    hidden = _dim(fields, "hidden_size", prefix, source)
    if fields.get("moe_intermediate_size") is not None:
        inter = _dim(fields, "moe_intermediate_size", prefix, source)
    elif fields.get("intermediate_size") is not None:
        inter = _dim(fields, "intermediate_size", prefix, source)
    else:
        raise PlanError(
            f"missing {prefix}moe_intermediate_size (or {prefix}intermediate_size): "
            "the per-expert width",
            source,
        )
    table: dict[str, Any] = {
        "op": MOE_OP,
        "dtype": moe_dtype,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_experts": _dim(fields, present, prefix, source),
        "top_k": _dim(fields, TOP_K_FIELD, prefix, source),
        "finalize": list(finalize),
    }
    if tp_size != 1:
        table["tp_size"] = tp_size
    if ep_size != 1:
        table["ep_size"] = ep_size
    return table


def rank_tables(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One table per (tp_rank, ep_rank): FlashInfer 0.6.18 - 0.7.3 put both ranks in MoE keys
    (versions.MOE_KEY_HAS_RANKS), so each rank of a sharded model looks up keys of its own."""
    tp, ep = int(table.get("tp_size", 1)), int(table.get("ep_size", 1))
    out = []
    for tp_rank in range(tp):
        for ep_rank in range(ep):
            t = dict(table)
            if tp > 1:
                t["tp_rank"] = tp_rank
            if ep > 1:
                t["ep_rank"] = ep_rank
            out.append(t)
    return out


def plan_from_config(
    config: Mapping[str, Any],
    source: str,
    *,
    tokens: tuple[int, ...] = DEFAULT_TOKENS,
    dtype: str | None = None,
    finalize: tuple[str, ...] = DEFAULT_FINALIZE,
    tp_size: int = 1,
    ep_size: int = 1,
) -> Plan:
    """A one-op plan for the model's fused MoE layer; plan.py does every shape check."""
    table = moe_table(
        config, source, dtype=dtype, finalize=finalize, tp_size=tp_size, ep_size=ep_size
    )
    # One op is checked (sizes, splits) before there is one per rank: 10^6 x 1000 ranks never are.
    from_mapping({"tokens": list(tokens), "ops": [table]}, source)
    if tp_size * ep_size > MAX_RANKS:
        raise PlanError(
            f"tp_size x ep_size = {tp_size * ep_size} ranks, over the {MAX_RANKS} a plan covers "
            "(one op per rank)",
            source,
        )
    return from_mapping({"tokens": list(tokens), "ops": rank_tables(table)}, source)


def describe(config: Mapping[str, Any]) -> str:
    """Short provenance for a plan header: "qwen3_moe (Qwen3MoeForCausalLM)"."""
    model_type = config.get("model_type")
    archs = config.get("architectures")
    name = _one_line(model_type) if isinstance(model_type, str) else ""
    arch = ""
    if isinstance(archs, list):
        arch = ", ".join(_one_line(a) for a in archs if isinstance(a, str))
    elif isinstance(archs, str):
        arch = _one_line(archs)
    if name and arch:
        return f"{name} ({arch})"
    return name or arch or "unknown model"


# --- helpers ------------------------------------------------------------------------------------


def _text_fields(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """Where the MoE fields live: the top level, or `text_config` of a multimodal model."""
    text = config.get("text_config")
    if not any(k in config for k in MOE_FIELDS) and isinstance(text, Mapping):
        return text, "text_config."
    return config, ""


def _refuse_quantised(
    config: Mapping[str, Any], fields: Mapping[str, Any], prefix: str, source: str
) -> None:
    where, quant = prefix, fields.get("quantization_config")
    if quant is None:
        where, quant = "", config.get("quantization_config")
    if quant is None:
        return
    details = ""
    if isinstance(quant, Mapping):
        method = quant.get("quant_method")
        details = f"quant_method = {method!r}" if method is not None else "no quant_method"
        if quant.get("weight_block_size") is not None:
            details += f", weight_block_size = {quant['weight_block_size']!r}"
        details = f" ({details})"
    raise PlanError(
        f"{where}quantization_config: the model's MoE weights are quantised{details}; "
        f"fi-cache tunes unquantised {MOE_OP} only (the quantised kernels need their scales)",
        source,
    )


def _config_dtype(
    config: Mapping[str, Any], fields: Mapping[str, Any], prefix: str, source: str
) -> str:
    levels = [(fields, prefix), (config, "")] if fields is not config else [(config, "")]
    for level, where in levels:
        for key in DTYPE_FIELDS:
            value = level.get(key)
            if value is None:
                continue
            if isinstance(value, str) and value in HF_DTYPES:
                return HF_DTYPES[value]
            raise PlanError(
                f"{where}{key} = {value!r}: fi-cache tunes {MOE_OP} in bfloat16 or float16; "
                "pass --dtype bf16 or --dtype fp16 to choose one",
                source,
            )
    raise PlanError(
        f"no {' or '.join(DTYPE_FIELDS)}: pass --dtype bf16 or --dtype fp16 to choose one", source
    )


def _dim(fields: Mapping[str, Any], key: str, prefix: str, source: str) -> int:
    value = fields.get(key)
    if value is None:
        raise PlanError(f"missing {prefix}{key}", source)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PlanError(f"{prefix}{key} = {value!r}: expected a positive whole number", source)
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null"


def _one_line(text: str, limit: int = 80) -> str:
    """Printable, single-line, bounded: the result lands in a TOML comment."""
    clean = "".join(c if c.isprintable() else " " for c in text).strip()
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"
