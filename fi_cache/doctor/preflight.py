"""What `serve` checks about the namespace it is about to hand to vLLM: doctor's cache checks,
run on that namespace alone, against the namespace's own environment and finalize mode (a
diagnosis like `fi-cache doctor`'s: diagnose.py reads the caches and runs the checks)."""

from __future__ import annotations

from pathlib import Path

from fi_cache.doctor.diagnose import NamespaceRequest, diagnose
from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Target
from fi_cache.store.manifest import Manifest
from fi_cache.store.namespace import Namespace

PREFLIGHT_CHECKS = (
    "corrupt-file",
    "stale-gemm2-profile",
    "foreign-environment",
    "records-unreadable",
)
SGLANG_PREFLIGHT = ("sglang-ranks-disagree",)  # SGLang 0.5.19+ would delete them all at start


def check_namespace(
    ns: Namespace,
    ns_dir: Path,
    cache_dir: Path,
    m: Manifest | None,
    vllm_version: str | None = None,
    supports_finalize: bool | None = None,
    sglang_version: str | None = None,
) -> list[Finding]:
    """Findings for the caches under `cache_dir` (the namespace's vLLM dir, or SGLang's autotune
    dir when `sglang_version` is the SGLang about to start); `supports_finalize`: does the vLLM
    that will start read VLLM_FLASHINFER_MOE_FUSED_FINALIZE (its envs.py says)."""
    if not cache_dir.is_dir():
        return []
    from fi_cache.doctor import cache_checks

    target = Target(ns.fingerprint, vllm_version, supports_finalize, ns.finalize, sglang_version)
    selected = [c for c in cache_checks.CHECKS if c.id in PREFLIGHT_CHECKS]
    if sglang_version:
        from fi_cache.doctor import rank_checks

        selected += [c for c in rank_checks.CHECKS if c.id in SGLANG_PREFLIGHT]
    asked = NamespaceRequest(target, ns_dir, cache_dir, m, tuple(selected))
    return list(diagnose(asked).findings)
