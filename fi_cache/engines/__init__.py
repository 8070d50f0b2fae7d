"""Engines: the programs fi-cache runs to fill a namespace (api.py states the contract).

One package per engine: `vllm/` (`vllm serve`), `sglang/` (`sglang serve`), `flashinfer/`
(FlashInfer's own autotuner, from a plan, without a serving engine). Each is imported only when
a command needs it; what the server engines share is in server.py (start, /health, stop) and
guard.py. How a warm or a serve runs, for every engine, is fi_cache/lifecycle/'s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the tuning child imports this package: it stays empty at run time
    from fi_cache.engines.api import Engine, ServerEngine

NAMES = ("vllm", "flashinfer", "sglang")
SERVERS = ("vllm", "sglang")  # the engines `serve` runs


def get(name: str) -> Engine[Any]:
    """The engine called `name` (one of NAMES)."""
    if name not in NAMES:
        raise KeyError(name)
    module = importlib.import_module(f"fi_cache.engines.{name}.engine")
    engine: Engine[Any] = module.ENGINE
    return engine


def serving(name: str) -> ServerEngine[Any, Any]:
    """The serving engine called `name` (one of SERVERS)."""
    if name not in SERVERS:
        raise KeyError(name)
    engine: ServerEngine[Any, Any] = importlib.import_module(
        f"fi_cache.engines.{name}.engine"
    ).ENGINE
    return engine
