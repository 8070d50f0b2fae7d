"""Run by the interpreter that runs vLLM (never imported by fi-cache): where vLLM will keep its
FlashInfer autotune cache for `vllm serve ARGV`, computed with vLLM's own code.

    python predict_child.py '{"argv": [...]}'   ->  one JSON line on stdout

vLLM hashes the config its worker ends up with, not the one its API process builds: the worker
builds the model, and every FusedMoE layer appends its name to
`compilation_config.static_all_moe_layers`, which the hash covers (vLLM 0.32, CPU and GPU
alike). So the model is built here too, on the meta device (no weights, no GPU memory), under a
one-rank gloo group, before vLLM's `flashinfer_autotune_cache_hash` runs. Checked against the
hash a real vLLM 0.32 worker computes (tests/engines/vllm/test_vllm_predict.py).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any


def _config(argv: list[str]) -> Any:
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")  # errors read as `vllm serve` prints them
    ServeSubcommand().subparser_init(top.add_subparsers())
    args = top.parse_args(["serve", *argv])  # vLLM's own parser: its errors are its messages
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


# The fields that make init_distributed_environment fold DP into the world group: reset to one
# node and one DP rank while the model is built here in a one-rank group, then restored.
_ONE_RANK = {
    "data_parallel_size": 1,
    "data_parallel_size_local": 1,
    "data_parallel_rank": 0,
    "nnodes": 1,
    "node_rank": 0,
}


def _build_model_on_meta(cfg: Any) -> Any:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import initialize_model

    par = cfg.parallel_config
    saved = {k: getattr(par, k) for k in _ONE_RANK if hasattr(par, k)}
    try:
        for k in saved:
            setattr(par, k, _ONE_RANK[k])
        with (
            set_current_vllm_config(cfg),
            tempfile.TemporaryDirectory(prefix="fi-cache-predict-") as rdv,  # torch's rendezvous
        ):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method=f"file://{rdv}/rendezvous",
            )
            initialize_model_parallel(1, 1)
            with torch.device("meta"):
                return initialize_model(cfg)  # names every FusedMoE layer, whatever the sharding
    finally:
        for k, v in saved.items():
            setattr(par, k, v)


def _sweep(cfg: Any, model: Any, kernel_warmup: Any) -> dict[str, Any]:
    """The token count of each pass of vLLM's tuning sweep, from its own code over the model
    built here (`_flashinfer_autotune_token_counts`: max_num_batched_tokens, then each
    deferred-MoE bound; kernel_warmup.py 0.33:318-343, 0.34:422-447). A drafter widens a pass
    by its GPU runner's numbers (0.34:459-471): unknown then."""
    counts = getattr(kernel_warmup, "_flashinfer_autotune_token_counts", None)
    if counts is None:
        return {"tokens": None, "unknown": "this vLLM names no sweep token counts (< 0.32)"}
    if getattr(cfg, "speculative_config", None) is not None:
        return {"tokens": None, "unknown": "a drafter's token count is its GPU runner's"}
    runner = types.SimpleNamespace(scheduler_config=cfg.scheduler_config, get_model=lambda: model)
    try:
        return {"tokens": [int(t) for t in counts(runner)]}
    except Exception as exc:  # its code moved: say so, the seeding rule then holds back
        return {"tokens": None, "unknown": f"{type(exc).__name__}: {exc}"[:200]}


def _root(envs: Any) -> tuple[str | None, str]:
    """vLLM's v1 root (override dir, else VLLM_CACHE_ROOT/flashinfer_autotune_cache/<fi>/<arch>)."""
    override = envs.VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR
    if override:
        return str(Path(override).expanduser()), "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
    try:
        from flashinfer.jit import env as fi_env
    except ImportError:
        return None, "no FlashInfer in this environment: vLLM keeps no autotune cache"
    ws = fi_env.FLASHINFER_WORKSPACE_DIR
    root = Path(envs.VLLM_CACHE_ROOT) / "flashinfer_autotune_cache" / ws.parent.name / ws.name
    return str(root), "VLLM_CACHE_ROOT"


def _as_engine_core_sees_it(cfg: Any) -> None:
    """What each DP engine core does to its config before its workers hash it: an MoE model
    keeps data parallelism (its ranks join one world group); a dense model's DP ranks are
    independent engines of dp = 1 (v1/engine/core.py 0.25:1189-1199, 0.32:1473-1481,
    0.33:1546-1556)."""
    par = cfg.parallel_config
    if par.data_parallel_size <= 1 or cfg.model_config.is_moe:
        return
    if hasattr(par, "reconfigure_for_independent_dp_rank"):  # 0.28+
        par.reconfigure_for_independent_dp_rank()
    else:
        par.data_parallel_size = 1
        par.data_parallel_size_local = 1
        par.data_parallel_rank = 0


def _folds_dp(par: Any) -> bool:
    """init_distributed_environment widens the world group to every DP rank's workers
    (rank = dp_rank * world_size + rank) when nnodes > 1 or dp > 1, unless elastic EP or the
    external launcher (distributed/parallel_state.py 0.32:1836-1849, 0.33:1858-1872)."""
    return (
        par.distributed_executor_backend != "external_launcher"
        and (par.nnodes > 1 or par.data_parallel_size > 1)
        and not getattr(par, "enable_elastic_ep", False)
    )


def _world(par: Any) -> int:
    """The world group's size as the workers see it."""
    world: int = par.world_size * par.data_parallel_size if _folds_dp(par) else par.world_size
    return world


def _v2_root(fac: Any, cfg: Any) -> str | None:
    """vLLM 0.33: FlashInfer's v2 store root when use_flashinfer_autotune_v2 would hold
    (flashinfer_autotune_cache.py 0.33:79-111: no elastic EP, pp 1, one node, world 1)."""
    if not hasattr(fac, "use_flashinfer_autotune_v2"):
        return None
    from vllm.utils.flashinfer import has_flashinfer_autotune_v2

    par = cfg.parallel_config
    if par.enable_elastic_ep or par.pipeline_parallel_size > 1 or par.nnodes > 1:
        return None
    if _world(par) > 1 or not has_flashinfer_autotune_v2():
        return None
    root = fac.resolve_flashinfer_autotune_v2_root()
    if root is None:
        from flashinfer.autotune_cache import get_default_cache_root

        root = get_default_cache_root()
    return str(Path(root) / "v2")


def _rank_files(par: Any) -> tuple[list[str], list[str]]:
    """(this node's files, every node's) as `autotune_configs_dp{d}_rank{r}.json`: d the DP
    rank, r the world rank (kernel_warmup.py 0.32:453-457, `world.rank_in_group`)."""
    local = par.world_size  # tp * pp (* pcp) workers of one engine core
    fold = _folds_dp(par)
    here_dp = range(par.data_parallel_rank, par.data_parallel_rank + par.data_parallel_size_local)

    def names(dps: range, ranks: range) -> list[str]:
        return [
            f"autotune_configs_dp{d}_rank{d * local + r if fold else r}.json"
            for d in dps
            for r in ranks
        ]

    every = names(range(par.data_parallel_size), range(local))
    if par.data_parallel_size == 1 and par.nnodes > 1:  # one engine's workers across nodes
        per_node = local // par.nnodes
        start = par.node_rank * per_node
        return names(range(1), range(start, start + per_node)), every
    return names(here_dp, range(local)), every


def _block_size(cfg: Any) -> list[str]:
    """The KV-cache block size, which vLLM hashes and its worker sets from the attention
    backends after loading the model, before it hashes (update_block_size_for_backend:
    v1/executor/multiproc_executor.py 0.32:701, 0.33:801-802, 0.34:835-836; platforms/
    interface.py 0.34:759-797): done here too, over the model built on meta. Listed in
    depends_on unless --block-size fixes it (a hybrid model's is aligned to its mamba pages
    whatever the arguments say)."""
    from vllm.platforms import current_platform

    update = getattr(current_platform, "update_block_size_for_backend", None)
    if update is None:
        return []  # this vLLM's worker has no such step
    cache = cfg.cache_config
    hybrid = bool(getattr(cfg.model_config, "is_hybrid", False))
    try:
        update(cfg)
        said = f"{cache.block_size} as this host's backends pick it"
    except Exception as exc:  # a backend this host cannot select: the worker's may differ
        said = f"not resolved here: {type(exc).__name__}"
    if getattr(cache, "user_specified_block_size", False) and not hybrid:
        return []
    why = ", aligned to this hybrid model's mamba page size" if hybrid else ""
    return [
        f"the KV-cache block size ({said}; the GPU worker picks it from its attention "
        f"backends{why}: --block-size N fixes it for a model that is not hybrid)"
    ]


def _worker_resolved(cfg: Any) -> list[str]:
    """What vLLM's GPU worker changes in the hashed config before it hashes it, which this child
    cannot redo without the GPU: the CUDA-graph mode and capture sizes, resolved from the
    attention backend's support (gpu_model_runner.py 0.32:6825-6857, 0.33:6760; 0.34 has no
    gpu_model_runner.py: v1/worker/gpu/model_runner.py 0.34:792-800; before kernel_warmup:
    gpu_worker.py 0.32:950, 0.34:1070), and a --max-model-len -1 fitted to free GPU memory by
    the engine core (core.py 0.32:323-337, kv_cache_utils.py 0.32:2635-2636)."""
    out = []
    mode = getattr(cfg.compilation_config, "cudagraph_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)) != "NONE":
        out.append(
            f"CUDA-graph mode {getattr(mode, 'name', mode)} and its capture sizes (the "
            "GPU worker resolves them from its attention backend)"
        )
    if getattr(cfg.model_config, "original_max_model_len", None) == -1:
        out.append(
            "--max-model-len -1 (fitted to free GPU memory at start: "
            "--gpu-memory-utilization and --kv-cache-memory-bytes decide it)"
        )
    return out


def predict(argv: list[str]) -> dict[str, Any]:
    import vllm
    from vllm import envs
    from vllm.model_executor.warmup import flashinfer_autotune_cache as fac
    from vllm.model_executor.warmup import kernel_warmup

    cfg = _config(argv)
    _as_engine_core_sees_it(cfg)
    model = _build_model_on_meta(cfg)
    block = _block_size(cfg)  # the worker's step between loading the model and hashing
    digest = fac.flashinfer_autotune_cache_hash(types.SimpleNamespace(vllm_config=cfg))
    moe_layers = list(cfg.compilation_config.static_all_moe_layers)
    par = cfg.parallel_config
    facts = {
        "dp": par.data_parallel_size,
        "world": _world(par),
        "moe": bool(moe_layers),
        "depends_on": [*block, *_worker_resolved(cfg)],
        "sweep": _sweep(cfg, model, kernel_warmup),
    }
    v2 = _v2_root(fac, cfg)
    if v2 is not None:
        return {
            "vllm_version": vllm.__version__,
            "hash": digest,
            "root": v2,
            "dir": v2,
            "root_from": "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR or FlashInfer's default root",
            "files": [],
            "all_files": [],
            "store": "v2",
            "moe_layers": moe_layers,
            **facts,
        }
    root, root_from = _root(envs)
    # 0.32+ reads per-rank files and gates on them; 0.30/0.31 already have
    # sync_flashinfer_autotune_cache but still read one autotune_configs.json (0.30:436).
    if hasattr(kernel_warmup, "_all_ranks_have_matching_cache"):
        files, every = _rank_files(par)
    else:
        files = every = ["autotune_configs.json"]
    return {
        "vllm_version": vllm.__version__,
        "hash": digest,
        "root": root,
        "root_from": root_from,
        "dir": str(Path(root) / digest) if root else None,
        "files": files,
        "all_files": every,
        "store": "v1",
        "moe_layers": moe_layers,
        **facts,
    }


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    out = os.dup(1)
    os.dup2(2, 1)  # vLLM logs to stdout: keep ours clean, one JSON line at the end
    try:
        answer = predict(list(request["argv"]))
    except SystemExit as exc:  # argparse: vLLM's parser rejected the argv (its message is above)
        answer = {"error": "vllm-rejected-argv", "code": exc.code}
    except Exception as exc:
        answer = {"error": "failed", "message": f"{type(exc).__name__}: {exc}"[-500:]}
    os.write(out, (json.dumps(answer) + "\n").encode())
