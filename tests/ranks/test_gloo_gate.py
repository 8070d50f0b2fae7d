"""vLLM 0.32's own gate in two gloo processes agrees with fi-cache's reading of it, before and
after `fi-cache align`, and the aligned files are then loaded whole by FlashInfer on every rank."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from fi_cache.maintenance.align import apply
from fi_cache.model import v1
from fi_cache.ranks.agreement import RankFile, vllm_gate
from tests.conftest import GEMM_618, VLLM_PYTHON, flashinfer_dir, needs_vllm
from tests.ranks.gloo import run_ranks

WORKER = Path(__file__).with_name("gloo_gate.py")
RANKS = ("dp0_rank0", "dp1_rank1")  # MoE -dp 2 on vLLM 0.32: one world group of two


def _kernel_warmup() -> Path:
    found = sorted(
        Path(VLLM_PYTHON).parent.parent.glob(
            "lib/python*/site-packages/vllm/model_executor/warmup/kernel_warmup.py"
        )
    )
    if not found:
        pytest.fail(f"no vLLM kernel_warmup.py next to {VLLM_PYTHON}")
    return found[0]


def _gate(hdir: Path, tmp: Path) -> list[dict[str, object]]:
    init = tmp / f"gloo-{uuid.uuid4().hex}"  # a FileStore file is never reused
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir("0.6.18"))}
    argv = [sys.executable, str(WORKER), str(_kernel_warmup()), str(init)]
    return run_ranks(
        [
            [*argv, str(i), "2", str(hdir / f"autotune_configs_{rank}.json")]
            for i, rank in enumerate(RANKS)
        ],
        env,
    )


@needs_vllm
def test_vllms_gate_rejects_a_short_rank_and_loads_the_aligned_set(tmp_path: Path) -> None:
    hdir = tmp_path / "0.6.18" / "90a" / ("e" * 64)
    hdir.mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    short = v1.CacheFile(cf.metadata, dict(list(cf.entries.items())[2:]), None, cf.generation)
    for rank, part in zip(RANKS, (cf, short), strict=True):
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))
    ours = vllm_gate([RankFile(r, "", f) for r, f in zip(RANKS, (cf, short), strict=True)])
    before = _gate(hdir, tmp_path)
    assert [r["gate"] for r in before] == [False, False] and not ours.loads  # every rank re-tunes
    [plan] = apply([hdir])
    assert plan.aligned is not None and len(plan.writes) == 1
    after = _gate(hdir, tmp_path)
    assert [r["gate"] for r in after] == [True, True]
    assert all(r["loaded"] and r["entries"] == len(cf.entries) for r in after)


def _start(hdir: Path, tmp: Path, own: dict[str, list[object]]) -> list[dict[str, object]]:
    """One start of both ranks through vLLM 0.32's own `flashinfer_autotune` (gloo_warmup.py)."""
    n = uuid.uuid4().hex
    init, keys = tmp / f"start-{n}", tmp / f"keys-{n}.json"
    keys.write_text(json.dumps(own))
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir("0.6.18"))}
    argv = [
        sys.executable,
        str(WORKER.with_name("gloo_warmup.py")),
        str(_kernel_warmup()),
        str(init),
    ]
    return run_ranks(
        [
            [*argv, str(i), "2", str(hdir), rank.removeprefix("dp")[0], str(keys)]
            for i, rank in enumerate(RANKS)
        ],
        env,
    )


@needs_vllm
def test_vllms_own_autotune_start_hits_on_every_rank_only_once_aligned(tmp_path: Path) -> None:
    """vLLM names each rank's file itself (dp{d}_rank{world rank}), gates, loads, agrees that
    every rank loaded: a short rank makes both miss everything; after align both hit it all."""
    hdir = tmp_path / "0.6.18" / "90a" / ("f" * 64)
    hdir.mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    short = v1.CacheFile(cf.metadata, dict(list(cf.entries.items())[1:]), None, cf.generation)
    for rank, part in zip(RANKS, (cf, short), strict=True):
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))
    before = _start(hdir, tmp_path, cf.entries)
    assert [r["file"] for r in before] == [f"autotune_configs_{r}.json" for r in RANKS]
    assert [r["hits"] for r in before] == [0, 0]  # every rank tunes again
    apply([hdir])
    assert [r["hits"] for r in _start(hdir, tmp_path, cf.entries)] == [len(cf.entries)] * 2
