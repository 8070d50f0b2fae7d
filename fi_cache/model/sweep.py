"""Does a table hold what vLLM's FlashInfer tuning sweep would tune for a config? Pure.

From vLLM 0.33 a start whose every rank's file passes the gate tunes nothing (versions:
VLLM_SWEEP_SKIPPED_ON_HIT): a bucket the file lacks then runs FlashInfer's fallback tactic for
as long as the file lives. The sweep is one dummy run per token count (`max_num_batched_tokens`,
then each deferred-MoE bound), each tuning every op at FlashInfer's hybrid buckets up to that
count (model/buckets.py `tuned_buckets`). A table covers the sweep when every op it tunes along
the token dim holds every one of those buckets.

An op is judged on its entries that share everything but the token dim and the winning runner
(the other dims of the first input, the second input, the key's extras but plain ints) and
include bucket 1, where every sweep starts: an op keyed otherwise (attention's token dim
elsewhere) is not judged. An op the earlier run never tuned is not seen here at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.model import keys as keymod
from fi_cache.model import v1
from fi_cache.model.buckets import tuned_buckets
from fi_cache.versions import VLLM_SWEEP_SKIPPED_ON_HIT, parse_version


@dataclass(frozen=True)
class Sweep:
    """The largest token count of each pass of vLLM's sweep for a config (`tokens`), or why
    it is not known (`unknown`)."""

    tokens: tuple[int, ...] | None
    unknown: str = ""


def pass_tokens(max_num_batched_tokens: int, deferred: Iterable[int] = ()) -> tuple[int, ...]:
    """vLLM's passes: the batch budget first, then each deferred-MoE bound clamped to it
    (`_flashinfer_autotune_token_counts`, kernel_warmup.py 0.33:318-343, 0.34:422-447)."""
    counts = [max_num_batched_tokens]
    counts += [min(max_num_batched_tokens, d) for d in deferred if d > 0]
    return tuple(dict.fromkeys(counts))


def needed_buckets(tokens: Iterable[int]) -> tuple[int, ...]:
    """Every bucket the sweep tunes: FlashInfer's hybrid buckets of each pass, together."""
    out: set[int] = set()
    for t in tokens:
        out.update(tuned_buckets(t))
    return tuple(sorted(out))


def _family(key: keymod.CacheKey) -> tuple[tuple[str, ...], int] | None:
    """(what the entry shares with its other buckets, its token count); None: not token-keyed."""
    profile = keymod.to_json(key.profile)
    if not isinstance(profile, list) or not profile:
        return None
    first = profile[0]
    if not isinstance(first, list) or len(first) < 2 or not all(isinstance(d, int) for d in first):
        return None
    second = str(profile[1]) if len(profile) > 1 else ""
    rest = str(first[:-2] + first[-1:])
    return (key.op, rest, second, _kind(key.extras)), first[-2]


def _kind(extras: keymod.KeyValue) -> str:
    """The extras but their plain ints: a runner may key the token count there (cuBLASLt's
    (M, N, K, dtype)); dtypes, flags and names stay."""
    if isinstance(extras, (tuple, list)):
        return "(" + ", ".join(_kind(e) for e in extras if type(e) is not int) + ")"
    return keymod.format_value(extras)


def missing(cf: v1.CacheFile, buckets: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Op -> the sweep's buckets its token-keyed entries lack (ops lacking none left out)."""
    held: dict[tuple[str, ...], set[int]] = {}
    for _raw, key, _value in v1.iter_entries(cf):
        if key is not None and (found := _family(key)) is not None:
            held.setdefault(found[0], set()).add(found[1])
    out: dict[str, set[int]] = {}
    for family, have in held.items():
        if 1 not in have:
            continue  # not a sweep's bucket set: its token dim is elsewhere
        if lack := set(buckets) - have:
            out.setdefault(family[0], set()).update(lack)
    return {op: tuple(sorted(b)) for op, b in sorted(out.items())}


def _ms(buckets: Iterable[int]) -> str:
    shown = sorted(buckets)
    more = f" and {len(shown) - 8} more" if len(shown) > 8 else ""
    return ",".join(map(str, shown[:8])) + more


def refusal(
    vllm_version: str | None, sweep: Sweep | None, tables: Sequence[tuple[Path, v1.CacheFile]]
) -> str | None:
    """Why these seeds must not be placed (one line), or None: the vLLM still runs its sweep
    over a loaded file (< 0.33, or version unknown: the old rule), or the tables hold it."""
    version = parse_version(vllm_version)
    if version is None or version < VLLM_SWEEP_SKIPPED_ON_HIT:
        return None
    head = f"not seeding: vLLM {version} skips its tuning sweep on a full hit, and "
    tail = "; vLLM will tune from scratch"
    if sweep is None or sweep.tokens is None:
        why = sweep.unknown if sweep is not None and sweep.unknown else "not reported"
        return f"{head}fi-cache cannot tell which token counts this config tunes ({why}){tail}"
    lacking: dict[str, set[int]] = {}
    for _target, cf in tables:
        for op, gap in missing(cf, needed_buckets(sweep.tokens)).items():
            lacking.setdefault(op, set()).update(gap)
    if not lacking:
        return None
    every = set().union(*lacking.values())
    ops = ", ".join(sorted(lacking)[:3]) + (f" +{len(lacking) - 3}" if len(lacking) > 3 else "")
    return f"{head}the earlier files lack M={_ms(every)} for this config ({ops}){tail}"
