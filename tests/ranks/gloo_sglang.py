"""One SGLang rank's boot through its FlashInfer autotune context, with SGLang's own code.

    python gloo_sglang.py FLASHINFER_AUTOTUNE_PY INIT RANK WORLD CACHE_FILE ENV_JSON KEYS_JSON
        -> one JSON line

`flashinfer_autotune_context` and the helpers it calls (`_autotune_tactic_sync_group`,
`_autotune_process_group`, `_autotune_cache_digest`, `_drop_diverged_autotune_cache`) are taken
by `ast` from an SGLang wheel's model_executor/runner/flashinfer_autotune.py (0.5.21, 0.5.23:
importing the module pulls SGLang's whole runtime) and run as they are, in a torch.distributed
gloo group of WORLD processes standing for one TP group, with FlashInfer's real AutoTuner
loading and saving the file. Shimmed, because this host has no GPU and no SGLang runtime: the
cache path (CACHE_FILE: the path rule has tests of its own), SGLang's server-args accessors
(cache reuse on, CUTLASS MoE, the TP group = this gloo group), CUDA streams (no-ops), the dummy
forward (nothing runs inside the context), and FlashInfer's `_collect_metadata` (ENV_JSON: the
environment every rank reads with; on CPU FlashInfer would report "unknown" and load nothing).
KEYS_JSON lists the keys this rank looks up (its own entries): a hit is a key FlashInfer's
loaded table answers with the stored runner, which `search_cache` returns without profiling.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import datetime
import hashlib
import json
import logging
import sys
import types
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

_TAKEN = (
    "_autotune_tactic_sync_group",
    "_autotune_process_group",
    "_autotune_cache_digest",
    "_drop_diverged_autotune_cache",
    "flashinfer_autotune_context",
)


def _sglang(source: Path, cache: Path, said: list[str]) -> dict:
    """SGLang's functions, compiled from the wheel, over shimmed module globals."""
    tree = ast.parse(source.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _TAKEN]
    assert {n.name for n in body} == set(_TAKEN), f"{source} lacks {_TAKEN}"
    tp_group = types.SimpleNamespace(world_size=dist.get_world_size(), cpu_group=dist.group.WORLD)
    exec_ = types.SimpleNamespace(
        moe=types.SimpleNamespace(moe_runner_backend="flashinfer_cutlass"),
        kernel=types.SimpleNamespace(flashinfer_autotune_skip_ops=()),
    )
    code: dict = {
        "contextlib": contextlib,
        "datetime": datetime,
        "hashlib": hashlib,
        "json": json,
        "uuid": uuid,
        "Path": Path,
        "torch": torch,
        "logger": logging.getLogger("sglang"),
        "log_info_on_rank0": lambda lg, msg: said.append(msg),
        "envs": types.SimpleNamespace(
            SGLANG_FLASHINFER_AUTOTUNE_CACHE=types.SimpleNamespace(get=lambda: True)
        ),
        "get_parallel": lambda: types.SimpleNamespace(tp_group=tp_group),
        "get_exec": lambda: exec_,
        "flashinfer_autotune_cache_path": lambda mr: cache,
        "get_flashinfer_autotune_skip_ops": lambda mr: set(),
        "empty_context": contextlib.nullcontext,
    }
    flags = __future__.annotations.compiler_flag  # the module's own `from __future__`
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec", flags), code)
    return code


def _no_gpu() -> types.SimpleNamespace:
    """The model runner's parts the context touches; CUDA streams become no-ops."""
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    torch.cuda.current_stream = lambda *a, **k: stream  # type: ignore[assignment]
    for name, attr in (
        ("sglang.srt.layers.logits_processor", "autotune_dummy_run_mode"),
        ("sglang.srt.layers.moe.flashinfer_megamoe_autotune", "megamoe_autotune_context"),
    ):
        module = types.ModuleType(name)
        setattr(module, attr, lambda *a, **k: contextlib.nullcontext())
        sys.modules[name] = module
    return types.SimpleNamespace(
        device="cpu",
        forward_stream=stream,
        is_draft_worker=False,
        tp_group=types.SimpleNamespace(
            world_size=dist.get_world_size(), cpu_group=dist.group.WORLD
        ),
    )


def main() -> None:
    source, init, rank, world, cache_file, env_json, keys_json = sys.argv[1:8]
    cache = Path(cache_file)
    env = json.loads(Path(env_json).read_text())
    own = json.loads(Path(keys_json).read_text())
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=int(rank), world_size=int(world)
    )
    import flashinfer.autotuner as fi_pkg
    from flashinfer.autotuner import autotuner as fi_at

    fi_at._collect_metadata = lambda: dict(env)
    fi_pkg._collect_metadata = lambda: dict(env)  # SGLang imports it from the package
    tuner = fi_at.AutoTuner.get()
    loads: list[bool] = []
    real_load = tuner.load_configs
    tuner.load_configs = lambda path: loads.append(bool(real_load(path))) or loads[-1]
    said: list[str] = []
    code = _sglang(Path(source), cache, said)
    before = code["_autotune_cache_digest"](cache, env)
    with code["flashinfer_autotune_context"](_no_gpu(), run_lm_head=False):
        pass  # the dummy forward: nothing to profile on CPU
    table = tuner._file_configs
    hits = sum(1 for key, value in own.items() if table.get(key, (None,))[0] == value[0])
    dist.barrier()  # every rank has saved: the next boot's digest sees them all
    after = code["_autotune_cache_digest"](cache, env)
    dist.destroy_process_group()
    print(
        json.dumps(
            {
                "rank": int(rank),
                "before": before,
                "discarded": bool(said),
                "loaded": loads,
                "hits": hits,
                "own": len(own),
                "after": after,
                "saved": cache.is_file(),
            }
        )
    )


if __name__ == "__main__":
    main()
