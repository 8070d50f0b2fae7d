"""vLLM as an engine: `vllm serve ARGS` with VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR in the namespace."""

from __future__ import annotations

from collections.abc import Sequence

from fi_cache.engines.api import Engine
from fi_cache.engines.vllm import args, launch


class Vllm(Engine):
    name = "vllm"
    cache_subdir = "vllm"  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR inside a namespace

    def find_executable(self, explicit: str | None) -> str:
        return launch.find_executable(explicit)

    def read_args(self, argv: Sequence[str]) -> args.ServeArgs:
        parsed = args.parse_serve_args(argv)
        args.require_model(parsed)
        return parsed

    def warm_key(self, a: args.ServeArgs, finalize: str) -> str:
        return a.key  # the finalize mode is the namespace's already


ENGINE = Vllm()
