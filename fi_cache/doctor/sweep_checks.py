"""vLLM 0.33+ skips its tuning sweep when every rank's file passes its gate: a file it will load
that lacks buckets the sweep tunes for the config (`-- ARGS`, vLLM's own answer) keeps
FlashInfer's fallback tactic there for as long as it lives (model/sweep.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import CacheView, Check, Inputs
from fi_cache.model.sweep import missing, needed_buckets
from fi_cache.versions import VLLM_SWEEP_SKIPPED_ON_HIT, parse_version


def _gate_key(view: CacheView) -> tuple[str, int]:
    """What vLLM's gate compares across ranks: the sorted `_metadata`, the count of the other
    top-level fields (kernel_warmup.py 0.34:494-501)."""
    cf = view.cache.file
    rest = len(cf.entries) + len(cf.reserved) + len(cf.unknown)
    return json.dumps(cf.metadata, sort_keys=True), rest


def _loaded(inp: Inputs) -> list[CacheView]:
    """The hash dir's files this start loads, when every rank's file passes the gate (a full
    hit); [] when a rank lacks its file or they differ: vLLM tunes then."""
    where = inp.location
    if where is None or where.dir is None or where.store != "v1" or not where.files:
        return []
    by_name = {
        v.cache.path.name: v
        for v in inp.caches
        if v.applies and v.cache.path.parent == Path(where.dir)
    }
    views = [by_name[f] for f in where.files if f in by_name]
    if len(views) != len(where.files) or len({_gate_key(v) for v in views}) != 1:
        return []
    return views


def sweep_gap(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    where = inp.location
    if version is None or version < VLLM_SWEEP_SKIPPED_ON_HIT or where is None:
        return
    views = _loaded(inp)
    if not views or where.sweep_tokens is None:
        return
    need = needed_buckets(where.sweep_tokens)
    for view in views:
        lack = missing(view.cache.file, need)
        if not lack:
            continue
        every = sorted(set().union(*lack.values()))
        shown = ",".join(map(str, every[:8])) + (f" +{len(every) - 8}" if len(every) > 8 else "")
        yield Finding(
            "sweep-gap",
            "warning",
            str(view.cache.path),
            f"vLLM will not tune these: fallback tactic at M={shown} for {', '.join(lack)} "
            f"(vLLM {version} loads this file and skips its tuning sweep; this config tunes "
            f"up to {max(where.sweep_tokens)} tokens)",
            "remove this hash dir's files so vLLM tunes the config in full "
            "(`fi-cache warm -- ARGS` then keeps the result)",
            {
                "missing": {op: list(b) for op, b in lack.items()},
                "tokens": list(where.sweep_tokens),
            },
        )


CHECKS = (Check("sweep-gap", "vLLM 0.33+ loads a file lacking buckets its sweep tunes", sweep_gap),)
