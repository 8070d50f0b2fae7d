"""Find caches in every layout vLLM and FlashInfer have used.

- vLLM 0.25-0.33: `<root>/<fi-version>/<arch>/<64-hex>/autotune_configs.json`, 0.32+ per-rank
  `autotune_configs_dp{d}_rank{r}.json`; with `VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=D` the version
  and arch levels are gone: `D/<64-hex>/autotune_configs*.json`.
- SGLang 0.5.12+: `$SGLANG_CACHE_DIR/flashinfer/autotune/<fi-version>/sm<NN>/<16-hex>/
  rank_tp{t}_pp{p}_dp{d}[_gpu<uuid>].json`, and with `SGLANG_FLASHINFER_AUTOTUNE_CACHE=0`
  write-only `<16-hex>/runs/rank_…<stamp>[.<uuid4>].json` (versions/sglang.py).
- FlashInfer v2 store: `<root>/v2/<env_hash16>/{manifest.json, entries/}`.
- Plain v1 files anywhere (`autotune(cache="my.json")`), recognised by their first bytes, and
  `autotune_config.json` (what FlashInfer dumps are named; no vLLM reads it) by its name.
Two v1 files are told apart from the engine's own (`Found.role`): that FlashInfer dump, and the
sparse-MLA decode warmup's `autotune_configs.json` in a vLLM 0.32+ hash dir beside the per-rank
files (fi_cache.versions, VLLM_SPARSE_MLA_FROM).
Walking never follows directory symlinks and never stops at an unreadable directory.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fi_cache.errors import EXIT_REFUSED, CorruptCache, FiCacheError, Refused, refuse_special
from fi_cache.model import v2
from fi_cache.versions import (
    FLASHINFER_AUTOTUNE_ROOT_ENV,
    FLASHINFER_DUMP_FILE,
    SGLANG_ARCH_DIR,
    SGLANG_KEY_DIR,
    SGLANG_RANK_FILE,
    SGLANG_RUN_FILE,
    SGLANG_RUNS_DIR,
    VLLM_CACHE_FILE,
    VLLM_RANK_FILE,
)

Layout = Literal["vllm", "vllm-override", "file", "v2", "sglang"]
# What a v1 file is for, where that is not its engine's own tune (None): FlashInfer's dump named
# autotune_config.json, or vLLM 0.32+'s sparse-MLA decode file.
Role = Literal["flashinfer-dump", "sparse-mla"]
ROLE_NOTES: dict[str, str] = {
    "flashinfer-dump": (
        "FlashInfer's own dump (autotune_config.json): no vLLM release reads it; vLLM reads "
        "autotune_configs.json (0.25-0.31) or autotune_configs_dp*_rank*.json (0.32+)"
    ),
    "sparse-mla": (
        "vLLM 0.32+'s sparse-MLA decode file (SM120 GPUs): read by that warmup only; the "
        "MoE/GEMM tune reads the per-rank files beside it"
    ),
}

_HASH_DIR = re.compile(r"^[0-9a-f]{64}$")
_ARCH_DIR = re.compile(r"^\d+a?(?:_\d+a?)*$")
_SNIFF_BYTES = 4096
_SKIP_DIRS = {".fi-cache", "quarantine", "__pycache__", ".git"}
# fi-cache's own work dirs in a store: what a killed import is unpacking (store/install.py's
# STAGING_PREFIX) and what a prune or import is deleting (store/trash.py's TRASH_DIR). Never
# caches to list or verify: a staging dir is a leftover as a whole, the trash is emptied by prune.
STAGING_PREFIX = ".import-"
TRASH_DIR = ".trash"
# Temp files of killed writers: FlashInfer v1 (.autotuner_), v2 (.autotune_), fi-cache (.fi-cache-).
# Younger temp files may belong to a writer that is still running (doctor, prune leave them).
TMP_MAX_AGE_S = 600
TMP_PATTERN = re.compile(r"^\.(?:autotuner_|autotune_|fi-cache-|autotune_configs).*\.tmp$")


@dataclass(frozen=True)
class Found:
    """A cache on disk and what its location says about it."""

    path: Path  # the file (v1) or the env dir (v2)
    format: Literal["v1", "v2"]
    layout: Layout
    arch: str | None = None  # the arch dir level: vLLM's ("90a"), SGLang's ("sm90")
    dir_version: str | None = None  # FlashInfer version from the engine's dir level
    # A per-rank file's rank: vLLM (dp, rank); SGLang (tp, pp, dp).
    rank: tuple[int, ...] | None = None
    key_dir: str | None = None  # SGLang: the 16-hex dir its deployment key hashes to
    gpu_uuid: str | None = None  # SGLang 0.5.22+ flashinfer_megamoe: `_gpu<uuid>`
    run: str | None = None  # SGLang runs/ file: its timestamp (write-only, never read back)
    role: Role | None = None  # a side file, not the engine's own tune (ROLE_NOTES)

    @property
    def group(self) -> Path | None:
        """SGLang: the hash dir whose rank files make one cache (one deployment)."""
        if self.layout != "sglang" or self.key_dir is None:
            return None
        return self.path.parent.parent if self.run else self.path.parent


@dataclass(frozen=True)
class ScanProblem:
    path: Path
    check: str  # a doctor check id
    message: str
    exit_code: int = 1  # 1: corrupt/problem found, 2: refused (unreadable, too large)

    def error(self) -> FiCacheError:
        """What a command that needs this cache raises: exit 2 refused, else exit 1 corrupt."""
        cls = Refused if self.exit_code == EXIT_REFUSED else CorruptCache
        return cls(self.message, self.path)


def is_sglang_name(name: str) -> bool:
    return bool(SGLANG_RANK_FILE.match(name) or SGLANG_RUN_FILE.match(name))


def _classify_sglang(path: Path) -> Found | None:
    """SGLang's levels, when the name and its 16-hex dir (and runs/) say SGLang wrote it."""
    run = None
    if m := SGLANG_RANK_FILE.match(path.name):
        key = path.parent
    elif (m := SGLANG_RUN_FILE.match(path.name)) and path.parent.name == SGLANG_RUNS_DIR:
        key, run = path.parent.parent, m.group(5)
    else:
        return None
    if not SGLANG_KEY_DIR.match(key.name):
        return None
    rank = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    arch = key.parent.name if SGLANG_ARCH_DIR.match(key.parent.name) else None
    version = key.parent.parent.name if arch else None
    return Found(path, "v1", "sglang", arch, version, rank, key.name, m.group(4), run)


def classify_file(path: Path) -> Found:
    """What a v1 file's path says: vLLM or SGLang layout levels, rank, or a plain file."""
    if (sglang := _classify_sglang(path)) is not None:
        return sglang
    rank = None
    if m := VLLM_RANK_FILE.match(path.name):
        rank = (int(m.group(1)), int(m.group(2)))
    is_vllm_name = path.name == VLLM_CACHE_FILE or rank is not None
    parent = path.parent
    if is_vllm_name and _HASH_DIR.match(parent.name):
        role: Role | None = "sparse-mla" if rank is None and _beside_ranks(parent) else None
        arch_dir = parent.parent
        if _ARCH_DIR.match(arch_dir.name):
            return Found(path, "v1", "vllm", arch_dir.name, arch_dir.parent.name, rank, role=role)
        return Found(path, "v1", "vllm-override", rank=rank, role=role)
    role = "flashinfer-dump" if path.name == FLASHINFER_DUMP_FILE else None
    return Found(path, "v1", "file", rank=rank, role=role)


def _beside_ranks(hash_dir: Path) -> bool:
    """vLLM 0.32+'s hash dir: per-rank files (the tune's) beside the plain name (sparse MLA's)."""
    try:
        return any(VLLM_RANK_FILE.match(n) for n in os.listdir(hash_dir))
    except OSError:
        return False


def flashinfer_default_root(environ: Mapping[str, str], home: Path | None = None) -> Path:
    """FlashInfer's own root for v2 stores (autotune_cache.get_default_cache_root: FlashInfer
    0.7.2.post1 autotune_cache.py:160-167, jit/env.py:66-70); the store is `<root>/v2/`."""
    own = environ.get(FLASHINFER_AUTOTUNE_ROOT_ENV)
    if own:
        return Path(own)  # FlashInfer does not expand "~" here
    base = environ.get("FLASHINFER_WORKSPACE_BASE", str(home or Path.home()))
    return Path(base) / ".cache" / "flashinfer" / "autotune"


def is_v2_env_dir(path: Path) -> bool:
    return (
        path.parent.name == v2.SCHEMA_DIR
        and bool(v2.ENV_DIR_NAME.match(path.name))
        and (path / v2.MANIFEST).is_file()
    )


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return True  # let the read report the problem (permission, vanished)


def looks_like_v1(path: Path) -> bool:
    """A JSON file whose start looks like FlashInfer's (metadata or a tuple key)."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    text = head.lstrip()
    return text.startswith(b"{") and (b'"_metadata"' in head or b'"(' in head)


def discover(path: Path) -> tuple[list[Found], list[ScanProblem]]:
    """Every cache at or under `path`. Raises Refused when `path` does not exist."""
    if not os.path.lexists(path):
        raise Refused("no such file or directory", path)
    if path.is_file():
        if path.name == v2.MANIFEST and is_v2_env_dir(path.parent):
            return [Found(path.parent, "v2", "v2")], []
        return [classify_file(path)], []
    if not path.is_dir():
        refuse_special(path, "cache file or directory")
        raise Refused("not a regular file or directory", path)
    if is_v2_env_dir(path):
        return [Found(path, "v2", "v2")], []
    found: list[Found] = []
    problems: list[ScanProblem] = []

    def on_error(err: OSError) -> None:
        where = Path(err.filename) if err.filename else path
        problems.append(
            ScanProblem(
                where, "unreadable-permissions", f"cannot list directory: {err.strerror}", 2
            )
        )

    for dirpath, dirnames, filenames in os.walk(path, onerror=on_error):
        here = Path(dirpath)
        if is_v2_env_dir(here):
            found.append(Found(here, "v2", "v2"))
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not _work_dir(d))
        for name in sorted(filenames):
            if not name.endswith(".json") or name == v2.MANIFEST:
                continue
            file = here / name
            if not _regular(file):
                continue  # a FIFO or device named *.json would block the read forever
            named = name in (VLLM_CACHE_FILE, FLASHINFER_DUMP_FILE) or VLLM_RANK_FILE.match(name)
            if named or _classify_sglang(file):
                found.append(classify_file(file))
            else:
                try:
                    if looks_like_v1(file):
                        found.append(classify_file(file))
                except OSError as exc:
                    problems.append(
                        ScanProblem(
                            file, "unreadable-permissions", f"cannot read: {exc.strerror}", 2
                        )
                    )
    return found, problems


def _work_dir(name: str) -> bool:
    return name == TRASH_DIR or name.startswith(STAGING_PREFIX)


def tmp_leftovers(path: Path) -> list[Path]:
    """Temp files that killed writers left under `path` (for doctor and prune), and the staging
    dirs of killed imports (each one whole). fi-cache's own state dir is searched too: a killed
    pull leaves its download there."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(path):
        out.extend(Path(dirpath, d) for d in dirnames if d.startswith(STAGING_PREFIX))
        dirnames[:] = [d for d in dirnames if d not in _LEFTOVER_SKIP and not _work_dir(d)]
        out.extend(Path(dirpath, n) for n in filenames if TMP_PATTERN.match(n))
    return sorted(out)


_LEFTOVER_SKIP = _SKIP_DIRS - {".fi-cache"}


def leftover_mtime(path: Path) -> float:
    """When a leftover was last written: a staging dir's newest entry (an import still
    unpacking, or installing, keeps touching it), else the file's mtime. Raises OSError."""
    newest = path.lstat().st_mtime
    if not path.is_dir() or path.is_symlink():
        return newest
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    return newest


def named_rank_files(root: Path) -> list[Found]:
    """The per-rank files under `root` (vLLM 0.32+'s, SGLang's; not SGLang's write-only runs/
    copies), by name alone: nothing is parsed."""
    if not root.is_dir():
        return []
    found, _ = discover(root)
    return [f for f in found if f.format == "v1" and f.rank is not None and f.run is None]
