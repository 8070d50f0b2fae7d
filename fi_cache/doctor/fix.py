"""doctor --fix: a plan of safe remedies first (shown by --dry-run), then applied.

Safe means reversible or trivially so: stale, foreign and corrupt caches are moved into the
store's quarantine folder with a note of why (never deleted); temp files of killed writers
older than 10 minutes are deleted. Nothing in a pinned namespace (`fi-cache pin`) is touched:
such actions are held back, and each is checked again under the namespace's lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fi_cache.caches.discover import STAGING_PREFIX, TMP_MAX_AGE_S
from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Inputs
from fi_cache.store import files, locks, quarantine, trash
from fi_cache.store import pin as pins
from fi_cache.store.files import DEFAULT_LOCK_TIMEOUT
from fi_cache.versions import VLLM_CACHE_FILE_RE

QUARANTINE_DIR = "quarantine"
_QUARANTINE_CHECKS = {"stale-gemm2-profile", "foreign-environment", "corrupt-file"}


@dataclass(frozen=True)
class Action:
    kind: Literal["quarantine", "remove"]
    path: Path
    why: str


def movable(inputs: Inputs) -> set[str]:
    """The paths --fix would quarantine for an error finding: caches it read, never a log."""
    # v1 files only: a bad v2 entry is a miss for FlashInfer, not a reason to move its whole store.
    caches = {str(v.cache.path) for v in inputs.caches if v.cache.found.format == "v1"}
    # A file refused unread (too large, no permission) is not known to be bad: leave it. A bad
    # file is moved only where a cache belongs (vLLM's file names, the store), never a stray file.
    caches |= {
        str(p.path)
        for p in inputs.problems
        if p.exit_code == 1 and _cache_place(p.path, inputs.store)
    }
    return caches


def quarantine_text(inputs: Inputs, path: str | None, otherwise: str) -> str:
    """What a fix text may promise about --fix for this path: only what plan() will do."""
    if path is not None and path in movable(inputs):
        return "doctor --fix quarantines it"
    return otherwise


def plan(findings: list[Finding], inputs: Inputs) -> list[Action]:
    """What --fix would do. Only paths known to be caches (never a log) are moved."""
    caches = movable(inputs)
    actions: dict[Path, Action] = {}
    for f in findings:
        if f.path is None:
            continue
        path = Path(f.path)
        if f.check in _QUARANTINE_CHECKS and f.severity == "error" and f.path in caches:
            if path.exists() and path not in actions:
                actions[path] = Action("quarantine", path, f"{f.check}: {f.message}")
        elif f.check == "tmp-leftover" and f.severity == "warning":
            what = "staging dir" if path.name.startswith(STAGING_PREFIX) else "temp file"
            actions[path] = Action("remove", path, f"{what} older than {TMP_MAX_AGE_S // 60} min")
    return list(actions.values())


def _cache_place(path: Path, store: Path | None) -> bool:
    in_store = store is not None and store.resolve() in path.resolve().parents
    return in_store or VLLM_CACHE_FILE_RE.match(path.name) is not None


def hold_pinned(
    actions: list[Action], store: Path
) -> tuple[list[Action], list[tuple[Action, Path]]]:
    """(the actions --fix may carry out, those held back with the pinned namespace each is in)."""
    kept: list[Action] = []
    held: list[tuple[Action, Path]] = []
    for action in actions:
        ns = pins.namespace_of(action.path, store)
        if ns is not None and pins.pinned(ns) is not None:
            held.append((action, ns))
        else:
            kept.append(action)
    return kept, held


def apply(
    actions: list[Action], store: Path, timeout: float = DEFAULT_LOCK_TIMEOUT
) -> list[tuple[Action, Path | None]]:
    """Carry out the plan; returns each action with where a quarantined thing went. An action
    in a namespace pinned since the plan is left out (checked under the namespace's lock)."""
    folder = store / QUARANTINE_DIR / time.strftime("%Y%m%d-%H%M%S")
    done: list[tuple[Action, Path | None]] = []
    for action in actions:
        ns = pins.namespace_of(action.path, store)
        with locks.namespace_lock_if_any(ns, "doctor --fix", timeout):  # as a warm or pin
            if ns is not None and pins.pinned(ns) is not None:
                continue  # pinned since the plan: its files stay as they are
            done.append((action, _carry_out(action, folder)))
    return done


def _carry_out(action: Action, folder: Path) -> Path | None:
    if action.kind == "quarantine":
        return quarantine.move_aside(action.path, folder, action.why)
    if action.path.is_dir() and not action.path.is_symlink():
        trash.remove_tree(action.path, action.path.parent)  # a staging dir: at its store top
    else:
        files.remove_file(action.path)
    return None
