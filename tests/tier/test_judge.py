"""What `doctor mooncake://...` says the fleet does with a bad table (fi_cache/tier/judge.py's
consequence), word for word for every check it runs over tier keys (no Mooncake master needed)."""

from __future__ import annotations

import pytest

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Target
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.tier.judge import TIER_CHECKS, consequence

NEVER = "vLLM never replaces it: first writer wins, and nothing in vLLM removes a key"
ADOPTED = "every H200 daemon on a fresh node adopts it as it is; " + NEVER
SAID = {
    "corrupt-file": "every H200 daemon on a fresh node rejects it and tunes from scratch (the "
    "tier never helps it); " + NEVER,
    "generation-mismatch": ADOPTED,
    "foreign-environment": "every H200 daemon on a fresh node rejects it by `_metadata` and tunes "
    "from scratch (its own publish is a no-op: the tier never helps it); " + NEVER,
    "stale-gemm2-profile": "every H200 daemon on a fresh node adopts it (its `_metadata` fits) "
    "and replays GEMM2 ids of the other finalize mode: `Invalid gemm2 profile id` crashes "
    "start-up fleet-wide; " + NEVER,
    "finalize-mode-miss": "every H200 daemon on a fresh node adopts it, every rank hits, so vLLM "
    "0.33+ skips the sweep and MoE runs FlashInfer's fallback tactic fleet-wide; " + NEVER,
    "records-unreadable": "every H200 daemon on a fresh node adopts it (nothing checks "
    "`_records`) and FlashInfer crashes loading it; " + NEVER,
    "vllm-ranks-retune": "a fresh node's daemons adopt these tables rank by rank, fail vLLM's "
    "gate and tune every rank again (their publish is a no-op: the tier keeps these); vLLM never "
    "replaces them: first writer wins, and nothing in vLLM removes a key",
    "ranks-divergent-tactics": ADOPTED,
    "a-check-tier-does-not-run": ADOPTED,
}


def _said(check: str, gpu: str | None) -> str:
    return consequence(Finding(check, "error", None, "m", "-"), Target(Fingerprint(gpu=gpu)))


def test_every_tier_check_has_its_consequence_here() -> None:
    assert set(TIER_CHECKS) <= set(SAID)


@pytest.mark.parametrize("check", sorted(SAID))
def test_the_consequence_of_each_check_is_said_word_for_word(check: str) -> None:
    assert _said(check, "NVIDIA H200") == SAID[check]


@pytest.mark.parametrize("check", sorted(SAID))
def test_the_gpu_name_is_said_as_given_or_left_out_when_unknown(check: str) -> None:
    odd = "H100 {80GB}"  # braces in a name are the name's, not a template's
    assert _said(check, odd) == SAID[check].replace("every H200", f"every {odd}")
    assert _said(check, None) == SAID[check].replace("every H200 ", "every ")
