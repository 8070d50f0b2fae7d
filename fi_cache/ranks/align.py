"""Make one deployment's rank files agree the way its engine requires, losing no entry.

Every rank gets the same file: the union of the ranks' entries (maintenance.merge's union, ranks
in order, so a rank-free key two ranks answer differently keeps the lowest rank's tactic, each
such choice reported). Rank-keyed MoE entries (FlashInfer 0.6.18-0.7.1) are unique to their rank
and kept as they are: every rank hits its own. That satisfies vLLM's gate (equal `_metadata`,
equal counts) and SGLang's digest (equal content on every TP rank).

Refused, nothing changed, where aligning would make things worse: a rank file `fi-cache verify`
rejects (its bad value would reach every rank), ranks from different
environments (their `_metadata` differ: that rank must be tuned on its own stack), and a rank
that lacks its own entry for a MoE shape other ranks tuned (the gate would pass, that rank would
then profile alone inside a collective the others skip: the hang of vllm #57423).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fi_cache.errors import FiCacheError
from fi_cache.model import v1
from fi_cache.model.union import Conflict, merge, unloadable
from fi_cache.ranks.agreement import RankFile
from fi_cache.ranks.keys import rank_free


class CannotAlign(FiCacheError):
    """Aligning would lose data or hang the next start; the message says which ranks and why."""


@dataclass(frozen=True)
class Aligned:
    """The file every rank gets, what was chosen where ranks disagreed, which ranks had none."""

    file: v1.CacheFile
    chosen: list[Conflict]  # kept: the lowest rank's value; dropped: another rank's
    created: tuple[str, ...]  # ranks that had no readable file


def _own_gaps(group: Sequence[RankFile]) -> dict[str, int]:
    """Per rank, how many rank-keyed MoE shapes other ranks hold and it does not."""
    owned: dict[str, set[str]] = {}
    for rf in group:
        if rf.file is None:
            continue
        keyed = (rank_free(raw) for raw in rf.file.entries)
        owned[rf.rank] = {free for free, has_rank in keyed if has_rank}
    every = set().union(*owned.values()) if owned else set()
    gaps = {r: len(every - mine) for r, mine in owned.items() if every - mine}
    if every:  # a missing rank lacks all of them
        gaps.update({rf.rank: len(every) for rf in group if rf.file is None})
    return gaps


def align(group: Sequence[RankFile]) -> Aligned:
    """The aligned file for `group` (ranks in the engine's order, rank 0 first)."""
    present = [(rf.rank, rf.file) for rf in group if rf.file is not None]
    if not present:
        raise CannotAlign("no rank has a readable file: warm the deployment first")
    for rf in group:  # what verify rejects would reach every rank (merge refuses it too)
        if rf.file is not None and (why := unloadable(rf.file)) is not None:
            raise CannotAlign(f"{rf.rank}'s file {rf.path}: {why} (see `fi-cache verify`)")
    gaps = _own_gaps(group)
    if gaps:
        shown = ", ".join(f"{r} ({n})" for r, n in list(gaps.items())[:6])
        raise CannotAlign(
            f"rank-keyed MoE entries (FlashInfer 0.6.18-0.7.1 keys carry the rank) are missing "
            f"on {shown}: only that rank can tune them, and with the others aligned it would "
            "profile alone at the next start; warm every rank together"
        )
    try:
        result = merge(present, prefer="first")
    except FiCacheError as exc:
        raise CannotAlign(
            f"the ranks were tuned in different environments ({exc.message}): tune that "
            "rank or node on the deployment's stack; align keeps ranks of one environment only"
        ) from None
    created = tuple(rf.rank for rf in group if rf.file is None)
    return Aligned(result.file, result.conflicts, created)
