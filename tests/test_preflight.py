"""What serve checks before handing a namespace to vLLM."""

from __future__ import annotations

import shutil
from pathlib import Path

from fi_cache import manifest as m
from fi_cache import preflight
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.namespace import Namespace
from tests.conftest import HASH_A, MOE_617_FUSED, MOE_618_FUSED

NS = Namespace(Fingerprint(flashinfer_version="0.6.17"), "unfused")


def _ns_with(tmp_path: Path, source: Path) -> Path:
    target = tmp_path / "vllm" / HASH_A / "autotune_configs.json"
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    return tmp_path / "vllm"


def _manifest(supports: bool | None) -> m.Manifest:
    warm = m.WarmRecord(0.0, 1.0, "0.30.0", ["x"], "k", [], supports)
    return m.Manifest.new(NS, now=0).with_warm(warm)


def test_unrecorded_0617_cache_in_unfused_namespace_is_the_gemm2_error(tmp_path: Path) -> None:
    [f] = preflight.check_namespace(_ns_with(tmp_path, MOE_617_FUSED), "unfused", None)
    assert (f.check, f.severity) == ("stale-gemm2-profile", "error")
    assert "Invalid gemm2 profile id" in f.message


def test_0617_cache_tuned_by_a_vllm_that_ignores_the_mode_is_an_error(tmp_path: Path) -> None:
    d = _ns_with(tmp_path, MOE_617_FUSED)
    [f] = preflight.check_namespace(d, "unfused", _manifest(False))
    assert "ignores VLLM_FLASHINFER_MOE_FUSED_FINALIZE" in f.message
    assert preflight.check_namespace(d, "unfused", _manifest(True)) == []
    assert preflight.check_namespace(d, "fused", None) == []


def test_0618_keys_are_safe_but_the_other_mode_is_a_warning(tmp_path: Path) -> None:
    [f] = preflight.check_namespace(_ns_with(tmp_path, MOE_618_FUSED), "unfused", None)
    assert (f.check, f.severity) == ("stale-gemm2-profile", "warning")


def test_corrupt_cache_is_an_error(tmp_path: Path) -> None:
    d = _ns_with(tmp_path, MOE_618_FUSED)
    (d / HASH_A / "autotune_configs.json").write_text("{")
    [f] = preflight.check_namespace(d, "fused", None)
    assert (f.check, f.severity) == ("corrupt-file", "error")


def test_empty_namespace_has_nothing_to_say(tmp_path: Path) -> None:
    assert preflight.check_namespace(tmp_path / "vllm", "fused", None) == []
