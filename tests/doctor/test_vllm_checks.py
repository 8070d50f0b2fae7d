"""doctor's finalize-unsupported judges the (vLLM, FlashInfer) pair: the variable (a PR #54948
build), fi-cache's plugin (FlashInfer >= 0.7.4 and a vLLM that passes no use_fused_finalize),
or neither (fi_cache/versions: unfused_route)."""

from __future__ import annotations

import pytest

from fi_cache import doctor
from fi_cache.doctor import Inputs, Target
from fi_cache.doctor.vllm_checks import runs_finalize
from fi_cache.model.fingerprint import Fingerprint


def _target(vllm: str, flashinfer: str, supports: bool | None) -> Target:
    fp = Fingerprint(flashinfer_version=flashinfer, arch="90a")
    return Target(fp, vllm, supports, "unfused")


@pytest.mark.parametrize(
    "vllm, flashinfer, supports, severity, says",
    [
        ("0.34.0", "0.7.4", None, "info", "fi-cache serve --deterministic"),  # the plugin
        ("0.33.0", "0.7.4", False, "info", "a plain `vllm serve` starts fused"),
        ("0.33.0", "0.7.2.post1", False, "error", "FlashInfer 0.7.2.post1 runs fused finalize"),
        ("0.34.0", "0.7.2.post1", None, "error", "FlashInfer 0.7.2.post1 runs fused finalize"),
        ("0.35.0", "0.7.4", None, "warning", "cannot tell"),  # newer than checked
        ("0.34.0", "0.7.2.post1", True, None, ""),  # a PR #54948 build
    ],
)
def test_finalize_unsupported_judges_the_pair(
    vllm: str, flashinfer: str, supports: bool | None, severity: str | None, says: str
) -> None:
    inp = Inputs(_target(vllm, flashinfer, supports))
    found = doctor.run(inp, ["finalize-unsupported"])
    assert [f.severity for f in found] == ([severity] if severity else [])
    assert all(says in f.message + f.fix for f in found)


def test_caches_are_judged_against_unfused_on_the_plugin_route() -> None:
    assert runs_finalize(Inputs(_target("0.34.0", "0.7.4", None))) == "unfused"
    assert runs_finalize(Inputs(_target("0.33.0", "0.7.2.post1", False))) == "fused"
