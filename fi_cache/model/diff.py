"""Two caches' tuning decisions side by side: keys only in one, keys both hold with another
runner or tactic, and `_metadata` fields that differ. Two cold tunes of one model can disagree
on most entries (flashinfer #3920, #4433) and ranks can pick other tactics (sglang #35343): this
says where, decoded (op, the bucket's shapes, runner, tactic, the MoE tactic's config family)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fi_cache.model import keys as keymod
from fi_cache.model import moe, v1
from fi_cache.versions import MoeTacticLists, moe_tactic_lists, sm_of_gpu

Change = Literal["only-a", "only-b", "changed"]


@dataclass(frozen=True, slots=True)  # one or two per row: 288,753 rows in a big diff
class Side:
    """One cache's answer for a key: the runner and tactic it stores, and for a CUTLASS MoE
    GEMM2 tactic the config family its id names (base, finalize, swap_base, ...)."""

    runner: Any
    tactic: Any
    family: str | None = None


@dataclass(frozen=True, slots=True)
class EntryDiff:
    change: Change
    raw_key: str
    op: str | None  # None: a key that does not parse
    runner: str | None  # the key's runner
    bucket: str  # the profile's shapes, `1x2048 128x1536x2048 ...`
    a: Side | None
    b: Side | None
    # Sort key of the bucket: (0, the profile) where it is tuples of ints, else (1, the shapes
    # text in numeric order).
    order: Any = field(default=(1, ()), compare=False, repr=False)


@dataclass(frozen=True)
class CacheDiff:
    entries: tuple[EntryDiff, ...]
    same: int  # keys both hold with the same value
    metadata: dict[str, tuple[Any, Any]]  # field: (a's, b's), fields that differ

    @property
    def differs(self) -> bool:
        return bool(self.entries or self.metadata)

    def count(self, change: Change) -> int:
        return sum(e.change == change for e in self.entries)


def _lists(cf: v1.CacheFile) -> MoeTacticLists | None:
    """The CUTLASS MoE tactic lists of the file's FlashInfer and GPU, where they are known
    (a `_metadata` field that is no string names neither: compared as it is, never parsed)."""
    meta = cf.metadata or {}
    version, gpu = meta.get("flashinfer_version"), meta.get("gpu")
    if not isinstance(version, str) or not isinstance(gpu, str):
        return None
    return moe_tactic_lists(version, sm_of_gpu(gpu), "bf16")


def _family(key: keymod.CacheKey | None, tactic: Any, lists: MoeTacticLists | None) -> str | None:
    """The GEMM2 config family a CUTLASS MoE tactic id names, where the file's tactic lists
    are known (versions.MOE_TACTIC_LISTS): in the key's finalize mode (0.6.18rc2+ keys say it),
    else `fused's|unfused's` where the two lists differ there."""
    if lists is None or key is None or moe.gemm_stage(key.op) != 2 or not isinstance(tactic, int):
        return None
    mode = moe.finalize_mode(key)
    if mode in ("fused", "unfused"):
        return _in_list(lists.gemm2[mode], tactic - lists.gemm1)
    fused = _in_list(lists.gemm2["fused"], tactic - lists.gemm1)
    unfused = _in_list(lists.gemm2["unfused"], tactic - lists.gemm1)
    # Keys before 0.6.18rc2 do not say the mode: "fused's|unfused's" where the lists differ.
    return fused if fused == unfused else f"{fused}|{unfused}"


def _in_list(runs: tuple[tuple[str, int], ...], index: int) -> str:
    found = moe.config_at(runs, index) if index >= 0 else None
    return found[0] if found else "none"  # past the list: that mode's kernel crashes on it


def _side(key: keymod.CacheKey | None, value: Any, lists: MoeTacticLists | None) -> Side:
    value = value if isinstance(value, list) else [None, value]
    tactic = value[1] if len(value) > 1 else None
    return Side(value[0] if value else None, tactic, _family(key, tactic, lists))


def _plain_side(value: Any) -> Side:
    """A non-MoE key's side: no config family to name."""
    if type(value) is list and len(value) > 1:
        return Side(value[0], value[1])
    return _side(None, value, None)


def _entry(
    change: Change, raw: str, key: keymod.CacheKey | None, a: Side | None, b: Side | None
) -> EntryDiff:
    if key is None:
        return EntryDiff(change, raw, None, None, "", a, b)
    bucket = keymod.shapes_text(raw) or keymod.shapes(key.profile)
    order = keymod.profile_order(key.profile, bucket)
    return EntryDiff(change, raw, key.op, key.runner, bucket, a, b, order)


def _parsed(raw: str) -> keymod.CacheKey | None:
    try:
        return keymod.parse_key(raw)
    except keymod.KeyError_:
        return None


@dataclass
class _Differ:
    """Builds one row per differing key: from the key's text where it tells everything (a
    non-MoE key of a shape seen before: keys.key_row), else from the parsed key."""

    la: MoeTacticLists | None
    lb: MoeTacticLists | None
    moe_ops: dict[str, bool] = field(default_factory=dict)

    def row(self, change: Change, raw: str, va: Any, vb: Any) -> EntryDiff:
        found = keymod.key_row(raw)
        if found is not None:
            op = found[0]
            if (is_moe := self.moe_ops.get(op)) is None:
                is_moe = self.moe_ops[op] = moe.is_moe(op)
            if not is_moe:  # no tactic family to name: the key itself is not needed
                a = None if va is _ABSENT else _plain_side(va)
                b = None if vb is _ABSENT else _plain_side(vb)
                return EntryDiff(change, raw, op, found[1], found[2], a, b, (0, found[3]))
        key = _parsed(raw)
        a = None if va is _ABSENT else _side(key, va, self.la)
        b = None if vb is _ABSENT else _side(key, vb, self.lb)
        return _entry(change, raw, key, a, b)


def diff(a: v1.CacheFile, b: v1.CacheFile) -> CacheDiff:
    """What differs between `a` and `b`, entries ordered by op, runner, bucket (numerically).
    Only the keys that differ are decoded: two 200,000-entry files mostly agree."""
    differ = _Differ(_lists(a), _lists(b))
    theirs = b.entries
    out: list[EntryDiff] = []
    same = 0
    for raw, value in a.entries.items():
        other = theirs.get(raw, _ABSENT)
        if other is _ABSENT:
            out.append(differ.row("only-a", raw, value, _ABSENT))
        elif other == value:
            same += 1
        else:
            out.append(differ.row("changed", raw, value, other))
    mine = a.entries
    for raw, value in theirs.items():
        if raw not in mine:
            out.append(differ.row("only-b", raw, _ABSENT, value))
    ma, mb = a.metadata or {}, b.metadata or {}
    metadata = {f: (ma.get(f), mb.get(f)) for f in sorted({*ma, *mb}) if ma.get(f) != mb.get(f)}
    out.sort(key=lambda e: (e.op or "~", e.runner or "", e.order, e.raw_key))
    return CacheDiff(tuple(out), same, metadata)


_ABSENT = object()
