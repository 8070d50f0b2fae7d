"""One rank of vLLM 0.34's per-stage autotune-cache gate, run with vLLM's own code.

    python gloo_pp_gate.py VLLM_SRC INIT_FILE RANK WORLD METADATA_FILE SCENARIOS_JSON
        -> one JSON line: for each scenario, what this rank's start did with its file

VLLM_SRC is vLLM 0.34.0's unpacked Python files (tests/vllm_wheels.py `unpacked`); nothing of
vLLM's is imported (importing kernel_warmup.py pulls its whole worker). Taken by `ast`:
- kernel_warmup.py: `_autotune_cache_fingerprint`, `_all_ranks_have_matching_cache`,
  `_load_shared_autotune_cache`, and `flashinfer_autotune`'s own choice of the tune group
  (`tune_group = get_tp_group() if pp_size > 1 else world`, 0.34:571);
- flashinfer_autotune_cache.py: `flashinfer_autotune_filename` (the rank file's name, dp rank
  and world rank, as `resolve_rank_flashinfer_autotune_file` calls it);
- parallel_state.py: `initialize_model_parallel`'s rank layout (`all_ranks` and the TP groups'
  `group_ranks`, [ExternalDP][DP][PP][PCP][TP]), each TP group then made with `dist.new_group`.
Every scenario (a data parallel rank 0, no PCP) runs in one gloo world of WORLD processes on CPU,
with FlashInfer's real AutoTuner as `tuner` (cleared first: a fresh start). This host has no
GPU, so FlashInfer is told the machine is the one METADATA_FILE names (its `_collect_metadata`,
as gloo_gate.py does).
"""

from __future__ import annotations

import ast
import json
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

KERNEL_WARMUP = "vllm/model_executor/warmup/kernel_warmup.py"
CACHE_NAMES = "vllm/model_executor/warmup/flashinfer_autotune_cache.py"
PARALLEL_STATE = "vllm/distributed/parallel_state.py"
_GATE = {"_autotune_cache_fingerprint", "_all_ranks_have_matching_cache"}
_LOAD = {*_GATE, "_load_shared_autotune_cache"}


def _functions(src: Path, rel: str, names: set[str]) -> dict[str, Any]:
    tree = ast.parse((src / rel).read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in body} == names, f"{names} not all in vLLM's {rel}"
    code: dict[str, Any] = {"json": json, "Path": Path, "torch": torch}
    exec(compile(ast.Module(body=body, type_ignores=[]), rel, "exec"), code)
    return code


def _function(src: Path, rel: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((src / rel).read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"no {name} in vLLM's {rel}"
    return found[0]


def _tune_group_choice(src: Path) -> ast.expr:
    """The right-hand side of `tune_group = ...` in `flashinfer_autotune`."""
    for node in ast.walk(_function(src, KERNEL_WARMUP, "flashinfer_autotune")):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "tune_group"
        ]:
            return node.value
    raise AssertionError("flashinfer_autotune no longer assigns tune_group")


def _tp_layout(src: Path, world: int, tp: int, pp: int) -> list[list[int]]:
    """The TP groups' world ranks by `initialize_model_parallel`'s own statements: its top-level
    assignments from `all_ranks = ...` up to where it makes the TP group (`_TP = ...`)."""
    fn = _function(src, PARALLEL_STATE, "initialize_model_parallel")
    names = {
        "torch": torch,
        "world_size": world,
        "data_parallel_size": 1,
        "pipeline_model_parallel_size": pp,
        "prefill_context_model_parallel_size": 1,
        "tensor_model_parallel_size": tp,
    }
    started = False
    for node in fn.body:
        if not isinstance(node, ast.Assign):
            continue
        targets = [ast.unparse(t) for t in node.targets]
        if targets == ["_TP"]:
            break
        started = started or targets == ["all_ranks"]
        if started and targets[0] in ("all_ranks", "group_ranks"):
            exec(compile(ast.Module(body=[node], type_ignores=[]), PARALLEL_STATE, "exec"), names)
    assert started, "initialize_model_parallel no longer lays ranks out in all_ranks"
    return [list(map(int, g)) for g in names["group_ranks"]]


def main() -> None:
    src, init, rank_s, world_s, metadata_file, scenarios = sys.argv[1:7]
    vllm, rank, world = Path(src), int(rank_s), int(world_s)
    load = _functions(vllm, KERNEL_WARMUP, _LOAD)["_load_shared_autotune_cache"]
    filename = _functions(vllm, CACHE_NAMES, {"flashinfer_autotune_filename"})
    choice = compile(ast.Expression(_tune_group_choice(vllm)), KERNEL_WARMUP, "eval")

    from flashinfer.autotuner import autotuner as fi_at

    saved = json.loads(Path(metadata_file).read_text())["_metadata"]
    fi_at._collect_metadata = lambda: dict(saved)
    tuner = fi_at.AutoTuner.get()

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    world_group = types.SimpleNamespace(
        world_size=world, rank_in_group=rank, cpu_group=dist.group.WORLD
    )
    out = []
    for scenario in json.loads(scenarios):
        tp, pp = scenario["tp"], scenario["pp"]
        layout = _tp_layout(vllm, world, tp, pp)
        made = [(g, dist.new_group(g, backend="gloo")) for g in layout]  # every rank makes all
        mine, pg = next((g, p) for g, p in made if rank in g)
        tp_group = types.SimpleNamespace(
            world_size=len(mine), rank_in_group=mine.index(rank), cpu_group=pg
        )
        tune_group = eval(
            choice, {"get_tp_group": lambda g=tp_group: g, "pp_size": pp, "world": world_group}
        )
        name = filename["flashinfer_autotune_filename"](0, world_group.rank_in_group)
        path = Path(scenario["dir"]) / name
        tuner.clear_cache()  # a fresh start of this rank
        hit = load(path, tuner, tune_group)
        out.append(
            {
                "file": name,
                "had_file": path.exists(),
                "tune_group": mine if tune_group is tp_group else list(range(world)),
                "kept": bool(hit),  # False: vLLM runs the tuning sweep on this rank
                "entries": len(tuner._file_configs),
            }
        )
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "scenarios": out}))


if __name__ == "__main__":
    main()
