"""This node's rank files across an import. A deployment across nodes (vLLM 0.32+ MoE with
`-dp`, SGLang `--nnodes`) keeps one file per rank and each node writes only its own, so a bundle
pushed from the tuning node holds that node's ranks, not this one's: replacing the namespace
would leave this node without its files, and at the next start every rank tunes again (vLLM's
gate) or every file is deleted (SGLang's digest). The ranks this node held before the import
that the bundle lacks are written again as the union of the bundle's ranks (align.fill)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fi_cache.caches.discover import named_rank_files
from fi_cache.caches.inventory import scan
from fi_cache.errors import FiCacheError
from fi_cache.ranks.deployment import gather


@dataclass(frozen=True)
class NodeRanks:
    """What an import did for this node's rank files: written anew, and left out with why."""

    filled: tuple[Path, ...] = ()
    refused: tuple[str, ...] = ()

    def warnings(self) -> list[str]:
        """What an operator must hear about the files not kept (import's and serve's words)."""
        return [
            f"this node's rank files were not kept ({why}): every rank tunes again"
            for why in self.refused
        ]


def own_rank_files(ns_dir: Path) -> tuple[Path, ...]:
    """The rank files in a namespace before an import, by name alone (relative to it)."""
    return tuple(f.path.relative_to(ns_dir) for f in named_rank_files(ns_dir))


def keep(store: Path, before: Mapping[str, tuple[Path, ...]]) -> NodeRanks:
    """After the namespaces `before` names were replaced: fill each rank file they held that
    is now missing beside the same deployment's files from the bundle."""
    from fi_cache.maintenance.align import fill

    filled: list[Path] = []
    refused: list[str] = []
    for ns_path, rels in before.items():
        ns_dir = store / ns_path
        gone = [ns_dir / rel for rel in rels if not (ns_dir / rel).exists()]
        if not gone:
            continue
        deployments = gather(scan([ns_dir], explicit=False).caches)
        copies = {c for dep in deployments for c in dep.copies}
        missing = [p for p in gone if p.parent in copies]  # a deployment the bundle lacks is gone
        names = ", ".join(p.name for p in missing)
        try:
            done = fill(missing, deployments)
        except FiCacheError as exc:
            refused.append(f"{names}: {exc.message}")
            continue
        filled.extend(done.written)
        refused.extend(f"{names}: {problem}" for _, problem in done.refused)
    return NodeRanks(tuple(filled), tuple(refused))
