"""What every doctor check reads: the target environment, the caches with what the store knows
of them, logs and arguments (gather.py fills them in; the checks are pure functions of them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: serve's pre-flight imports this, and pays for what it loads
    from fi_cache.caches.discover import ScanProblem
    from fi_cache.caches.inventory import Cache
    from fi_cache.doctor.findings import Finding, Severity
    from fi_cache.doctor.logs import LogFacts
    from fi_cache.engines.sglang.args import SglangArgs
    from fi_cache.engines.sglang.live import Engine as LiveSglang
    from fi_cache.engines.vllm.args import ServeArgs
    from fi_cache.engines.vllm.predict import CacheLocation
    from fi_cache.model.fingerprint import Fingerprint
    from fi_cache.model.v1 import Defect
    from fi_cache.store.manifest import Manifest


@dataclass(frozen=True)
class Target:
    """The environment a cache will be used in: detected, with single fields overridden."""

    fingerprint: Fingerprint
    vllm_version: str | None = None
    vllm_supports_finalize: bool | None = None  # None: no vllm/envs.py to read
    finalize: str = "fused"  # every vLLM release runs fused finalize unless told otherwise
    sglang_version: str | None = None  # set: the target engine is SGLang (--sglang-version)


@dataclass(frozen=True)
class CacheView:
    """A cache and what the fi-cache store knows about it (None outside the store)."""

    cache: Cache
    namespace_dir: Path | None = None
    namespace_finalize: str | None = None
    manifest: Manifest | None = None
    defects: tuple[Defect, ...] = ()  # read defects + v1.defects, computed once by the caller
    # False for caches the target never loads (another namespace of the store, another version's
    # dir of a vLLM root): integrity checks still look at them, environment checks do not.
    applies: bool = True
    not_loaded_why: str = ""  # when it does not apply: why the target never loads it
    named: bool = False  # a PATH on the command line (not found in the store or vLLM's dir)


@dataclass(frozen=True)
class Inputs:
    target: Target
    caches: tuple[CacheView, ...] = ()
    problems: tuple[ScanProblem, ...] = ()
    tmp_files: tuple[tuple[Path, float], ...] = ()  # (path, age in seconds)
    logs: tuple[LogFacts, ...] = ()
    serve: ServeArgs | None = None
    serve_moe: bool | None = None  # the served model's config.json has experts (None: unread)
    environ: dict[str, str] = field(default_factory=dict)
    modes: dict[Path, int] = field(default_factory=dict)  # st_mode of cache files and their dirs
    store: Path | None = None
    predicted_dir: Path | None = (
        None  # where vLLM will keep its cache when the store is not in charge
    )
    empty: tuple[Path, ...] = ()  # PATHs given that hold no cache at all (refused, exit 2)
    logs_as_paths: tuple[Path, ...] = ()  # PATHs that are text logs, not caches (refused, exit 2)
    location: CacheLocation | None = None  # vLLM's own answer for `-- ARGS`, when it was asked
    location_from: str = ""  # which answer cache-location gives, and why
    sglang: SglangArgs | None = None  # `-- ARGS` of an SGLang target
    # SGLang target: the servers running here, and where a start from this shell would keep
    # its cache and on which GPUs (engines/sglang/live.py).
    sglang_live: tuple[LiveSglang, ...] = ()
    sglang_here: tuple[str, frozenset[str] | None] | None = None


@dataclass(frozen=True)
class Check:
    id: str
    summary: str
    run: Callable[[Inputs], Iterable[Finding]]


@dataclass(frozen=True)
class CheckId:
    """An id a finding can carry (doctor/check_ids.py declares every one)."""

    id: str
    severities: tuple[Severity, ...]
    summary: str
