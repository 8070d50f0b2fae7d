"""`fi-cache coverage`: which (op, bucket) pairs a target looks up a cache has tuned, and why not
where it can be told. Pure: the caller reads the cache, the plan and the log.

A target is what will call FlashInfer: a plan (`warm --engine flashinfer`'s), whose every op is
looked up at every bucket its tuning fills (model/buckets.py), per finalize mode for the MoE; or
a start's log, whose "No tuned config covers OP input_shapes=..." lines are calls that ran
FlashInfer's fallback tactic -1. A pair is matched on the op FlashInfer tunes under
(versions/tuning.py), the bucket (the first input's token dim), the other dims of the first
input and the second input's shape; runner and extras are read from what matches. Why a pair is
missing, where the cache tells: the other finalize mode only (FlashInfer >= 0.6.18rc2 keys say
it), another dtype (MoE keys name it), the bucket never warmed (the shape is tuned at others),
the shape never warmed (the op is tuned at others), the op never tuned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fi_cache.doctor.logs import Fallback
from fi_cache.engines.flashinfer.plan import MOE_OP, GemmOp, MoeOp, Plan
from fi_cache.errors import FiCacheError
from fi_cache.model import keys as keymod
from fi_cache.model import moe, v1
from fi_cache.model.buckets import bucket_of, tuned_buckets
from fi_cache.versions import PLAN_OP_CUSTOM_OPS

_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


@dataclass(frozen=True)
class Want:
    """One lookup the target makes: op at bucket, for inputs of these other dims."""

    label: str  # what the user calls it: the plan op's label, or the log's op
    op: str  # the custom op FlashInfer keys it under
    bucket: int
    rest: tuple[int, ...]  # the first input's dims but the token dim
    second: tuple[int, ...] | None  # the second input's shape (None: not compared)
    mode: str | None = None  # the MoE finalize mode it runs (None: not known)
    dtype: str | None = None  # the MoE activation dtype ("torch.bfloat16"; None: not compared)
    source: str = ""  # "plan op 2", "log line 13"
    fell_back: bool = False  # the log shows the call ran tactic -1


@dataclass(frozen=True)
class Pair:
    want: Want
    tuned: bool
    reason: str | None  # why it is not tuned (or a caveat when it is)
    found: tuple[tuple[str, Any], ...] = ()  # (runner, tactic) of each matching entry


@dataclass(frozen=True)
class Coverage:
    pairs: tuple[Pair, ...]

    @property
    def tuned(self) -> int:
        return sum(p.tuned for p in self.pairs)

    @property
    def ratio(self) -> float:
        return self.tuned / len(self.pairs) if self.pairs else 1.0


@dataclass(frozen=True)
class _Entry:
    op: str
    bucket: int
    rest: tuple[int, ...]
    second: tuple[int, ...] | None
    runner: str
    tactic: Any
    mode: str | None  # "fused"/"unfused" where the key says, else None
    dtype: str | None


def _dims(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, keymod.TorchSize):
        return value.dims
    if isinstance(value, (list, tuple)) and all(isinstance(d, int) for d in value):
        return tuple(value)
    return None


def _split(profile: Any) -> tuple[int, tuple[int, ...], tuple[int, ...] | None] | None:
    """(token dim, the other dims of the first input, the second input) of a key's profile
    (parsed, or its JSON view)."""
    if not isinstance(profile, (list, tuple)) or not profile:
        return None
    first = _dims(profile[0])
    if first is None or len(first) < 2:
        return None
    second = _dims(profile[1]) if len(profile) > 1 else None
    return first[-2], first[:-2] + first[-1:], second


def entries(cf: v1.CacheFile) -> list[_Entry]:
    """The cache's entries, decoded once (unparsable keys left out: verify reports them)."""
    out = []
    for _raw, key, value in v1.iter_entries(cf):
        if key is None or (split := _split(key.profile)) is None:
            continue
        mode = dtype = None
        if moe.is_moe(key.op):
            found = moe.finalize_mode(key)
            mode = found if found in ("fused", "unfused") else None
            named = moe.named_extras(key) or {}
            dtype = str(keymod.to_json(named["x_dtype"])) if "x_dtype" in named else None
        tactic = value[1] if isinstance(value, list) and len(value) > 1 else None
        runner = value[0] if isinstance(value, list) and value else key.runner
        out.append(_Entry(key.op, *split, str(runner), tactic, mode, dtype))
    return out


# --- targets ------------------------------------------------------------------------------------


def from_plan(plan: Plan, modes: Sequence[str]) -> list[Want]:
    """Every lookup a warm of `plan` fills: each op at each bucket up to its largest token count;
    MoE ops once per finalize mode they list that is in `modes`."""
    out: list[Want] = []
    for op in plan.ops:
        where = f"plan op {op.index}"
        if isinstance(op, MoeOp):
            rest: tuple[int, ...] = (op.hidden_size,)
            dims = (op.local_experts, 2 * op.local_intermediate, op.hidden_size)
            for mode in (m for m in op.finalize if m in modes):
                for name in PLAN_OP_CUSTOM_OPS[MOE_OP]:
                    out += [
                        Want(op.label, name, b, rest, dims, mode, _DTYPES.get(op.dtype), where)
                        for b in tuned_buckets(op.max_tokens)
                    ]
            continue
        rest, second = _gemm_dims(op)
        [name] = PLAN_OP_CUSTOM_OPS[op.op]
        out += [
            Want(op.label, name, b, rest, second, source=where)
            for b in tuned_buckets(max(op.tokens))
        ]
    return out


def _gemm_dims(op: GemmOp) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    if op.op == "bmm_fp8":
        return (op.batch, op.k), (op.batch, op.k, op.n)
    if op.op == "mm_bf16":
        return (op.k,), (op.k, op.n)
    return (op.k,), None  # mm_fp8: its second input's layout is not compared


def from_log(fallbacks: Iterable[Fallback]) -> list[Want]:
    """One lookup per distinct (op, input shapes) the log shows falling back to tactic -1."""
    out: list[Want] = []
    seen: set[tuple[str, str | None]] = set()
    for f in fallbacks:
        if (f.op, f.shapes) in seen:
            continue
        seen.add((f.op, f.shapes))
        split = _parse_shapes(f.shapes)
        if split is None:
            continue  # a line without shapes (older FlashInfer): nothing to look up by
        tokens, rest, second = split
        out.append(
            Want(
                f.op,
                f.op,
                bucket_of(tokens),
                rest,
                second,
                source=f"log line {f.line_no}",
                fell_back=True,
            )
        )
    return out


def _parse_shapes(text: str | None) -> tuple[int, tuple[int, ...], tuple[int, ...] | None] | None:
    if not text:
        return None
    try:
        return _split(keymod.parse_value(text))
    except (ValueError, FiCacheError, RecursionError):
        return None


# --- judging ------------------------------------------------------------------------------------


@dataclass
class _Shape:
    """The entries of one op and input shape, by bucket."""

    by_bucket: dict[int, list[_Entry]] = field(default_factory=dict)
    _sorted: list[int] | None = None

    def buckets(self) -> list[int]:
        if self._sorted is None:
            self._sorted = sorted(self.by_bucket)
        return self._sorted


@dataclass
class _Index:
    """Entries by (op, other dims of the first input[, second input]): a lookup reads only its
    own shape's entries (scanning the op's for every line of a log was O(lines x entries))."""

    per_op: dict[str, int] = field(default_factory=dict)
    by_rest: dict[tuple[str, tuple[int, ...]], _Shape] = field(default_factory=dict)
    by_second: dict[tuple[str, tuple[int, ...], tuple[int, ...] | None], _Shape] = field(
        default_factory=dict
    )

    @classmethod
    def of(cls, found: Iterable[_Entry]) -> _Index:
        index = cls()
        for e in found:
            index.per_op[e.op] = index.per_op.get(e.op, 0) + 1
            for shape in (
                index.by_rest.setdefault((e.op, e.rest), _Shape()),
                index.by_second.setdefault((e.op, e.rest, e.second), _Shape()),
            ):
                shape.by_bucket.setdefault(e.bucket, []).append(e)
        return index

    def shaped(self, w: Want) -> _Shape | None:
        if w.second is None:
            return self.by_rest.get((w.op, w.rest))
        return self.by_second.get((w.op, w.rest, w.second))


def judge(cf: v1.CacheFile, wants: Sequence[Want]) -> Coverage:
    index = _Index.of(entries(cf))
    return Coverage(tuple(_judge(index, w) for w in wants))


def _judge(index: _Index, w: Want) -> Pair:
    shaped = index.shaped(w)
    buckets = shaped.buckets() if shaped else []
    if w.fell_back and buckets and w.bucket > buckets[-1]:
        w = _clamped(w, buckets[-1])  # FlashInfer looks the largest bucket up
    at = shaped.by_bucket.get(w.bucket, []) if shaped else []
    fits = [e for e in at if _fits(e.mode, w.mode) and _fits(e.dtype, w.dtype)]
    found = tuple((e.runner, e.tactic) for e in fits)
    if fits and not w.fell_back:
        blind = w.mode is not None and all(e.mode is None for e in fits)
        note = "keys do not say the finalize mode (FlashInfer < 0.6.18rc2)" if blind else None
        return Pair(w, True, note, found)
    return Pair(w, False, _why(w, index.per_op.get(w.op, 0), buckets, at, fits), found)


def _fits(has: str | None, wanted: str | None) -> bool:
    """An entry's mode or dtype against the lookup's: unknown on either side matches."""
    return wanted is None or has in (wanted, None)


def _clamped(w: Want, bucket: int) -> Want:
    return Want(w.label, w.op, bucket, w.rest, w.second, w.mode, w.dtype, w.source, w.fell_back)


def _why(w: Want, of_op: int, buckets: list[int], at: list[_Entry], fits: list[_Entry]) -> str:
    """Why `w` is not tuned: `of_op` entries of its op, `buckets` its shape is tuned at."""
    if fits:  # in the cache, yet the start fell back: keyed otherwise than the call
        modes = sorted({e.mode for e in fits if e.mode})
        if modes:
            return (
                f"finalize-mode miss: tuned {'/'.join(modes)} only; the start ran the other mode "
                "(or other key extras: dtype, top_k)"
            )
        return "tuned, but keyed otherwise than the call (its runner's key extras differ)"
    if at:
        other_modes = sorted({e.mode for e in at if e.mode and e.mode != w.mode})
        if w.mode and other_modes:
            return f"finalize-mode miss: tuned {'/'.join(other_modes)} only"
        dtypes = sorted({e.dtype for e in at if e.dtype and e.dtype != w.dtype})
        return f"dtype: tuned for {', '.join(dtypes) or 'other extras'} only"
    if buckets:
        above = " (above the largest: tune more tokens)" if w.bucket > buckets[-1] else ""
        return f"bucket never warmed: this shape is tuned at {_ranges(buckets)}{above}"
    if of_op:
        return f"shape never warmed: {w.op} is tuned for other shapes ({of_op} entries)"
    return f"op never tuned: no {w.op} entry in the cache"


def _ranges(buckets: list[int]) -> str:
    if len(buckets) <= 4:
        return ", ".join(map(str, buckets))
    return f"{buckets[0]}..{buckets[-1]} ({len(buckets)} buckets)"
