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


def _build_model_on_meta(cfg: Any) -> None:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import initialize_model

    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"file://{tempfile.mktemp(prefix='fi-cache-predict-')}",
        )  # fmt: skip
        initialize_model_parallel(1, 1)
        with torch.device("meta"):
            initialize_model(cfg)


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


def _v2_root(fac: Any, cfg: Any) -> str | None:
    """vLLM 0.33: FlashInfer's v2 store root when use_flashinfer_autotune_v2 would hold (its
    distributed-state tests read from the config: nnodes, tp * pp ranks), else None."""
    if not hasattr(fac, "use_flashinfer_autotune_v2"):
        return None
    from vllm.utils.flashinfer import has_flashinfer_autotune_v2

    par = cfg.parallel_config
    one_rank = par.tensor_parallel_size * par.pipeline_parallel_size == 1
    if par.enable_elastic_ep or par.nnodes > 1 or not one_rank or not has_flashinfer_autotune_v2():
        return None
    root = fac.resolve_flashinfer_autotune_v2_root()
    if root is None:
        from flashinfer.autotune_cache import get_default_cache_root

        root = get_default_cache_root()
    return str(Path(root) / "v2")


def predict(argv: list[str]) -> dict[str, Any]:
    import vllm
    from vllm import envs
    from vllm.model_executor.warmup import flashinfer_autotune_cache as fac

    cfg = _config(argv)
    _build_model_on_meta(cfg)
    digest = fac.flashinfer_autotune_cache_hash(types.SimpleNamespace(vllm_config=cfg))
    v2 = _v2_root(fac, cfg)
    if v2 is not None:
        return {
            "vllm_version": vllm.__version__, "hash": digest, "root": v2, "dir": v2,
            "root_from": "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR or FlashInfer's default root",
            "files": [], "store": "v2",
            "moe_layers": list(cfg.compilation_config.static_all_moe_layers),
        }  # fmt: skip
    root, root_from = _root(envs)
    par = cfg.parallel_config
    world = par.tensor_parallel_size * par.pipeline_parallel_size
    per_rank = hasattr(fac, "sync_flashinfer_autotune_cache") or hasattr(
        fac, "flashinfer_autotune_filename"
    )  # 0.32+: one file per (dp, rank)
    if per_rank:
        files = [
            f"autotune_configs_dp{dp}_rank{r}.json"
            for dp in range(par.data_parallel_size)
            for r in range(world)
        ]
    else:
        files = ["autotune_configs.json"]
    return {
        "vllm_version": vllm.__version__,
        "hash": digest,
        "root": root,
        "root_from": root_from,
        "dir": str(Path(root) / digest) if root else None,
        "files": files,
        "store": "v1",
        "moe_layers": list(cfg.compilation_config.static_all_moe_layers),
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
