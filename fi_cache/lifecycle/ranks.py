"""Rank files the engine will keep and hit (maintenance/align.py): after a start that wrote them,
each deployment's ranks made to agree the way the engine requires; before a start, this node's
own files filled in where only other nodes' are (a node that pulled the tuning node's bundle).
Upstream SGLang 0.5.19-0.5.22 deletes a TP group's files at every start when its FlashInfer keys
carry the rank (sglang #40320); vLLM 0.32+ re-tunes every rank when one file is missing or
shorter (getainode #134: a cold node beside a warm head)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fi_cache.caches.discover import named_rank_files
from fi_cache.errors import FiCacheError

if TYPE_CHECKING:  # serve imports this on every start: the rest only where rank files are
    from fi_cache.engines.api import Run, ServerEngine
    from fi_cache.lifecycle.report import Report
    from fi_cache.ranks.deployment import Deployment, Expected


def rank_dirs(root: Path) -> list[Path]:
    """Hash dirs under `root` that hold a deployment's per-rank files."""
    from fi_cache.caches.inventory import scan
    from fi_cache.ranks.deployment import gather

    if not root.is_dir():
        return []
    deployments = gather(scan([root], explicit=False).caches)
    return sorted({copy for dep in deployments for copy in dep.copies})


def _names_rank_files(root: Path) -> bool:
    """Whether any file under `root` is named as a per-rank file (nothing is parsed)."""
    return bool(named_rank_files(root))


def _named_missing(told: Expected | None, deployments: list[Deployment]) -> list[Path]:
    """This node's files, by the engine's names, missing from a deployment that holds every
    other node's ranks of that layout. Names alone cannot tell a tp-2 deployment from node 0
    of a tp-4 one: its dir then gets files its ranks never read, and loses nothing."""
    from fi_cache.ranks.deployment import file_name

    if told is None:
        return []
    out = []
    others = set(told.ranks) - set(told.here)
    for dep in deployments:
        held = {rank for _, rank in dep.files}
        if told.fits(dep.engine, dep.key, held) and others <= held:
            out += [dep.copies[0] / file_name(dep.engine, r) for r in told.here if r not in held]
    return out


def align_ranks(
    root: Path,
    report: Report,
    touched: Collection[Path] | None = None,
    groups: Expected | None = None,
) -> int:
    """Align every deployment under `root` (only those in the dirs `touched`, when given: what
    a start wrote), each tune group alone (`groups`: the engine's, when names cannot tell);
    the number of files rewritten. A deployment align refuses is left as the engine wrote it,
    with the reason noted."""
    from fi_cache.maintenance.align import apply

    dirs = [d for d in rank_dirs(root) if touched is None or d in touched]
    if not dirs:
        return 0
    try:
        plans = apply(dirs, expected=[groups] if groups is not None else ())
    except FiCacheError as exc:  # a lock held too long, an unreadable dir: the files stay
        report.note(f"rank files not aligned: {exc.message}")
        return 0
    written = 0
    for gp in plans:
        name = f"{gp.deployment.key[:16]} ({len(gp.ranks)} ranks)"
        if gp.aligned is None:
            report.note(f"rank files of {name} not aligned: {gp.problem}")
        elif gp.writes:
            written += len(gp.writes)
            report.note(
                f"aligned the rank files of {name}: {gp.entries} entries on every rank, "
                f"{len(gp.chosen)} keys the ranks answered differently kept the lowest rank's"
            )
    return written


def complete_node(
    engine: ServerEngine[Any, Any], run: Run[Any, Any], ns_dir: Path, store: Path, report: Report
) -> list[Path]:
    """Before a start on a namespace that holds rank files: the files this start will read
    (the engine's own answer: seed_targets) that are missing beside other ranks' files of the
    same deployment, written as the union of theirs, so this node does not start cold and make
    every rank tune again. Returns the files written; a refusal (rank-keyed MoE entries only
    their own rank can tune, another environment) is warned, nothing written."""
    root = engine.autotune_dir(ns_dir)
    if not _names_rank_files(root):
        return []  # the common case, decided from names alone: serve's overhead stays small
    if engine.one_rank(run):
        return []  # no other rank's file to fill from, and no reason to ask the engine (seconds)
    told = engine.rank_names(run)  # by name (SGLang): then the deployment's dir says the rest
    try:
        targets = engine.seed_targets(run, ns_dir, store)[0] if told is None else []
    except FiCacheError as exc:  # the engine cannot be asked: start as it is, say why
        report.warn(f"cannot tell whether this node's rank files are all here: {exc.message}")
        return []
    if told is None and all(t.exists() for t in targets):
        return []  # this node's own files are there (one GPU on 0.32+): nothing to read
    from fi_cache.caches.inventory import scan
    from fi_cache.maintenance.align import fill
    from fi_cache.ranks.deployment import gather

    deployments = gather(scan([root], explicit=False).caches)  # read once, for dirs and ranks
    dirs = {copy for dep in deployments for copy in dep.copies}
    if not dirs:
        return []
    missing = [t for t in targets if t.parent in dirs and not t.exists()]
    missing += _named_missing(told, deployments)
    if not missing:
        return []
    names = ", ".join(t.name for t in missing)
    try:
        filled = fill(missing, deployments, store)  # under the namespace lock, as align
    except FiCacheError as exc:
        report.warn(f"this node's rank files {names} are missing: {exc.message}")
        return []
    for dep, problem in filled.refused:
        others = len(dep.ranks) - len(missing)
        report.warn(
            f"this node's rank files {names} are missing beside {others} other ranks' "
            f"({problem}): at start every rank of the group tunes again"
        )
    if filled.written:
        report.note(
            f"this node's rank files {names} were missing beside the other ranks' (a bundle "
            f"from another node?): filled with their union, {len(filled.written)} files "
            "written, so no rank tunes again"
        )
    return list(filled.written)
