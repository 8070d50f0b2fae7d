"""What `serve` checks about the namespace it is about to hand to vLLM (a subset of doctor)."""

from __future__ import annotations

from pathlib import Path

from fi_cache.findings import Finding, Severity
from fi_cache.inventory import Cache, scan
from fi_cache.manifest import Manifest
from fi_cache.model import v1
from fi_cache.versions import VLLM_FINALIZE_ENV, flashinfer_keys_carry_finalize


def check_namespace(cache_dir: Path, finalize: str, m: Manifest | None) -> list[Finding]:
    """corrupt-file and stale-gemm2-profile findings for the caches under `cache_dir`."""
    if not cache_dir.is_dir():
        return []
    inv = scan([cache_dir], explicit=False)
    out = [
        Finding(
            p.check,
            "error",
            str(p.path),
            p.message,
            "delete it (or move it aside) and warm the namespace again",
        )
        for p in inv.problems
    ]
    for cache in inv.caches:
        out.extend(_integrity(cache))
        out.extend(_stale_gemm2(cache, finalize, m))
    return out


def _integrity(cache: Cache) -> list[Finding]:
    out = []
    for d in [*cache.read_defects, *v1.defects(cache.file)]:
        severity: Severity = "error" if d.check == "corrupt-file" else "warning"
        out.append(
            Finding(
                d.check,
                severity,
                str(cache.path),
                d.message,
                "delete the file and warm the namespace again",
            )
        )
    return out


def _stale_gemm2(cache: Cache, finalize: str, m: Manifest | None) -> list[Finding]:
    """A cache whose GEMM2 keys cannot tell finalize modes apart, tuned (or maybe tuned) by a
    vLLM that ignored VLLM_FLASHINFER_MOE_FUSED_FINALIZE, in an unfused namespace."""
    mode = cache.finalize()
    if mode is None:
        return []
    if mode in ("fused", "unfused", "mixed"):
        if mode in (finalize, "mixed"):
            return []
        return [
            Finding(
                "stale-gemm2-profile",
                "warning",
                str(cache.path),
                f"its MoE entries were tuned {mode}, this namespace is {finalize}; "
                "their keys say so, so FlashInfer ignores them and re-tunes",
                "harmless, but the file belongs in the other namespace",
            )
        ]
    if flashinfer_keys_carry_finalize(cache.flashinfer_version):
        return []
    ignored = [w for w in (m.warms if m else ()) if w.supports_finalize_env is False]
    if finalize != "unfused" or not (ignored or m is None):
        return []
    why = (
        f"it was tuned by a vLLM that ignores {VLLM_FINALIZE_ENV}"
        if ignored
        else "fi-cache has no record of how it was tuned"
    )
    return [
        Finding(
            "stale-gemm2-profile",
            "error",
            str(cache.path),
            f"MoE GEMM2 entries of FlashInfer {cache.flashinfer_version or '<= 0.6.17'} cannot say "
            f"their finalize mode and {why}: fused GEMM2 tactic ids replayed by an unfused runner "
            "crash start-up with `Invalid gemm2 profile id`",
            f"delete the file and warm again with a vLLM that supports {VLLM_FINALIZE_ENV}",
        )
    ]
