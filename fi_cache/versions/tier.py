"""vLLM 0.34's shared warmup-cache tier (`vllm preload --warmup-cache-stores mooncake`): where the
preload daemon publishes FlashInfer tables, and how. Read in the vllm-0.34.0 wheel
(vllm/model_executor/model_loader/weight_cache/, vllm/distributed/mooncake_store.py).
"""

from __future__ import annotations

import re

from fi_cache.versions.release import V

# The first vLLM whose preload daemon shares tables through a store
# (artifact_store.py 0.34:110-113).
VLLM_TIER_FROM = V("0.34.0")
# artifact_store.py 0.34:28,31-33: f"{_KEY_PREFIX}/{kind}/{config_hash}/{filename}"; the kind is
# FlashInferWarmupCache.kind (warmup_cache.py 0.34:60); the filename is the engine's per-rank name
# (warmup/flashinfer_autotune_cache.py 0.34:56-58). No FlashInfer version, GPU, CUDA stack or
# finalize mode is in the key.
TIER_KEY_PREFIX = "vllm-warmup-cache"
TIER_FLASHINFER_KIND = "flashinfer_autotune"
# warmup_cache.py 0.34:46: the daemon refuses any other config hash.
TIER_CONFIG_HASH = re.compile(r"^[0-9a-f]{64}$")
# MooncakeArtifactStore.put (artifact_store.py 0.34:101-107): `is_exist(key) == 1` returns before
# writing: the first table published under a key stays; nothing in vLLM removes a key.
TIER_FIRST_WRITER_WINS = True
# _adopt_from_stores (warmup_cache.py 0.34:147-169): only when no local file exists, never for
# the v2 store, and only after validate_payload (:182-214) accepts its `_metadata` (hard and soft
# mismatches alike reject it; tactic ids and finalize mode are never looked at).
# MooncakeStoreConfig.load_from_config (distributed/mooncake_store.py 0.34:86-93): the JSON file
# $MOONCAKE_CONFIG_PATH; from_file (:66-84) reads these keys with these defaults.
MOONCAKE_CONFIG_ENV = "MOONCAKE_CONFIG_PATH"
MOONCAKE_CONFIG_DEFAULTS: dict[str, object] = {
    "metadata_server": "",
    "master_server_address": "",
    "protocol": "rdma",
    "device_name": "",
    "mode": "embedded",
    "tenant_id": "default",
}
# `vllm preload` flags (entrypoints/cli/preload.py 0.34:206,213; comma-separated names :330-334).
PRELOAD_STORES_FLAG = "--warmup-cache-stores"
PRELOAD_SEED_TOKEN_FLAG = "--seed-token"
# A running daemon's command line: `vllm preload` (PreloadSubcommand.name, preload.py 0.34:139),
# `vllm` being the console script for vllm.entrypoints.cli.main:main (entry_points.txt 0.34).
PRELOAD_SUBCOMMAND = "preload"
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"

__all__ = [
    "MOONCAKE_CONFIG_DEFAULTS",
    "MOONCAKE_CONFIG_ENV",
    "PRELOAD_SEED_TOKEN_FLAG",
    "PRELOAD_STORES_FLAG",
    "PRELOAD_SUBCOMMAND",
    "TIER_CONFIG_HASH",
    "TIER_FIRST_WRITER_WINS",
    "TIER_FLASHINFER_KIND",
    "TIER_KEY_PREFIX",
    "VLLM_CLI_MODULE",
    "VLLM_TIER_FROM",
]
