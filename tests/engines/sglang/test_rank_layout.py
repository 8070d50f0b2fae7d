"""The rank files fi-cache names for an SGLang deployment are the ones SGLang 0.5.23's own code
names: `_calculate_rank_ranges` (entrypoints/engine.py), `compute_dp_attention_world_info`
(layers/dp_attention.py, with runtime_context.py's two helpers) and the rank-key f-string of
`flashinfer_autotune_cache_path`, composed as data_parallel_controller.py's
`launch_tensor_parallel_group` loops them (every replica, this node's PP stages and TP ranks)."""

from __future__ import annotations

import ast
import types
from typing import Any

import pytest

from fi_cache.engines.sglang.args import parse_sglang_args
from fi_cache.engines.sglang.layout import rank_layout
from tests.sglang_layout import MODULE, sglang_module

_FUNCTIONS = {
    "sglang/srt/entrypoints/engine.py": ("_calculate_rank_ranges",),
    "sglang/srt/layers/dp_attention.py": ("compute_dp_attention_world_info",),
    "sglang/srt/runtime_context.py": ("derive_attn_tp_size", "derive_attention_ranks"),
}


def _sglang(parallel: types.SimpleNamespace) -> dict[str, Any]:
    code: dict[str, Any] = {"get_parallel": lambda: parallel, "Tuple": tuple}
    for module, names in _FUNCTIONS.items():
        tree = ast.parse(sglang_module("0.5.23", module))
        body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        assert {n.name for n in body} == set(names), f"0.5.23 {module} lacks {names}"
        exec(compile(ast.Module(body=body, type_ignores=[]), module, "exec"), code)
    return code


def _rank_key_format() -> str:
    """The f-string of the rank key, checked to be the one this test fills in."""
    text = sglang_module("0.5.23", MODULE)
    want = (
        'f"rank_tp{get_parallel().tp_rank}_pp{get_parallel().pp_rank}'
        '_dp{get_parallel().dp_rank or 0}"'
    )
    assert want in text, "SGLang 0.5.23 names its rank files another way"
    return "rank_tp{tp}_pp{pp}_dp{dp}.json"  # cache_dir / f"{rank_key}.json"


def _sglangs_own(tp: int, pp: int, dp: int, attn_dp: int, nnodes: int) -> dict[int, list[str]]:
    """Per node, the files SGLang's schedulers there write."""
    fmt = _rank_key_format()
    out = {}
    for node_rank in range(nnodes):
        par = types.SimpleNamespace(nnodes=nnodes, pp_size=pp, tp_size=tp, node_rank=node_rank)
        code = _sglang(par)
        pp_range, tp_range, _, _ = code["_calculate_rank_ranges"](node_rank)
        names = []
        replicas = 1 if attn_dp > 1 else dp  # dp attention reuses the one TP group
        for replica in range(replicas):
            for pp_rank in pp_range:
                for tp_rank in tp_range:
                    dp_rank = replica if dp > 1 and attn_dp == 1 else None
                    if attn_dp > 1:
                        _, _, dp_rank, _ = code["compute_dp_attention_world_info"](
                            tp_rank, tp, attn_dp, 1
                        )
                    names.append(fmt.format(tp=tp_rank, pp=pp_rank, dp=dp_rank or 0))
        out[node_rank] = names
    return out


LAYOUTS = [
    ("--tp-size 2", 2, 1, 1, 1, 1),
    ("--tp-size 4 --dp-size 2 --enable-dp-attention", 4, 1, 2, 2, 1),
    ("--tp-size 8 --attn-dp-size 4 --ep-size 8", 8, 1, 1, 4, 1),
    ("--tp-size 2 --pp-size 2", 2, 2, 1, 1, 1),
    ("--dp-size 2", 1, 1, 2, 1, 1),
    ("--tp-size 2 --dp-size 2", 2, 1, 2, 1, 1),
    ("--tp-size 16 --nnodes 2", 16, 1, 1, 1, 2),
    ("--tp-size 16 --dp-size 16 --enable-dp-attention --nnodes 2", 16, 1, 16, 16, 2),
    ("--tp-size 8 --pp-size 2 --nnodes 2", 8, 2, 1, 1, 2),
    ("--tp-size 8 --pp-size 2 --nnodes 4", 8, 2, 1, 1, 4),
]


@pytest.mark.parametrize(("argv", "tp", "pp", "dp", "attn_dp", "nnodes"), LAYOUTS)
def test_every_nodes_rank_files_are_sglangs_own(
    argv: str, tp: int, pp: int, dp: int, attn_dp: int, nnodes: int
) -> None:
    theirs = _sglangs_own(tp, pp, dp, attn_dp, nnodes)
    every: list[str] = []
    for node_rank, names in theirs.items():
        args = parse_sglang_args([*argv.split(), "--node-rank", str(node_rank)])
        layout = rank_layout(args)
        assert [f"rank_{r}.json" for r in layout.node] == names, node_rank
        every += names
    assert sorted(f"rank_{r}.json" for r in layout.ranks) == sorted(every)
