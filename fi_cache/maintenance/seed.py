"""Seed the files an engine's next start will read (vLLM's config-hash dir, SGLang's key dir)
from the namespace's earlier files for the same model, so a changed hash (an upgrade, another
flag, the model given by another path) does not mean tuning again.

Why it is safe: a namespace is one FlashInfer version, GPU, CUDA stack and finalize mode, so
every entry in it is valid for every start on it; FlashInfer's entries depend on the op and its
shapes only. Why only the same model: on FlashInfer <= 0.6.17 MoE keys carry no quantisation
flags, so two models with equal shapes but other quantisation would share keys and must never
share entries. Per-rank files are seeded rank by rank (same file name): on FlashInfer
0.6.18-0.7.1 MoE keys carry the rank.

`plan` is pure over what it reads; `write` goes through the store's atomic writer. The caller
holds the namespace lock across both. While the engine is already starting (the files it reads
known only seconds later), `create` places a seed only where the engine has written nothing, and
`kept` says afterwards whether the engine read it or replaced it with its own tuning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.errors import FiCacheError
from fi_cache.maintenance.merge import merge, read_source
from fi_cache.model import v1
from fi_cache.store.files import (
    Stamp,
    atomic_write,
    create_new,
    prune_empty,
    remove_file,
    stamp_of,
)
from fi_cache.store.manifest import Manifest, WarmRecord
from fi_cache.store.paths import Unconfined, confined


@dataclass(frozen=True)
class Seed:
    """One file to write before the engine starts: `target` (inside the namespace) from
    `sources`."""

    target: Path
    file: v1.CacheFile
    sources: tuple[Path, ...]

    @property
    def entries(self) -> int:
        return len(self.file.entries)


# May this earlier warm's files seed this start (the same model, tactics the engine would reuse)?
Usable = Callable[[WarmRecord], bool]


def sources_for(
    ns_dir: Path,
    manifest: Manifest | None,
    usable: Usable,
    name: str,
    exclude: Iterable[Path] = (),
    engine: str = "vllm",
) -> list[Path]:
    """The namespace's files named `name` that earlier successful warms of the model by `engine`
    recorded, newest warm first, each once; `exclude` (what doctor's checks flagged) never
    counts."""
    if manifest is None:
        return []
    skip = {p.resolve() for p in exclude}
    found: list[Path] = []
    for warm in sorted(manifest.warms, key=lambda w: w.started, reverse=True):
        if not warm.ok or warm.engine != engine or not usable(warm):
            continue
        for f in warm.files:
            try:  # never a file outside the namespace, whatever the manifest says
                path = confined(ns_dir, f.path)
            except Unconfined:
                continue
            fits = path.name == name and path.is_file() and path.resolve() not in skip
            if fits and path not in found:
                found.append(path)
    return found


def plan(
    ns_dir: Path,
    manifest: Manifest | None,
    usable: Usable,
    targets: Sequence[Path],
    exclude: Iterable[Path] = (),
    engine: str = "vllm",
) -> tuple[list[Seed], list[str]]:
    """(seeds, notes): a seed for each target that does not exist yet and has sources; a note
    for each source that cannot be used (corrupt, another environment's metadata)."""
    excluded = list(exclude)
    seeds: list[Seed] = []
    notes: list[str] = []
    for target in targets:
        if target.exists():
            continue  # vLLM reads what is there; never overwrite a file it wrote
        readable: list[tuple[str, v1.CacheFile]] = []
        for src in sources_for(ns_dir, manifest, usable, target.name, excluded, engine):
            if src.parent == target.parent:
                continue
            try:
                readable.append((str(src), read_source(src)))
            except FiCacheError as exc:
                notes.append(f"not a seed source: {src}: {exc.message}")
        if not readable:
            continue
        try:
            merged = merge(readable, prefer="first")  # the newest warm's choice wins a conflict
        except FiCacheError as exc:  # _metadata differs: files from two environments
            notes.append(f"not seeding {target}: {exc.message}")
            continue
        if merged.entries:
            seeds.append(Seed(target, merged.file, tuple(Path(n) for n, _ in readable)))
    return seeds, notes


def write(seed: Seed) -> Stamp | None:
    """Atomically, in FlashInfer's own format (`_generation` as that version writes it)."""
    atomic_write(seed.target, v1.dumps(seed.file).encode(), lock=False)
    return stamp_of(seed.target)


def create(seed: Seed) -> Stamp | None:
    """Write the seed only if the engine has not written its own file first (None then)."""
    return create_new(seed.target, v1.dumps(seed.file).encode())


def kept(seed: Seed, placed: Stamp) -> bool:
    """Does the target still hold every seeded entry as seeded: untouched since `placed`, or
    the engine added its own tuning to what it read? False when the engine replaced it (it
    looked for the file before the seed landed, tuned and saved its own)."""
    if stamp_of(seed.target) == placed:
        return True
    try:
        now = read_source(seed.target)
    except FiCacheError:
        return False
    return all(now.entries.get(key) == value for key, value in seed.file.entries.items())


def remove_unread(seed: Seed, placed: Stamp) -> bool:
    """Remove a seed the engine never read (it used another dir), if it is still exactly what
    was placed; its directory too when that is left empty. True when removed."""
    if stamp_of(seed.target) != placed:
        return False
    remove_file(seed.target)
    prune_empty(seed.target.parent)  # the hash dir it made, when nothing else is in it
    return True
