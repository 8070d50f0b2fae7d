"""What serve checks before handing a namespace to vLLM (doctor's cache checks, scoped)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fi_cache.doctor import preflight
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as m
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_617, HASH_A, MOE_617_FUSED, MOE_618_FUSED

FP = Fingerprint.from_metadata(json.loads(GEMM_617.read_text())["_metadata"], "90a")


def _ns(tmp_path: Path, source: Path, finalize: str) -> tuple[Namespace, Path]:
    target = tmp_path / "vllm" / HASH_A / "autotune_configs.json"
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    return Namespace(FP, finalize), tmp_path  # type: ignore[arg-type]


def _manifest(ns: Namespace, supports: bool | None) -> m.Manifest:
    warm = m.WarmRecord(0.0, 1.0, "0.30.0", ["x"], "k", [], supports)
    return m.Manifest.new(ns, now=0).with_warm(warm)


def _check(ns: Namespace, d: Path, man: m.Manifest | None) -> list[tuple[str, str]]:
    return [(f.check, f.severity) for f in preflight.check_namespace(ns, d, d / "vllm", man)]


def test_unrecorded_0617_cache_in_unfused_namespace_is_the_gemm2_error(tmp_path: Path) -> None:
    ns, d = _ns(tmp_path, MOE_617_FUSED, "unfused")
    assert _check(ns, d, None) == [("stale-gemm2-profile", "error")]


def test_recorded_by_a_vllm_that_ignores_the_mode_or_reads_it(tmp_path: Path) -> None:
    ns, d = _ns(tmp_path, MOE_617_FUSED, "unfused")
    assert _check(ns, d, _manifest(ns, False)) == [("stale-gemm2-profile", "error")]
    assert _check(ns, d, _manifest(ns, True)) == []


def test_fused_namespace_and_0618_keys_are_fine(tmp_path: Path) -> None:
    ns, d = _ns(tmp_path, MOE_617_FUSED, "fused")
    assert _check(ns, d, None) == []
    ns2, d2 = _ns(tmp_path / "b", MOE_618_FUSED, "unfused")
    assert ("stale-gemm2-profile", "error") not in _check(ns2, d2, None)


def test_corrupt_cache_is_an_error(tmp_path: Path) -> None:
    ns, d = _ns(tmp_path, MOE_617_FUSED, "fused")
    (d / "vllm" / HASH_A / "autotune_configs.json").write_text("{")
    assert _check(ns, d, None) == [("corrupt-file", "error")]


def test_empty_namespace_has_nothing_to_say(tmp_path: Path) -> None:
    assert (
        preflight.check_namespace(Namespace(FP, "fused"), tmp_path, tmp_path / "vllm", None) == []
    )


def test_every_preflight_check_exists_where_serve_looks_for_it() -> None:
    """serve's pre-flight imports only cache_checks (and rank_checks for SGLang): a check
    renamed or moved elsewhere would silently stop running before every start."""
    from fi_cache.doctor import cache_checks, rank_checks
    from fi_cache.doctor.preflight import PREFLIGHT_CHECKS, SGLANG_PREFLIGHT

    assert set(PREFLIGHT_CHECKS) <= {c.id for c in cache_checks.CHECKS}
    assert set(SGLANG_PREFLIGHT) <= {c.id for c in rank_checks.CHECKS}
