"""SGLang's own argument resolution for the MoE layout, read from its release wheels at test
time and run on CPU: the a2a passes `_a2a_backend_overrides` (waterfill -> deepep) and
`_a2a_ep_size` (arg_groups/overrides.py), the DeepSeek-family model override
`_deepseek_family_overrides` (model_overrides/deepseek_v2.py 0.5.21 / 0.5.23, with
`is_deepseek_dsa` from configs/model_config.py and `context_parallel_attn_dp_size` from
arg_groups/model_override_base.py) and MiniMax-M3's (model_overrides/minimax_m3.py 0.5.23, with
`get_quantization_config` from utils/common.py).

Stand-ins, because SGLang has no CPU build: the resolving view (a namespace of the fields these
read, SGLang's defaults otherwise), the platform (CUDA; Blackwell or not as asked),
`use_mla_backend` (ModelConfig's MLA list, given by the test) and the logger.
"""

from __future__ import annotations
import __future__

import ast
import logging
import sys
import types
from collections.abc import Iterable
from typing import Any

from tests.sglang_layout import restore_modules, sglang_module

_OVERRIDES = "sglang/srt/arg_groups/overrides.py"
_DEEPSEEK = "sglang/srt/arg_groups/model_overrides/deepseek_v2.py"
_MINIMAX = "sglang/srt/arg_groups/model_overrides/minimax_m3.py"
_BASE = "sglang/srt/arg_groups/model_override_base.py"
_MODEL_CONFIG = "sglang/srt/configs/model_config.py"
_COMMON = "sglang/srt/utils/common.py"
# SGLang's defaults for the fields the passes read (arg_groups/fields/*.py 0.5.23).
DEFAULTS: dict[str, Any] = {
    "tp_size": 1,
    "ep_size": 1,
    "dp_size": 1,
    "attn_dp_size": 1,
    "attn_cp_size": 1,
    "dcp_size": 1,
    "moe_a2a_backend": "none",
    "moe_runner_backend": "auto",
    "enable_waterfill": False,
    "enable_prefill_cp": False,
    "cp_strategy": None,
    "enable_dp_attention": False,
    "enable_hisparse": False,
    "enable_hierarchical_cache": False,
    "disaggregation_mode": "null",
    "speculative_eagle_topk": None,
    "speculative_algorithm": None,
    "attention_backend": None,
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "kv_cache_dtype": "auto",
    "page_size": None,
    "quantization": None,
    "moe_dense_tp_size": None,
    "fp8_gemm_runner_backend": "auto",
    "_quantization_explicitly_unset": False,
    "dsa_prefill_backend": None,
    "dsa_decode_backend": None,
    "dcp_replicate_q_proj": None,
    "dcp_comm_backend": None,
}


def _take(text: str, names: Iterable[str], glb: dict[str, Any], where: str) -> dict[str, Any]:
    """The top-level functions and assignments `names` of `text`, compiled into `glb`."""
    wanted = set(names)
    body = [
        n
        for n in ast.parse(text).body
        if (isinstance(n, ast.FunctionDef) and n.name in wanted)
        or (isinstance(n, ast.Assign) and {getattr(t, "id", "") for t in n.targets} & wanted)
    ]
    found = {n.name if isinstance(n, ast.FunctionDef) else n.targets[0].id for n in body}  # type: ignore[attr-defined]
    assert found == wanted, f"{where} lacks {wanted - found}"
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), where, "exec", flags), glb)
    return glb


class _Envs:
    """SGLang's `envs`: every variable unset (its default, False here) but those given."""

    def __init__(self, **on: bool) -> None:
        self.on = on

    def __getattr__(self, name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(get=lambda: self.on.get(name, False))


def _glb(**env: bool) -> dict[str, Any]:
    return {
        "Any": Any,
        "envs": _Envs(**env),
        "Dict": dict,
        "logger": logging.getLogger("sglang-standin"),
        "register_post_process": lambda fn: fn,
        "_register_for": lambda *archs: lambda fn: fn,
        "resolving_view": lambda sa: sa,
        "is_attention_backend_not_set": lambda c: c.attention_backend is None,
    }


def a2a_passes(version: str, fields: dict[str, Any], **env: bool) -> dict[str, Any]:
    """`fields` after `version`'s two a2a passes, in SGLang's order; `env`: variables set."""
    names = ("_A2A_EP_SPANNING_BACKENDS", "_a2a_backend_overrides", "_a2a_ep_size")
    text = sglang_module(version, _OVERRIDES)
    code = _take(text, names, _glb(**env), f"{version}:{_OVERRIDES}")
    view = types.SimpleNamespace(**{**DEFAULTS, **fields})
    for name in names[1:]:
        vars(view).update(code[name](view))
    return vars(view)


def _platform(blackwell: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        is_npu=False, is_xpu=False, is_hip=False, is_sm100=blackwell, is_blackwell=blackwell
    )


def _model_config_module(version: str) -> types.ModuleType:
    module = types.ModuleType("sglang.srt.configs.model_config")
    names = ("_hf_arch", "_hf_attr", "is_deepseek_dsa")
    if version >= "0.5.23":
        names += ("get_dsa_index_kpool",)
    vars(module).update({"Optional": Any, "PretrainedConfig": Any})
    _take(sglang_module(version, _MODEL_CONFIG), names, vars(module), _MODEL_CONFIG)
    module.unwrap_modelopt_quantization_config = lambda q: q  # type: ignore[attr-defined]
    return module


def model_override(
    version: str,
    config: dict[str, Any],
    fields: dict[str, Any],
    *,
    mla: bool = True,
    blackwell: bool = False,
) -> dict[str, Any]:
    """What SGLang `version` resolves `fields` to for a model of HF `config` (a dict, read as
    SGLang's PretrainedConfig attributes): its model override, then its a2a passes."""
    hf_config = types.SimpleNamespace(**config)
    glb = {
        **_glb(),
        "get_platform": lambda: _platform(blackwell),
        "use_mla_backend": lambda sa: mla,
    }
    arch = config["architectures"][0]
    view = types.SimpleNamespace(**{**DEFAULTS, **fields})
    saved = {
        n: sys.modules.get(n)
        for n in ("sglang.srt.configs.model_config", "sglang.srt.layers.attention.dsa.utils")
    }
    dsa_utils = types.ModuleType("sglang.srt.layers.attention.dsa.utils")
    dsa_utils.aiter_can_use_preshuffle_paged_mqa = lambda: True  # type: ignore[attr-defined]
    sys.modules["sglang.srt.configs.model_config"] = _model_config_module(version)
    sys.modules["sglang.srt.layers.attention.dsa.utils"] = dsa_utils
    try:
        if arch.startswith("MiniMaxM3"):
            _take(sglang_module(version, _COMMON), ("get_quantization_config",), glb, _COMMON)
            names = ("_resolve_quant_method", "_minimax_m3_overrides")
            code = _take(sglang_module(version, _MINIMAX), names, glb, _MINIMAX)
            found = code["_minimax_m3_overrides"](view, hf_config)
        else:
            if version >= "0.5.23":
                _take(sglang_module(version, _BASE), ("context_parallel_attn_dp_size",), glb, _BASE)
            names = ("_deepseek_family_overrides",) + (
                ("_dsa_dcp_overrides",) if version >= "0.5.23" else ()
            )
            code = _take(sglang_module(version, _DEEPSEEK), names, glb, _DEEPSEEK)
            found = code["_deepseek_family_overrides"](view, hf_config)
    finally:
        restore_modules(saved)
    return a2a_passes(version, {**vars(view), **found})


def attention_dp(resolved: dict[str, Any]) -> int:
    """The attention-DP ranks SGLang runs: --attn-dp-size, or --dp-size under DP attention."""
    if resolved["attn_dp_size"] > 1:
        return int(resolved["attn_dp_size"])
    return int(resolved["dp_size"]) if resolved["enable_dp_attention"] else 1
