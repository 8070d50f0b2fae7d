"""SGLang as an engine: `sglang serve ARGS` with SGLANG_CACHE_DIR in the namespace (launch.py says
what else that moves, and what fi-cache keeps where the user had it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fi_cache.engines.api import Engine
from fi_cache.engines.sglang import args, launch
from fi_cache.versions import SGLANG_AUTOTUNE_SUBDIR


class Sglang(Engine):
    name = "sglang"
    cache_subdir = "sglang"  # SGLANG_CACHE_DIR inside a namespace

    def find_executable(self, explicit: str | None) -> str:
        return launch.find_launcher(explicit).executable

    def read_args(self, argv: Sequence[str]) -> args.SglangArgs:
        parsed = args.parse_sglang_args(argv)
        args.require_model(parsed)
        return parsed

    def warm_key(self, a: args.SglangArgs, finalize: str) -> str:
        return a.key  # the finalize mode is the namespace's already

    def autotune_dir(self, ns_dir: Path) -> Path:
        """Where SGLang keeps FlashInfer's autotune files in the namespace (the rest of what
        lands under SGLANG_CACHE_DIR is not a cache fi-cache reads)."""
        return self.cache_dir(ns_dir).joinpath(*SGLANG_AUTOTUNE_SUBDIR)


ENGINE = Sglang()
