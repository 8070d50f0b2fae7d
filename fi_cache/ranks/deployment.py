"""The rank files of one deployment, gathered from the caches found on disk: one vLLM hash dir
or one SGLang key dir, possibly in several copies (one per node, or a node's and a bundle's).

Without the deployment's arguments the ranks are inferred from the names: vLLM 0.32+'s
`dp{d}_rank{r}` with r the world rank when vLLM folds data parallelism into the world group
(MoE with dp > 1: r = d * L + local rank, L = tp * pp), or the local rank when it does not
(elastic EP: each DP engine its own group); SGLang's `rank_tp{t}_pp{p}_dp{d}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fi_cache.caches.inventory import Cache
from fi_cache.ranks import MAX_RANKS
from fi_cache.ranks.agreement import RankFile

EngineName = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class Deployment:
    """One deployment's rank files: `files[(copy, rank)]`, copies in the order given."""

    engine: EngineName
    key: str  # the hash dir's name
    copies: tuple[Path, ...]
    ranks: tuple[str, ...]  # every rank named in any copy, or inferred missing, engine order
    files: dict[tuple[Path, str], Cache] = field(default_factory=dict)
    inferred: tuple[str, ...] = ()  # ranks no copy holds, inferred from the others' names
    # (with the engine's arguments, `ranks` come from them and nothing is inferred)
    # Ranks no copy holds that other nodes write (the engine's arguments say so): not given
    # here, so whether they agree is not known.
    elsewhere: tuple[str, ...] = ()
    # Why no missing rank was inferred where names would have allowed it (a stray rank number).
    note: str | None = None
    # The engine's tune groups when its arguments say (vLLM with pp > 1: each stage's TP group);
    # () : inferred from the names (groups()).
    tune_groups: tuple[tuple[str, ...], ...] = ()

    def rank_files(self) -> list[RankFile]:
        """Each rank's file as the deployment would read it: the first copy that holds it."""
        out = []
        for rank in self.ranks:
            held = [self.files[(c, rank)] for c in self.copies if (c, rank) in self.files]
            if held:
                out.append(RankFile(rank, str(held[0].path), held[0].file))
            else:
                path = self.copies[0] / file_name(self.engine, rank)
                out.append(RankFile(rank, str(path), None, "missing"))
        return out

    def groups(self) -> list[list[RankFile]]:
        """The ranks that load or re-tune together (vLLM: the world group; without the fold,
        each DP engine; SGLang: the ranks that compare digests)."""
        files = self.rank_files()
        if self.tune_groups:
            by_rank = {rf.rank: rf for rf in files}
            told = [[by_rank[r] for r in g if r in by_rank] for g in self.tune_groups]
            named = {r for g in self.tune_groups for r in g}
            rest = [rf for rf in files if rf.rank not in named]  # a file the arguments name not
            return [g for g in [*told, rest] if g]
        if self.engine == "vllm":
            parsed = [vllm_rank(rf.rank) for rf in files]
            folded = len({r for _, r in parsed}) == len(parsed)
            if folded:
                return [files]
            by_dp: dict[int, list[RankFile]] = {}
            for (dp, _), rf in zip(parsed, files, strict=True):
                by_dp.setdefault(dp, []).append(rf)
            return list(by_dp.values())
        return sglang_groups(files)


def vllm_rank(name: str) -> tuple[int, int]:
    dp, _, rank = name.removeprefix("dp").partition("_rank")
    return int(dp), int(rank)


def sglang_rank(name: str) -> tuple[int, int, int]:
    """(tp, pp, dp) of `tp{t}_pp{p}_dp{d}[_gpu…]`."""
    parts = name.split("_")
    return int(parts[0][2:]), int(parts[1][2:]), int(parts[2][2:])


def _spans_dp(parsed: Sequence[tuple[int, int, int]]) -> set[int]:
    """PP stages whose TP ranks are numbered across DP ranks: --enable-dp-attention, where one
    TP group holds every attention-DP rank (dp = tp // attn_tp; data_parallel_controller.py
    0.5.23:717-743). Plain DP replicas each number their TP ranks from 0."""
    out = set()
    for pp in {p for _, p, _ in parsed}:
        mine = [(t, d) for t, p, d in parsed if p == pp]
        tps = [t for t, _ in mine]
        if len({d for _, d in mine}) > 1 and len(set(tps)) == len(tps):
            out.add(pp)
    return out


def sglang_groups(files: Sequence[RankFile]) -> list[list[RankFile]]:
    """SGLang's digest compares the files of one TP group: one PP stage of one DP replica, or
    of every attention-DP rank under --enable-dp-attention."""
    parsed = [sglang_rank(rf.rank) for rf in files]
    spans = _spans_dp(parsed)
    by_group: dict[tuple[int, ...], list[RankFile]] = {}
    for (_, pp, dp), rf in zip(parsed, files, strict=True):
        by_group.setdefault((pp,) if pp in spans else (pp, dp), []).append(rf)
    return list(by_group.values())


def file_name(engine: EngineName, rank: str) -> str:
    return f"autotune_configs_{rank}.json" if engine == "vllm" else f"rank_{rank}.json"


def rank_name(path: str | Path) -> str:
    """The rank a rank file's name names (`file_name` backwards), e.g. "dp1_rank2"."""
    return Path(path).stem.removeprefix("autotune_configs_").removeprefix("rank_")


def rank_of(cache: Cache) -> tuple[EngineName, str] | None:
    """The engine and rank name of a per-rank file; None for other caches (vLLM's one shared
    `autotune_configs.json`, SGLang's write-only runs/ copies, v2 stores, plain files)."""
    found = cache.found
    if found.format != "v1" or found.rank is None:
        return None
    if found.layout == "sglang" and found.run is None:
        tp, pp, dp = found.rank
        suffix = f"_gpu{found.gpu_uuid}" if found.gpu_uuid else ""
        return "sglang", f"tp{tp}_pp{pp}_dp{dp}{suffix}"
    if found.layout in ("vllm", "vllm-override", "file") and len(found.rank) == 2:
        return "vllm", f"dp{found.rank[0]}_rank{found.rank[1]}"
    return None


def _order(engine: EngineName, rank: str) -> tuple[int, ...]:
    if engine == "vllm":
        dp, r = vllm_rank(rank)
        return (r, dp)
    tp, pp, dp = sglang_rank(rank)
    return (dp, pp, tp)


def _beyond(top: int) -> str | None:
    """Why ranks up to `top` are not inferred: no real world has that many (a stray name such as
    `..._rank2000000.json` would make align plan, and doctor check, millions of files)."""
    if top < MAX_RANKS:
        return None
    return f"rank {top} is beyond any real world (max {MAX_RANKS}): not inferring missing ranks"


def _missing_vllm(ranks: set[str]) -> tuple[set[str], str | None]:
    """World ranks below the highest one that no copy holds (vLLM's fold: r = dp * L + local),
    and a note when the highest is past MAX_RANKS (nothing inferred then)."""
    parsed = [vllm_rank(r) for r in ranks]
    world = {r for _, r in parsed}
    if len(world) != len(parsed):
        return set(), None  # no fold: each DP engine numbers its own ranks; nothing to infer
    top = max(world)
    if (note := _beyond(top)) is not None:
        return set(), note
    width = next(
        (w for w in range(1, top + 2) if all(dp == r // w for dp, r in parsed)), None
    )  # L = tp * pp, the smallest one every name agrees with
    if width is None:
        return set(), None
    return {f"dp{r // width}_rank{r}" for r in range(top + 1) if r not in world}, None


def _missing_sglang(ranks: set[str]) -> tuple[set[str], str | None]:
    """TP ranks below the deployment's highest one that no copy holds, in every PP stage and
    DP rank seen, and a note when the highest is past MAX_RANKS (nothing inferred then)."""
    parsed = [sglang_rank(r) for r in ranks if "_gpu" not in r]
    if (note := _beyond(max((t for t, _, _ in parsed), default=-1))) is not None:
        return set(), note
    spans = _spans_dp(parsed)
    out = set()
    for pp in spans:  # dp-attention: dp = tp // attn_tp, attn_tp the narrowest fit
        mine = [(t, d) for t, p, d in parsed if p == pp]
        top = max(t for t, _ in mine)
        width = next((w for w in range(1, top + 2) if all(d == t // w for t, d in mine)), None)
        if width is not None:
            out |= {f"tp{t}_pp{pp}_dp{t // width}" for t in range(top + 1)}
    rest = [(t, p, d) for t, p, d in parsed if p not in spans]
    top = max((t for t, _, _ in rest), default=-1)  # one TP size for every stage and replica
    for pp, dp in {(p, d) for _, p, d in rest}:
        out |= {f"tp{t}_pp{pp}_dp{dp}" for t in range(top + 1)}
    return out - ranks, None


@dataclass(frozen=True)
class Expected:
    """The ranks the engine's own rule names for a deployment from its arguments: all of them
    and this node's. `key` None: any deployment of the engine whose ranks are among them
    (SGLang's key hash needs the model's HF config, known on the worker)."""

    engine: EngineName
    ranks: tuple[str, ...]
    here: tuple[str, ...]
    key: str | None = None
    groups: tuple[tuple[str, ...], ...] = ()  # its tune groups, when not the names' (pp > 1)

    def fits(self, engine: EngineName, key: str, ranks: set[str]) -> bool:
        if engine != self.engine or (self.key is not None and self.key != key):
            return False
        return self.key is not None or ranks <= set(self.ranks)


def gather(
    caches: Iterable[Cache],
    copies: Sequence[Path] = (),
    expected: Sequence[Expected] = (),
) -> list[Deployment]:
    """Group per-rank files into deployments by engine and hash dir name; `copies` are hash
    dirs given that may hold none of them yet (a cold node's), kept as copies of every
    deployment of the same name; `expected`: the ranks the engine's own answer names (vLLM's
    predict, SGLang's rank_layout), which replace the inference from names."""
    found: dict[tuple[EngineName, str], dict[tuple[Path, str], Cache]] = {}
    order: dict[tuple[EngineName, str], list[Path]] = {}
    for cache in caches:
        named = rank_of(cache)
        if named is None:
            continue
        engine, rank = named
        copy = cache.path.parent
        key = (engine, copy.name)
        found.setdefault(key, {})[(copy, rank)] = cache
        seen = order.setdefault(key, [])
        if copy not in seen:
            seen.append(copy)
    out = []
    for (engine, name), files in found.items():
        extra = [c for c in copies if c.name == name and c not in order[(engine, name)]]
        ranks = {rank for _, rank in files}
        told = next((e for e in expected if e.fits(engine, name, ranks)), None)
        note = None
        if told is not None:
            missing = set(told.ranks) - ranks
            away = missing - set(told.here)
        else:
            missing, note = (_missing_vllm if engine == "vllm" else _missing_sglang)(ranks)
            away = set()

        def ordered(names: set[str], engine: EngineName = engine) -> tuple[str, ...]:
            return tuple(sorted(names, key=lambda r: _order(engine, r)))

        out.append(
            Deployment(
                engine,
                name,
                (*order[(engine, name)], *extra),
                ordered(ranks | missing),
                files,
                ordered(missing) if told is None else (),
                ordered(away),
                note,
                told.groups if told is not None else (),
            )
        )
    return out
