"""Seeding never freezes an incomplete table on vLLM 0.33+ (lifecycle/seeding.py, the engine's
seed_gap, model/sweep.py): such a vLLM tunes nothing when every rank's file passes its
gate, so a seed that lacks a bucket its sweep tunes for the new config is not placed, and the
warm says why in one line; a seed that holds it is placed, and before 0.33 (the sweep fills the
gaps over a loaded file) seeding stays as it was.

The warm's engine is tests/third_engine.py's STAND-IN (tests/fake_vllm.py, not vLLM); its first
warm's table holds bf16_gemm at bucket 1 only. vLLM's own seed_gap is run on a saved answer of
vLLM's prediction child (engines/vllm/predict.py), as a warm finds it in the store's state dir.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from fi_cache.engines.vllm.engine import ENGINE
from fi_cache.engines.vllm.predict import cache_key
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.warm import WarmOptions, warm
from fi_cache.model import v1
from fi_cache.model.sweep import Sweep, refusal
from fi_cache.store.paths import state_dir
from tests.conftest import GEMM_618
from tests.third_engine import Heard, Third, request


class SkipsItsSweep(Third):
    """Third as a vLLM `version` whose sweep for the new config tunes up to `tokens`."""

    def __init__(self, version: str, tokens: tuple[int, ...]) -> None:
        self.version, self.tokens = version, tokens

    def seed_gap(self, run: object, tables: Sequence[tuple[Path, v1.CacheFile]]) -> str | None:
        return refusal(self.version, Sweep(self.tokens), tables)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    warm(Third(), request("m"), WarmOptions(timeout=60), store := tmp_path / "store", Report())
    return store  # the namespace's first warm of model m: the seed source (bucket 1)


def _second(store: Path, engine: Third) -> tuple[list[int], list[str]]:
    heard = Heard()
    _, result = warm(
        engine, request("m", "--max-num-seqs", "8"), WarmOptions(timeout=60), store, heard.report()
    )
    return [f.seeded for f in result.files], heard.noted


def test_a_seed_lacking_the_sweeps_buckets_is_not_placed_on_034(store: Path) -> None:
    seeded, noted = _second(store, SkipsItsSweep("0.34.0", (2,)))
    assert seeded == [0]  # the engine tuned the new config in full
    [said] = [n for n in noted if n.startswith("not seeding:")]
    assert said == (
        "not seeding: vLLM 0.34.0 skips its tuning sweep on a full hit, and the earlier files "
        "lack M=2 for this config (bf16_gemm); vLLM will tune from scratch"
    )


def test_a_seed_holding_the_sweeps_buckets_is_placed_on_034(store: Path) -> None:
    seeded, noted = _second(store, SkipsItsSweep("0.34.0", (1,)))
    assert seeded == [1]
    assert not [n for n in noted if n.startswith("not seeding")]


def test_before_033_an_incomplete_seed_is_placed_as_before(store: Path) -> None:
    seeded, _ = _second(store, SkipsItsSweep("0.32.0", (8192,)))
    assert seeded == [1]  # 0.32 runs its sweep over the loaded file: it tunes what is missing


# --- vLLM's own seed_gap, on its prediction child's saved answer --------------------------------


def _vllm_run(version: str) -> types.SimpleNamespace:
    vllm = types.SimpleNamespace(version=version, site=None, supports_finalize_env=None)
    return types.SimpleNamespace(
        env=types.SimpleNamespace(vllm=vllm, python="/usr/bin/python3"),
        args=types.SimpleNamespace(argv=("m",), uses_ray=False),
        ns=types.SimpleNamespace(finalize="fused"),
    )


def _vllm_gap(tmp_path: Path, version: str, sweep: dict[str, object] | None) -> str | None:
    """Save vLLM's answer for `vllm serve m` (the child's JSON, `sweep` as it reports it: None,
    an answer kept by an earlier fi-cache), then ask the engine as a warm does."""
    store, ns_dir = tmp_path / "store", tmp_path / "store" / "ns"
    run = _vllm_run(version)
    env = ENGINE.environment(run, ns_dir, os.environ, warm=False)  # type: ignore[arg-type]
    key = cache_key(run.env.python, version, ["m"], env)
    answer: dict[str, object] = {
        "vllm_version": version,
        "hash": "h" * 64,
        "dir": str(ns_dir / "vllm" / ("h" * 64)),
        "files": ["autotune_configs_dp0_rank0.json"],
        "root_from": "x",
    }
    if sweep is not None:
        answer["sweep"] = sweep
    state_dir(store).mkdir(parents=True)
    (state_dir(store) / f"vllm-cache-{key}.json").write_text(json.dumps(answer))
    known = ENGINE.seed_targets_known(run, ns_dir, store)  # type: ignore[arg-type]
    assert known is not None
    [target], why = known
    assert why is None
    return ENGINE.seed_gap(run, [(target, v1.loads(GEMM_618.read_text()))])  # type: ignore[arg-type]


def test_vllm_034_refuses_a_seed_its_sweep_would_outgrow(tmp_path: Path) -> None:
    line = _vllm_gap(tmp_path, "0.34.0", {"tokens": [2048]})
    assert line is not None and "lack M=1280,1536,1792,2048 " in line


def test_vllm_034_seeds_a_table_that_holds_its_sweep(tmp_path: Path) -> None:
    assert _vllm_gap(tmp_path, "0.34.0", {"tokens": [1024]}) is None


def test_vllm_033_with_an_unknown_sweep_says_why(tmp_path: Path) -> None:
    line = _vllm_gap(tmp_path, "0.33.0", {"tokens": None, "unknown": "a drafter's token count"})
    assert line is not None and "cannot tell which token counts" in line
    assert "(a drafter's token count)" in line


def test_vllm_032_seeds_as_before(tmp_path: Path) -> None:
    assert _vllm_gap(tmp_path, "0.32.0", {"tokens": [16384]}) is None


# --- the same shapes: an earlier start of the same model that tunes other shapes ---------------


def _source(version: str, now: list[str], then: list[str]) -> bool:
    from fi_cache.engines.vllm.args import parse_serve_args
    from fi_cache.store.manifest import WarmRecord

    run = _vllm_run(version)
    run.args = parse_serve_args(now)
    earlier = WarmRecord(1.0, 1.0, None, then, "k", [], None, engine="vllm")
    return ENGINE.seed_source(run, earlier)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "then",
    [
        ["m", "-tp", "4"],  # its rank 0 and 1 files hold quarter shapes: a tp 2 start's gate passes
        ["m", "-tp", "2", "--quantization", "fp8"],
        ["m", "-tp", "2", "--enable-expert-parallel"],
        ["m", "-tp", "2", "--speculative-config", '{"num_speculative_tokens": 2}'],
    ],
)
def test_vllm_034_seeds_only_from_a_start_with_the_same_shapes(then: list[str]) -> None:
    assert not _source("0.34.0", ["m", "-tp", "2", "--max-num-seqs", "8"], then)
    assert _source("0.32.0", ["m", "-tp", "2", "--max-num-seqs", "8"], then)  # 0.32 tunes them


def test_vllm_034_seeds_from_the_same_shapes_with_another_batch_budget() -> None:
    now = ["m", "--tensor-parallel-size=2", "--max-num-batched-tokens", "16384"]
    assert _source("0.34.0", now, ["m", "-tp", "2", "--max-num-seqs", "8"])
