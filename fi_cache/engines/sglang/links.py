"""What stays with the user although SGLANG_CACHE_DIR is in the namespace: links from the
namespace's SGLang dir into the user's dir, for the dirs SGLang joins to SGLANG_CACHE_DIR itself
(versions.SGLANG_DIRECT_CACHES), the derived caches a diffusion worker re-points
(versions.SGLANG_LINKED_DERIVED) and the files that are the user's or the machine's, not a tune's
(the P2P probe, kernels.lock)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from fi_cache.engines.sglang.layout import effective, user_cache_dir
from fi_cache.errors import FiCacheError
from fi_cache.store.files import ensure_dir, ensure_file_link, remove_file
from fi_cache.versions import (
    SGLANG_CACHE_DIR_ENV,
    SGLANG_DIRECT_CACHES,
    SGLANG_KERNELS_LOCK,
    SGLANG_LINKED_DERIVED,
    SGLANG_P2P_FILE,
    sglang_caches_moved,
)


def link_direct_caches(cache_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """Point the dirs SGLang joins to SGLANG_CACHE_DIR itself back into the user's dir (links
    made once, kept); returns the ones that could not be linked."""
    from fi_cache.store.files import ensure_link

    theirs = Path(user_cache_dir(environ))
    failed = []
    for name in SGLANG_DIRECT_CACHES:
        if not ensure_link(cache_dir / name, theirs / name):
            failed.append(name)
    return failed


def link_derived_caches(cache_dir: Path, environ: Mapping[str, str], version: str) -> list[str]:
    """The variables of versions.SGLANG_LINKED_DERIVED that SGLang `version` derives and the user
    did not set, whose dir under `cache_dir` now links to the user's: SGLang's own default then
    lands in the user's dir, and a diffusion worker still sees its default and re-points it as it
    would without fi-cache. A variable whose link could not be made is not returned (pin it)."""
    from fi_cache.store.files import ensure_link

    theirs = Path(user_cache_dir(environ))
    linked = []
    for var, sub in sglang_caches_moved(version):
        mine = var in SGLANG_LINKED_DERIVED and var not in environ and sub
        if mine and ensure_link(cache_dir / sub, theirs / sub) and (cache_dir / sub).is_symlink():
            linked.append(var)  # a real dir or file kept there: the variable is pinned
    return linked


def p2p_file_name(environ: Mapping[str, str], gpus: int | None) -> str | None:
    """The P2P probe file SGLang's ranks read for this environment: named after
    CUDA_VISIBLE_DEVICES as set, else "0,1,..." over the GPUs torch sees (`gpus`; None: unknown)."""
    devices = environ.get("CUDA_VISIBLE_DEVICES")
    if devices is None:
        if not gpus:
            return None
        devices = ",".join(str(i) for i in range(gpus))
    name = SGLANG_P2P_FILE.format(devices)
    return name if "/" not in name and "\0" not in name and len(name) <= 255 else None


def link_user_files(cache_dir: Path, environ: Mapping[str, str], gpus: int | None) -> list[str]:
    """Link the P2P probe and kernels.lock in `cache_dir` to the user's; returns the names that
    could not be linked (SGLang then reads and writes them in the namespace, as before)."""
    failed = []
    # kernels.lock: read from SGLANG_CACHE_DIR as given (no `~` expansion), never written.
    given = effective(environ, SGLANG_CACHE_DIR_ENV)
    lock_dir = os.path.abspath(given) if given is not None else user_cache_dir(environ)
    if not ensure_file_link(cache_dir / SGLANG_KERNELS_LOCK, Path(lock_dir, SGLANG_KERNELS_LOCK)):
        failed.append(SGLANG_KERNELS_LOCK)
    name = p2p_file_name(environ, gpus)
    if name is None:
        return failed
    probe, target = cache_dir / name, Path(user_cache_dir(environ), name)
    # A dangling link is written through: the user's dir must take the file, else no link.
    with contextlib.suppress(FiCacheError):
        ensure_dir(target.parent)
    if target.exists() or os.access(target.parent, os.W_OK):
        if ensure_file_link(probe, target, True):  # a probe of another host is no answer here
            return failed
    elif probe.is_symlink():
        with contextlib.suppress(FiCacheError):
            remove_file(probe)  # SGLang writes its own in the namespace rather than failing
    return [*failed, name]
