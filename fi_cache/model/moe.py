"""What an entry of FlashInfer's fused-MoE runner says about its finalize mode."""

from __future__ import annotations

from typing import Literal

from fi_cache.model.keys import CacheKey, KeyValue
from fi_cache.versions import FINALIZE_FIELD, MOE_EXTRAS_FIELDS, MOE_OPS, MOE_STAGE_OP

Finalize = Literal["fused", "unfused", "unknown"]
# A file holding entries of both modes (0.6.18+ keys keep them apart) is "mixed".
FileFinalize = Literal["fused", "unfused", "unknown", "mixed"]


def is_moe(op: str) -> bool:
    """An op tuned by FlashInfer's CUTLASS fused-MoE runner (its GEMM1 or GEMM2 stage)."""
    return op in MOE_OPS or MOE_STAGE_OP.match(op) is not None


def named_extras(key: CacheKey) -> dict[str, KeyValue] | None:
    """MoE extras by field name, or None when the layout is not one FlashInfer wrote."""
    extras = key.extras
    if not isinstance(extras, tuple):
        return None
    names = MOE_EXTRAS_FIELDS.get(len(extras))
    return None if names is None else dict(zip(names, extras, strict=True))


def finalize_mode(key: CacheKey) -> Finalize:
    """fused/unfused from the key's last MoE extra; unknown for keys without that field."""
    fields = named_extras(key)
    if fields is None:
        return "unknown"
    value = fields[FINALIZE_FIELD]
    if value is True:
        return "fused"
    if value is False:
        return "unfused"
    return "unknown"


def combine(modes: set[Finalize]) -> FileFinalize | None:
    """A file's finalize mode from its MoE entries' modes; None when it has no MoE entries."""
    if not modes:
        return None
    known = modes - {"unknown"}
    if len(known) > 1:
        return "mixed"
    if "unknown" in modes:
        return "unknown"
    return next(iter(known))
