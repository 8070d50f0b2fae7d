"""`fi-cache align PATH...`: make each deployment's rank files agree, on every copy given.

Reads every per-rank file under the PATHs (hash dirs of vLLM 0.32+ or SGLang, on one node or
several nodes' copies), groups them into deployments (ranks/deployment.py), aligns each tune
group (ranks/align.py) and writes the aligned file to every rank of the group in every copy:
a cold node's empty hash dir given as a PATH gets the whole set. Locked per copy; every file
is staged (written and fsynced) before any is renamed into place, so a full disk replaces
none; a deployment that cannot be aligned is left exactly as it was. A copy in a
store namespace is changed under that namespace's lock, and refused there when it is pinned.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.caches import daemon, inventory
from fi_cache.caches.discover import ScanProblem, classify_file
from fi_cache.errors import Refused, refuse_special
from fi_cache.model import v1
from fi_cache.model.union import Conflict
from fi_cache.ranks.align import Aligned, CannotAlign, align
from fi_cache.ranks.deployment import Deployment, Expected, file_name, gather, rank_name
from fi_cache.store import locks
from fi_cache.store import pin as pins
from fi_cache.store.files import DEFAULT_LOCK_TIMEOUT, locked, replace_all

DEFAULT_MODE = 0o644  # as merge: a rank file is read by every rank's process
_LOCK_NAME = "fi-cache-align"  # one `.fi-cache-align.lock` per copy: the whole set changes at once


@dataclass(frozen=True)
class GroupPlan:
    """One tune group: its ranks, the aligned file (None: refused, `problem` says why) and the
    files that change: (path, created)."""

    deployment: Deployment
    ranks: tuple[str, ...]
    aligned: Aligned | None
    problem: str | None
    writes: tuple[tuple[Path, bool], ...]
    entries: int

    @property
    def chosen(self) -> list[Conflict]:
        return [] if self.aligned is None else self.aligned.chosen


def _read(path: Path) -> bytes | None:
    refuse_special(path, "rank file")  # a FIFO at a rank's name: reading it waits forever
    try:
        return path.read_bytes()
    except OSError:
        return None


def _plan_group(
    dep: Deployment, group: Sequence[str], unreadable: Sequence[ScanProblem] = ()
) -> GroupPlan:
    if unreadable:  # aligned, that rank's file would be replaced and its own entries lost
        bad = unreadable[0]
        why = (
            f"cannot read {rank_name(bad.path)}'s file {bad.path}: {bad.message}; aligning "
            "would replace it and lose its entries (fix it or move it aside; see fi-cache doctor)"
        )
        return GroupPlan(dep, tuple(group), None, why, (), 0)
    wanted = set(group)  # a list made this O(ranks^2)
    files = [rf for rf in dep.rank_files() if rf.rank in wanted]
    try:
        aligned = align(files)
    except CannotAlign as exc:
        return GroupPlan(dep, tuple(group), None, exc.message, (), 0)
    if len(files) == 1 and len(dep.copies) == 1 and files[0].file is not None:
        return GroupPlan(dep, tuple(group), aligned, None, (), len(aligned.file.entries))  # alone
    data = v1.dumps(aligned.file).encode()
    writes = []
    for copy in dep.copies:
        for rank in group:
            path = copy / file_name(dep.engine, rank)
            old = _read(path)
            if old != data:
                writes.append((path, old is None))
    return GroupPlan(dep, tuple(group), aligned, None, tuple(writes), len(aligned.file.entries))


def plan(paths: Sequence[Path], expected: Sequence[Expected] = ()) -> list[GroupPlan]:
    """What align would do; nothing is written. Refused when no PATH holds a rank file.
    `expected`: ranks the engine's own answer names (a node's own files not written yet)."""
    # A PATH that does not exist yet is a cold node's copy, when it names a deployment's dir.
    absent = [p for p in paths if not os.path.lexists(p)]
    inv = inventory.scan([p for p in paths if p not in absent])
    copies = [p for p in paths if p in absent or p.is_dir()]
    deployments = gather(inv.caches, copies, expected)
    _refuse_lone_unreadable(inv.problems, deployments)
    for path in absent:
        if not any(path.name == dep.key for dep in deployments):
            why = "no such file or directory (a new copy is named after its hash dir)"
            raise Refused(why, path)
    if not deployments:
        raise Refused(
            "no per-rank files here (vLLM 0.32+ `autotune_configs_dp*_rank*.json`, SGLang "
            "`rank_tp*_pp*_dp*.json`); align works on a deployment's hash dir",
            paths[0] if len(paths) == 1 else None,
        )
    _refuse_daemon_dirs(deployments)
    plans = []
    for dep in deployments:
        bad = _unreadable(dep, inv.problems)
        groups = [[rf.rank for rf in group] for group in dep.groups()]
        known = {rank for group in groups for rank in group}
        for group in groups:  # a rank no group names (its only file unreadable): all refused
            mine = [p for p in bad if rank_name(p.path) in group or rank_name(p.path) not in known]
            plans.append(_plan_group(dep, group, mine))
    return plans


def _refuse_daemon_dirs(deployments: Sequence[Deployment]) -> None:
    """A running `vllm preload` writes its hash dirs itself (its tuning, its D2D seeding): an
    align there would race it, so its copies are refused whole and left as they are."""
    copies = [c for dep in deployments if dep.engine == "vllm" for c in dep.copies]
    found = daemon.running() if copies else []
    for copy in copies:
        if (d := daemon.writing(copy, found)) is not None:
            raise Refused(
                f"{d.describe()}; align leaves this dir to it (its tuning and D2D seeding "
                "replace these files): align once the daemon has exited",
                copy,
            )


def _unreadable(dep: Deployment, problems: Sequence[ScanProblem]) -> list[ScanProblem]:
    """The rank files of `dep`, in any copy, that could not be read (corrupt, not UTF-8, no
    permission): each is that rank's only record of its entries."""
    return [
        p
        for p in problems
        if p.path.parent in dep.copies and p.path.name == file_name(dep.engine, rank_name(p.path))
    ]


def _refuse_lone_unreadable(
    problems: Sequence[ScanProblem], deployments: Sequence[Deployment]
) -> None:
    """A rank file no deployment holds: every rank file of its dir is unreadable. (SGLang's
    write-only runs/ copies are never read back: not align's to judge.)"""
    for p in problems:
        found = classify_file(p.path)
        if found.rank is None or found.run is not None:
            continue
        if not any(p in _unreadable(dep, [p]) for dep in deployments):
            raise p.error()


def _mode(copy: Path) -> int:
    """New files take the mode of the copy's existing rank files (FlashInfer's own is 0600)."""
    for path in sorted(copy.glob("*.json")):
        with contextlib.suppress(OSError):
            return stat.S_IMODE(path.stat().st_mode)
    return DEFAULT_MODE


def apply(
    paths: Sequence[Path],
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    expected: Sequence[Expected] = (),
    store: Path | None = None,
) -> list[GroupPlan]:
    """Align for real: each copy locked, the plan made again under the locks (so nothing read
    before another align finished is written back), then every changed file replaced. Copies
    in `store`'s namespaces: each namespace locked first and refused if pinned (Refused)."""
    first = plan(paths, expected)
    if not any(gp.writes for gp in first):
        return first  # aligned already, or refused: nothing to lock, nothing written
    copies = sorted({c for gp in first if gp.writes for c in gp.deployment.copies})
    spaces = sorted({ns for c in copies if store and (ns := pins.namespace_of(c, store))})
    with contextlib.ExitStack() as stack:
        for ns in spaces:  # as warm: a pin, a warm and an align of a namespace take turns
            stack.enter_context(locks.namespace_lock(ns, "align", timeout))
            if pins.pinned(ns) is not None:
                raise pins.refusal(ns, "align")
        for copy in copies:  # sorted: two aligns of overlapping copies cannot deadlock
            stack.enter_context(locked(copy / _LOCK_NAME, timeout))
        plans = plan(paths, expected)
        writes = []
        for gp in plans:
            if gp.aligned is None:
                continue
            data = v1.dumps(gp.aligned.file).encode()
            for path, created in gp.writes:
                mode = _mode(path.parent) if created else stat.S_IMODE(path.stat().st_mode)
                writes.append((path, data, mode))
        replace_all(writes)  # all staged, then all renamed: a full disk replaces none
    return plans


@dataclass(frozen=True)
class Filled:
    """What `fill` did: the files written, and each deployment left as it was with why."""

    written: tuple[Path, ...]
    refused: tuple[tuple[Deployment, str], ...]


def fill(
    missing: Sequence[Path], deployments: Sequence[Deployment], store: Path | None = None
) -> Filled:
    """Write the rank files `missing` (this node's, none on disk yet) as the union of the other
    ranks of their deployment, so the engine finds every rank's file and nobody tunes again.
    A deployment align refuses (rank-keyed MoE entries only their own rank can tune, another
    environment) gets nothing. `store`: its namespaces are locked and their pin checked, as
    align does. Raises FiCacheError (a lock held too long), Refused (pinned meanwhile)."""
    expected = [
        Expected(dep.engine, (*dep.ranks, *mine), mine, dep.key)
        for dep in deployments
        if (mine := tuple(rank_name(p) for p in missing if p.parent.name == dep.key))
    ]
    if not expected:
        return Filled((), ())
    plans = apply(sorted({p.parent for p in missing}), expected=expected, store=store)
    written = tuple(p for gp in plans if gp.aligned is not None for p, _ in gp.writes)
    refused = tuple((gp.deployment, gp.problem or "") for gp in plans if gp.aligned is None)
    return Filled(written, refused)
