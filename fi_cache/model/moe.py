"""What an entry of FlashInfer's fused-MoE runner says about its finalize mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fi_cache.model.keys import CacheKey, KeyValue
from fi_cache.versions import FINALIZE_FIELD, MOE_EXTRAS_FIELDS, MOE_OPS, MOE_STAGE_OP

Finalize = Literal["fused", "unfused", "unknown"]
# A file holding entries of both modes (0.6.18+ keys keep them apart) is "mixed".
FileFinalize = Literal["fused", "unfused", "unknown", "mixed"]


def is_moe(op: str) -> bool:
    """An op tuned by FlashInfer's CUTLASS fused-MoE runner (its GEMM1 or GEMM2 stage)."""
    return op in MOE_OPS or MOE_STAGE_OP.match(op) is not None


def gemm_stage(op: str) -> int | None:
    """1 or 2 for an op of the fused-MoE runner's GEMM1/GEMM2 stage, else None."""
    if op in MOE_OPS:  # trtllm::fused_moe::gemm1 / gemm2
        return int(op[-1])
    stage = MOE_STAGE_OP.match(op)
    return int(stage.group(1)) if stage else None


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


@dataclass(frozen=True)
class Gemm2Split:
    """What GEMM2 ids tuned in one finalize mode do when replayed in the other (<= 0.6.17 keys):
    crash with `Invalid gemm2 profile id`, silently run another kernel, or run the same one."""

    crash: tuple[int, ...]
    other_kernel: tuple[int, ...]
    same_kernel: tuple[int, ...]


def config_at(runs: tuple[tuple[str, int], ...], index: int) -> tuple[str, int] | None:
    """(config family, position in it) of the `index`-th GEMM2 tactic; None past the list."""
    for family, count in runs:
        if index < count:
            return family, index
        index -= count
    return None


def split_gemm2(
    ids: list[int],
    gemm1: int,
    tuned: tuple[tuple[str, int], ...],
    target: tuple[tuple[str, int], ...],
) -> Gemm2Split:
    """Split `ids` (global GEMM2 tactic ids, tuned in the list `tuned`) by what the `target`
    list runs for them: the same id names the same kernel only where both lists hold the same
    config there (the base configs lead both lists; the rest is shifted)."""
    crash, other, same = set(), set(), set()
    for t in ids:
        theirs = config_at(target, t - gemm1)
        if t < gemm1 or theirs is None:
            crash.add(t)
        elif theirs == config_at(tuned, t - gemm1):
            same.add(t)
        else:
            other.add(t)
    return Gemm2Split(tuple(sorted(crash)), tuple(sorted(other)), tuple(sorted(same)))
