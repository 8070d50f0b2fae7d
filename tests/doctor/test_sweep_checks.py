"""doctor's sweep-gap (doctor/sweep_checks.py): vLLM 0.33+ loads a hash dir whose every rank file
passes its gate and tunes nothing, so a file there that lacks buckets the config's sweep tunes
(vLLM's own answer for `-- ARGS`) is flagged with the M it will serve with the fallback tactic.
The file is one vLLM 0.26 wrote on the H200 (MoE buckets 1..8192)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fi_cache import doctor
from fi_cache.doctor import Target
from fi_cache.doctor.findings import Finding
from fi_cache.doctor.gather import GatherRequest, gather
from fi_cache.engines.vllm.predict import CacheLocation
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from tests.conftest import FIXTURES

VLLM_MOE = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"
RANKS = ("autotune_configs_dp0_rank0.json", "autotune_configs_dp0_rank1.json")


def _findings(
    tmp_path: Path,
    version: str,
    tokens: tuple[int, ...] | None,
    ranks: tuple[str, ...] = RANKS,
    present: int = 2,
) -> list[Finding]:
    hash_dir = tmp_path / "vllm-root" / ("c" * 64)
    hash_dir.mkdir(parents=True)
    for name in ranks[:present]:
        shutil.copy(VLLM_MOE, hash_dir / name)
    meta = v1.loads(VLLM_MOE.read_text()).metadata or {}
    target = Target(Fingerprint.from_metadata(meta, "90a"), vllm_version=version)
    where = CacheLocation(
        version, "c" * 64, str(hash_dir), ranks, "VLLM_CACHE_ROOT", sweep_tokens=tokens
    )
    asked = GatherRequest(
        store=tmp_path / "store",
        serve_argv=["m", "-tp", "2"],
        target=target,
        environ={},
        location=where,
        location_from="vLLM",
    )
    inputs = gather(asked)
    return doctor.run(inputs, only=["sweep-gap"])


def test_a_file_vllm_034_will_load_without_its_top_buckets_is_flagged(tmp_path: Path) -> None:
    found = _findings(tmp_path, "0.34.0", (16384,))
    assert [(f.severity, Path(f.path or "").name) for f in found] == [
        ("warning", RANKS[0]),
        ("warning", RANKS[1]),
    ]
    assert found[0].message.startswith(
        "vLLM will not tune these: fallback tactic at M=16384 for trtllm::fused_moe::gemm1, "
        "trtllm::fused_moe::gemm2 (vLLM 0.34.0 loads this file and skips its tuning sweep"
    )
    assert found[0].details == {
        "missing": {"trtllm::fused_moe::gemm1": [16384], "trtllm::fused_moe::gemm2": [16384]},
        "tokens": [16384],
    }


def test_a_file_holding_the_sweep_is_not_flagged(tmp_path: Path) -> None:
    assert _findings(tmp_path, "0.34.0", (8192,)) == []


def test_a_rank_without_its_file_means_vllm_tunes_so_nothing_is_flagged(tmp_path: Path) -> None:
    assert _findings(tmp_path, "0.34.0", (16384,), present=1) == []


def test_vllm_032_tunes_what_the_file_lacks_so_nothing_is_flagged(tmp_path: Path) -> None:
    assert _findings(tmp_path, "0.32.0", (16384,)) == []


def test_sweep_gap_is_a_listed_vllm_check() -> None:
    assert "sweep-gap" in {c.id for c in doctor.checks()}
