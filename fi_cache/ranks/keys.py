"""An entry's key with the rank fields masked: the key every rank of a deployment shares.

FlashInfer 0.6.18rc2-0.7.1 puts tp_rank, ep_rank and cluster_rank into the CUTLASS MoE keys
(versions.MOE_KEY_HAS_RANKS), so rank r's entry for a shape hits on rank r only; 0.7.2rc3+ keys
carry no rank, so every rank looks up the same key and should hold the same tactic.
"""

from __future__ import annotations

import functools

from fi_cache.model import keys as keymod
from fi_cache.model.moe import is_moe
from fi_cache.versions import MOE_EXTRAS_FIELDS

RANK_FIELDS = ("tp_rank", "ep_rank", "cluster_rank")
_RANKED_LAYOUT = next(names for names in MOE_EXTRAS_FIELDS.values() if "tp_rank" in names)
_RANK_AT = tuple(_RANKED_LAYOUT.index(f) for f in RANK_FIELDS)


@functools.lru_cache(maxsize=65536)
def rank_free(raw: str) -> tuple[str, bool]:
    """(the key with rank fields masked, whether it had any). Keys of other ops, and keys that
    do not parse, are their own rank-free key (cheap filter first: most keys are not MoE)."""
    if "fused_moe::" not in raw and "'moe_" not in raw:
        return raw, False
    try:
        key = keymod.parse_key(raw)
    except keymod.KeyError_:
        return raw, False
    extras = key.extras
    if not is_moe(key.op) or not isinstance(extras, tuple) or len(extras) != len(_RANKED_LAYOUT):
        return raw, False
    masked = tuple(None if i in _RANK_AT else v for i, v in enumerate(extras))
    return keymod.format_key(keymod.CacheKey(key.op, key.runner, key.profile, masked, True)), True
