"""vLLM 0.34's own per-stage autotune-cache gate, run in four gloo processes (gloo_pp_gate.py),
against what a user sees: which ranks keep their loaded files and which tune again, and what
fi-cache (`doctor -- ARGS`, whose groups are engines/vllm/layout.tune_groups) says of the same
files. FlashInfer 0.7.2.post1 (the nearest installed to 0.34's pin, 0.7.3) loads its own H200
v1 file (tests/fixtures/h200-fi07) on every rank that keeps one."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.vllm import layout
from fi_cache.engines.vllm.args import parse_serve_args
from fi_cache.ranks.deployment import rank_name
from fi_cache.versions import VLLM_RANK_FILE
from tests.conftest import FIXTURES, flashinfer_dir
from tests.ranks.gloo import run_ranks
from tests.vllm_wheels import need, unpacked

WORKER = Path(__file__).with_name("gloo_pp_gate.py")
FI = "0.7.2.post1"
V1_FILE = FIXTURES / "h200-fi07" / f"fi-{FI}" / "autotune_configs_dp0_rank0.json"
ENTRIES = 36  # the file's entries (tests/fixtures/h200-fi07/README.md)
MODEL = "Qwen/Qwen3-8B"
# (tp, pp, the rank file left out): (a) none, (b) one of stage 1's, (c) the same, pp 1
SCENARIOS = {"a": (2, 2, None), "b": (2, 2, 3), "c": (4, 1, 3)}


def _hash_dir(tmp: Path, name: str, tp: int, pp: int, without: int | None) -> Path:
    """A hash dir holding the files fi-cache's layout model names for `-tp tp -pp pp` on vLLM
    0.34, each FlashInfer's own file, but for world rank `without`'s."""
    hdir = tmp / name / FI / "90a" / (name * 64)
    hdir.mkdir(parents=True)
    args = parse_serve_args([MODEL, "-tp", str(tp), "-pp", str(pp)])
    files = layout.rank_files("0.34.0", FI, args, moe=False)
    assert files and all(VLLM_RANK_FILE.match(f) for f in files)
    for f in files:
        if f != f"autotune_configs_dp0_rank{without}.json":
            shutil.copy(V1_FILE, hdir / f)
    return hdir


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One start of four ranks per scenario, all in one gloo world (one torch import each)."""
    need("0.34.0")
    site = flashinfer_dir(FI)
    tmp = tmp_path_factory.mktemp("pp-gate")
    dirs = {n: _hash_dir(tmp, n, *s) for n, s in SCENARIOS.items()}
    plan = json.dumps(
        [{"tp": tp, "pp": pp, "dir": str(dirs[n])} for n, (tp, pp, _) in SCENARIOS.items()]
    )
    init = tmp / f"gloo-{uuid.uuid4().hex}"
    argv = [sys.executable, str(WORKER), str(unpacked("0.34.0")), str(init)]
    ranks = run_ranks(
        [[*argv, str(r), "4", str(V1_FILE), plan] for r in range(4)],
        {**os.environ, "PYTHONPATH": str(site)},
    )
    by_scenario = {n: [r["scenarios"][i] for r in ranks] for i, n in enumerate(SCENARIOS)}
    return {"dirs": dirs, "ranks": by_scenario}


def _kept(started: dict[str, Any], scenario: str) -> list[bool]:
    return [r["kept"] for r in started["ranks"][scenario]]


def _doctor_retunes(run: Callable[..., Any], hdir: Path, tp: int, pp: int) -> set[str]:
    """The ranks `fi-cache doctor HDIR -- ARGS` says tune again at the next start."""
    argv = ["--format", "json", "doctor", hdir, "--vllm-version", "0.34.0"]
    r = run(*argv, "--flashinfer-version", FI, "--", MODEL, "-tp", str(tp), "-pp", str(pp))
    assert r.code in (0, 1), r.err
    found = [f for f in r.json()["findings"] if f["check"] == "vllm-ranks-retune"]
    return {rank for f in found for rank in f["details"]["ranks"]}


def test_every_rank_with_its_file_keeps_it(started: dict[str, Any]) -> None:
    """(a) tp 2, pp 2, every file there: vLLM names them dp0_rank{world rank}, each stage's TP
    group ([0, 1] and [2, 3]) gates alone, and every rank keeps FlashInfer's loaded entries."""
    ranks = started["ranks"]["a"]
    assert [r["file"] for r in ranks] == [f"autotune_configs_dp0_rank{i}.json" for i in range(4)]
    assert [r["tune_group"] for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert _kept(started, "a") == [True] * 4
    assert [r["entries"] for r in ranks] == [ENTRIES] * 4


def test_a_stage_missing_one_file_tunes_alone_as_fi_cache_says(
    started: dict[str, Any], run: Callable[..., Any]
) -> None:
    """(b) stage 1 lacks rank 3's file: stage 0 keeps its files, both of stage 1's ranks come
    up empty and tune; fi-cache's tune groups and doctor name the same ranks."""
    ranks = started["ranks"]["b"]
    assert [r["had_file"] for r in ranks] == [True, True, True, False]
    assert _kept(started, "b") == [True, True, False, False]
    assert [r["entries"] for r in ranks] == [ENTRIES, ENTRIES, 0, 0]
    names = tuple(rank_name(r["file"]) for r in ranks)
    vllm_groups = {tuple(names[i] for i in r["tune_group"]) for r in ranks}
    assert set(layout.tune_groups(parse_serve_args([MODEL, "-tp", "2", "-pp", "2"]), names)) == (
        vllm_groups
    )
    tunes = {rank_name(r["file"]) for r in ranks if not r["kept"]}
    assert _doctor_retunes(run, started["dirs"]["b"], 2, 2) == tunes == {"dp0_rank2", "dp0_rank3"}


def test_without_stages_one_missing_file_makes_every_rank_tune(started: dict[str, Any]) -> None:
    """(c) tp 4, pp 1: the world is the tune group, so rank 3's missing file clears all four."""
    ranks = started["ranks"]["c"]
    assert [r["tune_group"] for r in ranks] == [[0, 1, 2, 3]] * 4
    assert [r["had_file"] for r in ranks] == [True, True, True, False]
    assert _kept(started, "c") == [False] * 4
    assert [r["entries"] for r in ranks] == [0] * 4


def test_doctor_says_every_rank_tunes_when_the_last_ranks_file_is_missing(
    started: dict[str, Any], run: Callable[..., Any]
) -> None:
    tunes = {rank_name(r["file"]) for r in started["ranks"]["c"] if not r["kept"]}
    assert _doctor_retunes(run, started["dirs"]["c"], 4, 1) == tunes
