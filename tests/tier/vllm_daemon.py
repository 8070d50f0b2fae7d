"""vLLM 0.34's preload-daemon tier code, from its wheel, run on CPU against a real Mooncake.

`artifact_store.py` (keys, MooncakeArtifactStore: first writer wins), `mooncake_store.py`
(MOONCAKE_CONFIG_PATH) and `warmup_cache.py` (FlashInferWarmupCache: adopt from the shared
stores, publish the tuned table, validate_payload, install) and `flashinfer_autotune_cache.py`
(the root under VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR and the rank file names) are executed as they
are in the wheel. Only what they import from the rest of vLLM, torch and the GPU is a stand-in:
the logger, `get_ip` (127.0.0.1: every socket on loopback), the world group's rank, the config
hash (vLLM computes it from the model's config on the GPU worker), `regex` (the stdlib's re does
what these modules ask of it) and `has_flashinfer`. FlashInfer itself is absent, so
validate_payload takes its own "classifier unavailable: accepting unchecked" branch.
"""

from __future__ import annotations

import builtins
import logging
import re
import sys
import types
from pathlib import Path
from typing import Any, Protocol

from tests.vllm_wheels import unpacked

VERSION = "0.34.0"
WEIGHT_CACHE = "vllm/model_executor/model_loader/weight_cache"
_STAND_IN_ROOTS = ("vllm", "torch", "regex", "flashinfer")


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


class _Seedable(Protocol):
    """seed.Seedable's place (warmup_cache.py subclasses it with Protocol)."""


class Daemon:
    """One rank's daemon code: `cache` is the wheel's FlashInferWarmupCache(["mooncake"])."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.world = types.SimpleNamespace(rank_in_group=0)
        src = unpacked(VERSION)
        logger = _module("vllm.logger", init_logger=logging.getLogger)
        mooncake_store = self._exec(src / "vllm/distributed/mooncake_store.py", {"regex": re})
        fa_cache = self._exec(
            src / "vllm/model_executor/warmup/flashinfer_autotune_cache.py",
            {
                "vllm.envs": _module("vllm.envs", VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=str(root)),
                "vllm.config": _module(
                    "vllm.config", CacheConfig=object, VllmConfig=object, replace=None
                ),
                "vllm.config.utils": _module("vllm.config.utils", hash_factors=None),
                "vllm.logger": logger,
            },
        )
        self.artifact_store = self._exec(
            src / WEIGHT_CACHE / "artifact_store.py",
            {
                "vllm.distributed.kv_transfer.kv_connector.v1.mooncake": _module(
                    "mooncake_connector",
                    rdma_utils=_module("rdma_utils", get_requester_local_hostname=str),
                ),
                "vllm.distributed.mooncake_store": mooncake_store,
                "vllm.logger": logger,
                "vllm.utils.import_utils": _module("import_utils", PlaceholderModule=None),
                "vllm.utils.network_utils": _module("network_utils", get_ip=lambda: "127.0.0.1"),
            },
        )
        warmup = self._exec(
            src / WEIGHT_CACHE / "warmup_cache.py",
            {
                "regex": re,
                "torch": _module("torch"),
                "vllm.distributed.parallel_state": _module(
                    "parallel_state", get_world_group=lambda: self.world
                ),
                "vllm.logger": logger,
                f"{WEIGHT_CACHE.replace('/', '.')}.artifact_store": self.artifact_store,
                f"{WEIGHT_CACHE.replace('/', '.')}.seed": _module("seed", Seedable=_Seedable),
                f"{WEIGHT_CACHE.replace('/', '.')}.utils": _module(
                    "utils", build_warmup_runner=None, is_draft_model_cacheable=None
                ),
                "vllm.model_executor.warmup.flashinfer_autotune_cache": _module(
                    "fa_cache",
                    flashinfer_autotune_cache_hash=lambda runner: runner.config_hash,
                    flashinfer_autotune_filename=fa_cache.flashinfer_autotune_filename,
                    flashinfer_autotune_root=fa_cache.flashinfer_autotune_root,
                    use_flashinfer_autotune_v2=lambda runner: False,
                ),
                "vllm.platforms": _module("platforms", current_platform=None),
                "vllm.utils.flashinfer": _module("vllm_flashinfer", has_flashinfer=lambda: False),
            },
        )
        self.cache = warmup.FlashInferWarmupCache(["mooncake"])

    @staticmethod
    def _exec(path: Path, stand_ins: dict[str, types.ModuleType]) -> types.ModuleType:
        """Run the wheel's file as a module whose imports of vLLM/torch get `stand_ins`."""

        def importer(
            name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            if name in stand_ins and (fromlist or "." not in name):
                return stand_ins[name]
            if name in stand_ins:  # `import a.b as c`: Python takes a, then its attribute b
                parts = name.split(".")
                top = node = types.ModuleType(parts[0])
                for part in parts[1:-1]:
                    setattr(node, part, types.ModuleType(part))
                    node = getattr(node, part)
                setattr(node, parts[-1], stand_ins[name])
                return top
            if name.split(".")[0] in _STAND_IN_ROOTS:
                raise ImportError(f"{name} is not here (CPU test: stand-ins only)")
            return builtins.__import__(name, globals_, locals_, fromlist, level)

        name = f"_vllm_{VERSION.replace('.', '_')}_{path.stem}"
        mod = types.ModuleType(name)
        mod.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": importer}
        mod.__file__ = str(path)
        sys.modules[name] = mod  # @dataclass looks its module up while the class is made
        try:
            exec(compile(path.read_text(), str(path), "exec"), mod.__dict__)
        finally:
            del sys.modules[name]
        return mod

    def close(self) -> None:
        """Close the Mooncake clients vLLM's code opened (their segments hold what they put)."""
        for store in self.cache._store_sources or []:
            if hasattr(store, "_store"):
                store._store.close()

    def runner(self, config_hash: str, dp: int = 0, rank: int = 0) -> Any:
        """A GPU model runner as far as the tier code looks at one (and the world's rank)."""
        self.world.rank_in_group = rank
        parallel = types.SimpleNamespace(data_parallel_rank=dp)
        return types.SimpleNamespace(
            config_hash=config_hash, vllm_config=types.SimpleNamespace(parallel_config=parallel)
        )

    def rank_file(self, config_hash: str, dp: int = 0, rank: int = 0) -> Path:
        return self.root / config_hash / f"autotune_configs_dp{dp}_rank{rank}.json"
