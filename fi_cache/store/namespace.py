"""Namespaces: one cache directory per runner configuration, so runs that differ never share.

A namespace is the environment fingerprint (FlashInfer version, arch, GPU name, CUDA, cuBLAS,
cuDNN, cudnn-frontend, cutlass-dsl) plus the MoE finalize mode. Its directory name starts
human-readable (version/arch/gpu/finalize) and ends in a hash of every field, so two
configurations that print alike still land apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fi_cache.model.fingerprint import Fingerprint

FinalizeMode = Literal["fused", "unfused"]
FINALIZE_MODES: tuple[FinalizeMode, ...] = ("fused", "unfused")
NAMESPACES_DIR = "namespaces"
_SLUG = re.compile(r"[^a-z0-9.]+")


def slug(value: str | None) -> str:
    """A path-safe rendering: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    if not value:
        return "unknown"
    return _SLUG.sub("-", value.lower()).strip("-.") or "unknown"


# The fingerprint fields that name a namespace's readable levels (and a push key's).
LEVEL_FIELDS = ("flashinfer_version", "arch", "gpu")


def unknown_levels(fp: Fingerprint) -> list[str]:
    """The fields of LEVEL_FIELDS not detected here: their level reads `unknown`, and every
    machine where detection fails the same way shares the namespace."""
    return [name for name in LEVEL_FIELDS if slug(getattr(fp, name)) == "unknown"]


def shared_when_undetected(ns: Namespace) -> str | None:
    """What to tell a user whose namespace is named by undetected fields (None: all detected)."""
    if not (unknown := unknown_levels(ns.fingerprint)):
        return None
    return (
        f"{', '.join(unknown)} not detected (see `fi-cache env`): namespace {ns.relpath} is "
        "shared with every machine whose detection fails the same way"
    )


@dataclass(frozen=True)
class Namespace:
    fingerprint: Fingerprint
    finalize: FinalizeMode

    @property
    def digest(self) -> str:
        return self.fingerprint.digest(self.finalize)[:12]

    @property
    def relpath(self) -> Path:
        fp = self.fingerprint
        return Path(
            NAMESPACES_DIR,
            slug(fp.flashinfer_version),
            slug(fp.arch),
            slug(fp.gpu),
            f"{self.finalize}-{self.digest}",
        )

    def path(self, store: Path) -> Path:
        return store / self.relpath


def namespace_parts(path: Path, store: Path) -> dict[str, str] | None:
    """version/arch/gpu/finalize read back from a path inside the store's namespaces dir."""
    try:
        rel = path.resolve().relative_to((store / NAMESPACES_DIR).resolve())
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return None
    parts = rel.parts
    if len(parts) < 4 or "-" not in parts[3]:
        return None
    finalize, _, digest = parts[3].partition("-")
    return {
        "flashinfer_version": parts[0],
        "arch": parts[1],
        "gpu": parts[2],
        "finalize": finalize,
        "digest": digest,
        "dir": str(store / NAMESPACES_DIR / Path(*parts[:4])),
    }
