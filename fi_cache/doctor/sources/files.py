"""The cache files a diagnosis looks at: the store's namespaces, the engine's own cache dir and
the PATHs given, each with what the store knows of it and whether the target loads it; temp
files of killed writers; file modes (for sharing advice)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fi_cache.caches.discover import ScanProblem, leftover_mtime, tmp_leftovers
from fi_cache.caches.inventory import Cache, scan
from fi_cache.doctor.inputs import CacheView, Target
from fi_cache.errors import CorruptCache
from fi_cache.store import manifest as manifests
from fi_cache.store.manifest import Manifest
from fi_cache.store.namespace import NAMESPACES_DIR, FinalizeMode, Namespace, namespace_parts
from fi_cache.versions import VLLM_CACHE_FILE_RE


@dataclass(frozen=True)
class Files:
    caches: tuple[CacheView, ...] = ()
    problems: tuple[ScanProblem, ...] = ()
    tmp_files: tuple[tuple[Path, float], ...] = ()  # (path, age in seconds)
    modes: dict[Path, int] = field(default_factory=dict)
    empty: tuple[Path, ...] = ()  # PATHs given that hold no cache at all
    logs_as_paths: tuple[Path, ...] = ()  # PATHs that are text logs, not caches


@dataclass(frozen=True)
class Scanned:
    """The caches found, before they are judged against a target."""

    implicit: tuple[Cache, ...]
    given: tuple[Cache, ...]
    problems: tuple[ScanProblem, ...]
    roots: tuple[Path, ...]
    empty: tuple[Path, ...]
    logs_as_paths: tuple[Path, ...]

    def gpu_names(self) -> set[str]:
        """The GPU names the caches' `_metadata` record."""
        return {g for c in (*self.implicit, *self.given) if (g := c.fingerprint.gpu)}


def read(store: Path, paths: Sequence[Path], predicted: Path) -> Scanned:
    """The store's caches, the engine's dir's (when outside the store) and the PATHs'."""
    from fi_cache.doctor.logs import looks_like_log  # not for serve's pre-flight

    roots = [store / NAMESPACES_DIR]
    if predicted.is_dir() and store not in predicted.parents:
        roots.append(predicted)
    inv = scan([r for r in roots if r.is_dir()], explicit=False)
    given = scan(paths)
    # A log named where a cache goes is not a corrupt cache: it is refused with a pointer to --log.
    as_logs = {
        p
        for p in paths
        if p.is_file() and not VLLM_CACHE_FILE_RE.match(p.name) and looks_like_log(p)
    }
    bad_given = [p for p in given.problems if not (p.check == "corrupt-file" and p.path in as_logs)]
    return Scanned(
        tuple(inv.caches),
        tuple(given.caches),
        (*inv.problems, *bad_given),
        tuple(roots),
        tuple(given.empty),
        tuple(sorted(as_logs)),
    )


def judged(scanned: Scanned, store: Path, paths: Sequence[Path], target: Target) -> Files:
    """Each cache once, with its namespace, manifest and whether the target loads it."""
    problems = list(scanned.problems)
    ours = _target_namespace(target, store)
    views: list[CacheView] = []
    modes: dict[Path, int] = {}
    manifest_memo: dict[Path, Manifest | None] = {}
    with contextlib.suppress(OSError):
        modes[store] = store.stat().st_mode  # a private store (0700) wants no sharing advice
    seen: set[Path] = set()
    named = {c.path.resolve() for c in scanned.given}
    for cache in [*scanned.implicit, *scanned.given]:
        if (key := cache.path.resolve()) in seen:
            continue  # a PATH inside the store or vLLM's dir: check it once
        seen.add(key)
        parts = namespace_parts(cache.path, store)
        ns_dir = Path(parts["dir"]) if parts else None
        manifest = None
        if ns_dir is not None:
            if ns_dir not in manifest_memo:
                try:
                    manifest_memo[ns_dir] = manifests.load(ns_dir)
                except CorruptCache as exc:
                    manifest_memo[ns_dir] = None
                    problems.append(
                        ScanProblem(Path(exc.path or ns_dir), "corrupt-file", exc.message)
                    )
            manifest = manifest_memo[ns_dir]
            for p in (cache.path, *cache.path.parents):
                with contextlib.suppress(OSError):
                    modes[p] = p.stat().st_mode
                if p == ns_dir:
                    break
        finalize = parts["finalize"] if parts else None
        why_not = _applies(cache, ns_dir, ours, target)
        views.append(
            CacheView(
                cache,
                ns_dir,
                finalize,
                manifest,
                cache.defects(),
                why_not is None,
                why_not or "",
                key in named,
            )
        )
    tmp = _leftovers([store, *(r for r in scanned.roots if store not in r.parents), *paths])
    return Files(tuple(views), tuple(problems), tmp, modes, scanned.empty, scanned.logs_as_paths)


def in_namespace(
    cache_dir: Path, ns_dir: Path, finalize: str, m: Manifest | None
) -> tuple[tuple[CacheView, ...], tuple[ScanProblem, ...]]:
    """The caches under one namespace's engine dir (serve's pre-flight), seen as that
    namespace's: the store's other namespaces and temp files are not looked at."""
    if not cache_dir.is_dir():
        return (), ()
    inv = scan([cache_dir], explicit=False)
    return tuple(CacheView(c, ns_dir, finalize, m, c.defects()) for c in inv.caches), tuple(
        inv.problems
    )


def _leftovers(roots: Sequence[Path]) -> tuple[tuple[Path, float], ...]:
    """Temp files of killed writers under the roots, each once, with its age."""
    now = time.time()
    tmp = []
    seen: set[Path] = set()
    # The whole store, not only its namespaces: killed imports and pulls leave theirs at the top.
    for root in roots:
        if root.is_dir():
            for t in tmp_leftovers(root):
                if (key := t.resolve()) in seen:
                    continue  # a PATH inside the store: report it once
                seen.add(key)
                try:
                    tmp.append((t, now - leftover_mtime(t)))
                except OSError:
                    continue
    return tuple(tmp)


def _target_namespace(target: Target, store: Path) -> Path:
    mode: FinalizeMode = "unfused" if target.finalize == "unfused" else "fused"
    return Namespace(target.fingerprint, mode).path(store)


def _applies(cache: Cache, ns_dir: Path | None, ours: Path, target: Target) -> str | None:
    """Why the target never loads this cache, or None when it may: it loads only its own
    namespace of the store, and only its version and arch dir of a vLLM cache root."""
    if ns_dir is not None:
        if ns_dir == ours:
            return None
        return f"it is in another namespace of the store; the target's is {ours}"
    fp, found = target.fingerprint, cache.found
    if found.layout == "vllm":
        if fp.flashinfer_version and found.dir_version != fp.flashinfer_version:
            return (
                f"vLLM keeps FlashInfer {found.dir_version}'s caches in their own dir; the "
                f"target (FlashInfer {fp.flashinfer_version}) reads .../{fp.flashinfer_version}/"
                f"{fp.arch or found.arch}/"
            )
        if fp.arch and found.arch != fp.arch:
            return f"it is in the {found.arch} dir; the target's GPU arch is {fp.arch}"
    if found.layout == "sglang" and target.sglang_version is not None:
        if fp.flashinfer_version and found.dir_version != fp.flashinfer_version:
            return (
                f"SGLang keeps FlashInfer {found.dir_version}'s files in their own dir; the "
                f"target runs FlashInfer {fp.flashinfer_version}"
            )
        one = re.fullmatch(r"(\d+)[af]?", fp.arch or "")  # one GPU kind: FlashInfer's "90a"
        if one and found.arch and found.arch != f"sm{one.group(1)}":
            return f"it is in the {found.arch} dir; the target's GPU is sm{one.group(1)}"
    return None
