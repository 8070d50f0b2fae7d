"""Checks over a deployment's rank files, modelled on each engine's own rule (ranks/agreement.py):
vLLM 0.32+'s unanimity gate, SGLang 0.5.19+'s digest, and ranks that answer one rank-free key
with different tactics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, CheckId, Inputs
from fi_cache.engines.sglang.layout import rank_layout
from fi_cache.engines.vllm import layout as vllm_layout
from fi_cache.ranks.agreement import (
    RankFile,
    Verdict,
    divergent_tactics,
    partial_hits,
    sglang_deletes,
    sglang_digest,
    vllm_gate,
)
from fi_cache.ranks.align import CannotAlign, align
from fi_cache.ranks.deployment import Deployment, Expected, gather, rank_name
from fi_cache.versions import SGLANG_RANK_DIGEST, VLLM_RANK_GATE, parse_version


def _expected(inp: Inputs) -> list[Expected]:
    """With `-- ARGS`, the engine's own answer names every rank of the deployment: vLLM's
    predict (its hash dir included), SGLang's launch rule (any key dir: its hash is the
    worker's). Without vLLM to ask, the layout model names the ranks of any hash dir they fit
    (a missing last rank too, which file names cannot show); with pp > 1 its tune groups are
    the stages' TP groups, not the world."""
    where, out, serve = inp.location, [], inp.serve
    if where is not None and where.dir and where.store == "v1" and where.all_files:
        every = tuple(r for f in where.all_files if (r := rank_name(f)).startswith("dp"))
        here = tuple(rank_name(f) for f in where.files)
        groups = vllm_layout.tune_groups(serve, every) if serve is not None else ()
        out.append(Expected("vllm", every, here, Path(where.dir).name, groups))
    elif serve is not None and not inp.target.sglang_version:
        fi = inp.target.fingerprint.flashinfer_version
        files = vllm_layout.rank_files(inp.target.vllm_version, fi, serve, inp.serve_moe) or ()
        every = tuple(r for f in files if (r := rank_name(f)).startswith("dp"))
        here = every if serve.nnodes == 1 else ()  # another node's ranks: not known to be here
        if every:
            out.append(Expected("vllm", every, here, None, vllm_layout.tune_groups(serve, every)))
    if inp.sglang is not None and inp.target.sglang_version:
        layout = rank_layout(inp.sglang)
        out.append(Expected("sglang", layout.ranks, layout.node))
    return out


def _deployments(inp: Inputs) -> list[Deployment]:
    """vLLM: the hash dirs the target reads; SGLang: every key dir given (each is a deployment
    of its own, and its ranks agree or not whichever namespace holds it)."""
    caches = [v.cache for v in inp.caches if v.applies or v.cache.found.layout == "sglang"]
    return gather(caches, expected=_expected(inp))


def _elsewhere(dep: Deployment, verdict: Verdict) -> list[str]:
    """The missing ranks that other nodes write: not given here, so not known to be missing."""
    return [r for r in verdict.missing if r in dep.elsewhere]


def _not_given(dep: Deployment, ranks: list[str]) -> Finding:
    shown = ", ".join(ranks[:6]) + (f" and {len(ranks) - 6} more" if len(ranks) > 6 else "")
    return Finding(
        "ranks-not-given",
        "info",
        _where(dep),
        f"{len(ranks)} rank files of this deployment are written on other nodes ({shown}) and "
        "were not given: the engine loads the cache only when they agree with this node's",
        "give every node's copy of the hash dir as a PATH; `fi-cache serve --pull URL` imports "
        "the fleet's bundle and fills this node's files from it before it starts",
        {"deployment": dep.key, "ranks": ranks},
    )


def _where(dep: Deployment) -> str:
    more = len(dep.copies) - 1
    return str(dep.copies[0]) + (f" (+{more} copies)" if more else "")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _align_hint(dep: Deployment) -> str:
    return "fi-cache align " + " ".join(str(c) for c in dep.copies)


def _cure(dep: Deployment, group: list[RankFile]) -> str:
    """align's answer for this group: the command, or why it cannot help."""
    try:
        align(group)
    except CannotAlign as exc:
        return exc.message[0].upper() + exc.message[1:]
    if dep.tune_groups:  # pipeline stages: align's PATHs alone cannot tell them apart
        return (
            "`fi-cache warm -- ARGS` aligns each stage's rank files alone; `fi-cache align "
            "PATH` sees no stages and would give every stage the union of all of them"
        )
    return (
        f"`{_align_hint(dep)}` gives every rank the union of their entries (a cold node's "
        "empty hash dir given as a PATH too is filled)"
    )


def _partial(dep: Deployment, group: list[RankFile]) -> Iterator[Finding]:
    short = partial_hits(group)
    if not short:
        return
    shown = ", ".join(f"{r} ({n})" for r, n in list(short.items())[:6])
    yield Finding(
        "vllm-ranks-partial-hit",
        "warning",
        _where(dep),
        f"the rank files pass vLLM's gate (equal _metadata and entry counts) but hold "
        f"different keys: {shown} lack keys other ranks have, so those ranks miss where the "
        "others hit (vLLM 0.32 then profiles them alone inside the tune group's collectives: "
        "the hang of vllm #57423; 0.33 runs FlashInfer's fallback tactic)",
        _cure(dep, group),
        {"deployment": dep.key, "short": short},
    )


def vllm_ranks_retune(inp: Inputs) -> Iterator[Finding]:
    """A vLLM 0.32+ tune group whose files fail the gate: every rank of it tunes again."""
    if inp.target.sglang_version:
        return
    version = parse_version(inp.target.vllm_version)
    if version is not None and version not in VLLM_RANK_GATE:
        return
    for dep in _deployments(inp):
        if dep.engine != "vllm":
            continue
        for group in dep.groups():
            verdict = vllm_gate(group)
            if verdict.loads:
                yield from _partial(dep, group)
                continue
            if len(group) < 2 and not verdict.missing:
                continue
            away = _elsewhere(dep, verdict)
            if away and len(away) == len(verdict.missing) and not verdict.reason_besides_missing:
                yield _not_given(dep, away)
                continue
            inferred = [r for r in verdict.missing if r in dep.inferred]
            yield Finding(
                "vllm-ranks-retune",
                "warning",
                _where(dep),
                f"vLLM loads these rank files only when every rank of the tune group has one "
                f"with equal _metadata and entry count ({VLLM_RANK_GATE.source}); "
                f"{verdict.reason()}, so at the next start all {len(group)} ranks tune again"
                + (
                    f" (missing inferred from the other ranks' names: {', '.join(inferred)})"
                    if inferred
                    else ""
                ),
                _cure(dep, group),
                {
                    "deployment": dep.key,
                    "ranks": list(verdict.ranks),
                    "missing": list(verdict.missing),
                    "metadata": verdict.metadata,
                    "counts": verdict.counts,
                },
            )


def sglang_ranks_disagree(inp: Inputs) -> Iterator[Finding]:
    """SGLang rank files of one TP group from different environments (any release: FlashInfer
    skips a file whose `_metadata` is not the reader's), or, for 0.5.19+, whose content differs:
    every rank of the group deletes its file at start (ranks/agreement.sglang_digest)."""
    if not inp.target.sglang_version:
        return
    digests = parse_version(inp.target.sglang_version) in SGLANG_RANK_DIGEST
    for dep in sorted(_deployments(inp), key=lambda d: d.key):
        if dep.engine != "sglang":
            continue
        for group in dep.groups():
            if len(group) < 2:
                continue  # a TP group of one compares nothing
            verdict = sglang_digest(group)
            names = [Path(rf.path).name for rf in group if rf.file is not None]
            if verdict.metadata:
                fields = sorted({f for diff in verdict.metadata.values() for f in diff})
                yield Finding(
                    "sglang-ranks-disagree",
                    "warning",
                    _where(dep),
                    f"the {len(names)} rank files of deployment {dep.key} were written in "
                    f"different environments ({', '.join(fields)} differ on "
                    f"{', '.join(verdict.metadata)}): FlashInfer skips a file whose `_metadata` "
                    "does not match the start that reads it, so some ranks tune afresh"
                    + (" and SGLang then deletes every rank's file" if digests else ""),
                    "tune every rank of a deployment on the same stack (CUDA, torch, "
                    "FlashInfer, GPU), or delete the odd files",
                    {
                        "deployment": dep.key,
                        "files": names,
                        "fields": fields,
                        "ranks": list(verdict.ranks),
                    },
                )
                continue
            if not digests or not sglang_deletes(verdict):
                continue
            away = _elsewhere(dep, verdict)
            if away and len(away) == len(verdict.missing) and not verdict.reason_besides_missing:
                yield _not_given(dep, away)
                continue
            yield Finding(
                "sglang-ranks-disagree",
                "warning",
                _where(dep),
                f"SGLang {inp.target.sglang_version} compares its TP ranks' files at every "
                f"start and deletes them all when they differ ({SGLANG_RANK_DIGEST.source}); "
                f"{verdict.reason()} in deployment {dep.key}, so the next start discards this "
                "cache on all of its ranks and tunes from scratch",
                _cure(dep, group),
                {
                    "deployment": dep.key,
                    "files": names,
                    "ranks": list(verdict.ranks),
                    "missing": list(verdict.missing),
                    "differs": list(verdict.differs),
                },
            )


def ranks_divergent_tactics(inp: Inputs) -> Iterator[Finding]:
    """Ranks of one deployment that hold different tactics for one rank-free key."""
    for dep in _deployments(inp):
        if dep.note is not None:  # a stray rank number: its missing ranks were not inferred
            check = "vllm-ranks-retune" if dep.engine == "vllm" else "sglang-ranks-disagree"
            yield Finding(
                check,
                "info",
                _where(dep),
                dep.note,
                "remove or rename the stray rank file (no deployment has that many ranks)",
            )
        for group in dep.groups():
            found = divergent_tactics(group)
            if not found:
                continue
            ops = sorted({d.op for d in found})
            yield Finding(
                "ranks-divergent-tactics",
                "warning",
                _where(dep),
                f"{_count(len(found), 'shape is', 'shapes are')} answered with different kernels "
                "on different ranks "
                f"({', '.join(ops[:4])}{', …' if len(ops) > 4 else ''}): ranks that run one "
                "collective with different tactics can diverge or hang (sglang #35343, vllm "
                "#54618)",
                f"`{_align_hint(dep)}` keeps the lowest rank's tactic on every rank and says "
                "which it chose",
                {"deployment": dep.key, "keys": [d.key for d in found[:20]], "count": len(found)},
            )


CHECKS: tuple[Check, ...] = (
    Check(
        "vllm-ranks-retune",
        "vLLM 0.32+ rank files that fail its unanimity gate (every rank tunes again), or pass "
        "it with different keys (vllm-ranks-partial-hit)",
        vllm_ranks_retune,
    ),
    Check(
        "sglang-ranks-disagree",
        "SGLang rank files of one TP group from different environments, or that differ "
        "(0.5.19+ deletes them all at start)",
        sglang_ranks_disagree,
    ),
    Check(
        "ranks-divergent-tactics",
        "Ranks of one deployment with different tactics for one rank-free key",
        ranks_divergent_tactics,
    ),
)

# Ids these checks emit beside their own (doctor/check_ids.py lists them with the checks').
EMITS: tuple[CheckId, ...] = (
    CheckId(
        "vllm-ranks-partial-hit",
        ("warning",),
        "vLLM 0.32+ rank files that pass its gate (equal _metadata and entry counts) but hold "
        "different keys: some ranks miss where others hit",
    ),
    CheckId(
        "ranks-not-given",
        ("info",),
        "rank files of a deployment that other nodes write and that were not given (info)",
    ),
)
