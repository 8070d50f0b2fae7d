"""The environment a cache belongs to, and FlashInfer's rule for whether a file fits one."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import asdict, dataclass, fields
from typing import Any

from fi_cache.versions import INDETERMINATE_VALUES, METADATA_FIELDS_07, WILDCARD

GPU_VENDOR = "NVIDIA "  # what FlashInfer's `_metadata` gpu (torch's device name) starts with


def short_gpu_name(name: str) -> str:
    """The name fi-cache prints in its GPU columns (`ls`, tier `ls`): "NVIDIA H200" -> "H200";
    `doctor --gpu` takes it back."""
    return name.removeprefix(GPU_VENDOR).split(" ")[0]


@dataclass(frozen=True)
class Fingerprint:
    """FlashInfer's `_metadata` fields plus vLLM's arch level. None = not known here."""

    flashinfer_version: str | None = None
    cuda_version: str | None = None
    cublas_version: str | None = None
    cudnn_version: str | None = None
    cudnn_frontend_version: str | None = None
    gpu: str | None = None
    cutlass_dsl_version: str | None = None  # FlashInfer 0.7.x only
    arch: str | None = None  # vLLM's dir name, e.g. "90a"

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any] | None, arch: str | None = None) -> Fingerprint:
        """From a file's `_metadata`; indeterminate and non-string values become None."""
        meta = metadata or {}
        values = {f: _definite(meta.get(f)) for f in METADATA_FIELDS_07}
        return cls(**values, arch=arch)

    def metadata(self) -> dict[str, str | None]:
        """The `_metadata` fields, in FlashInfer's order."""
        return {f: getattr(self, f) for f in METADATA_FIELDS_07}

    def replace(self, **changes: str | None) -> Fingerprint:
        values = asdict(self)
        values.update(changes)
        return Fingerprint(**values)

    def digest(self, *extra: str) -> str:
        """A stable hash of every field (and `extra`), for namespace dir names."""
        payload = json.dumps([asdict(self), list(extra)], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


FINGERPRINT_FIELDS = tuple(f.name for f in fields(Fingerprint))


def unsafe_field(fp: Fingerprint) -> str | None:
    """`field 'value'` of the first value that is no plain name (a path separator, '.', '..',
    a control character), None when all are: values from a bundle name store paths, and
    no FlashInfer version, GPU name or arch holds one."""
    for name in FINGERPRINT_FIELDS:
        value = getattr(fp, name)
        if value is None:
            continue
        if value in (".", "..") or any(map(_not_in_a_name, value)):
            return f"{name} {value!r}"
    return None


def _not_in_a_name(c: str) -> bool:
    return c in "/\\" or unicodedata.category(c) == "Cc"


def _definite(value: Any) -> str | None:
    if not isinstance(value, str) or value in INDETERMINATE_VALUES:
        return None
    return value


@dataclass(frozen=True)
class Mismatch:
    """One `_metadata` field that does not fit the target. Hard: FlashInfer ignores the file and
    never overwrites it. Soft: the saved value is indeterminate; ignored, then healed on save."""

    field: str
    saved: Any
    target: str
    hard: bool


def compare_metadata(saved: Any, target: Fingerprint) -> list[Mismatch]:
    """FlashInfer's load-time rule, restricted to the fields the target knows.

    A file without `_metadata` is accepted (FlashInfer does so too); `"*"` matches anything.
    FlashInfer compares every field it tracks; a field fi-cache cannot detect is not compared.
    """
    if saved is None:
        return []
    meta = saved if isinstance(saved, dict) else {}
    out = []
    for name, current in target.metadata().items():
        if current is None:
            continue
        value = meta.get(name)
        if value in (current, WILDCARD):
            continue
        hard = not (value is None or (isinstance(value, str) and value in INDETERMINATE_VALUES))
        out.append(Mismatch(name, value, current, hard))
    return out
