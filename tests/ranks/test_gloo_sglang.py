"""SGLang's own autotune context (0.5.21, 0.5.23 wheels) in two gloo processes, one TP group,
with FlashInfer's real tuner: files that differ are discarded on every rank as fi-cache's
reading says; after `fi-cache align` every rank keeps its file across boots and hits its own
entries, rank-keyed ones (FlashInfer 0.6.18) included."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from fi_cache.caches import inventory
from fi_cache.maintenance.align import apply
from fi_cache.model import v1
from fi_cache.ranks.agreement import sglang_deletes, sglang_digest
from fi_cache.ranks.deployment import gather
from tests.conftest import GEMM_618, MOE_618_FUSED, flashinfer_dir
from tests.ranks.gloo import run_ranks
from tests.ranks.test_ranks import _as_rank
from tests.sglang_layout import sglang_module

WORKER = Path(__file__).with_name("gloo_sglang.py")
RANKS = ("tp0_pp0_dp0", "tp1_pp0_dp0")  # --tp-size 2: one TP group, SGLang's digest runs


def _boot(version: str, fi: str, hdir: Path, own: list[v1.CacheFile], tmp: Path) -> list[dict]:
    """One start of both ranks through SGLang `version`'s context; `own`: each rank's entries."""
    source = tmp / f"flashinfer_autotune-{version}.py"
    if not source.exists():
        source.write_text(sglang_module(version))
    n = uuid.uuid4().hex  # a FileStore file is never reused
    env_file = tmp / "env.json"
    env_file.write_text(json.dumps(own[0].metadata))  # every rank reads on the tuning stack
    argvs = []
    for i, rank in enumerate(RANKS):
        keys = tmp / f"keys-{n}-{i}.json"
        keys.write_text(json.dumps(own[i].entries))
        argvs.append(
            [
                sys.executable,
                str(WORKER),
                str(source),
                str(tmp / f"gloo-{n}"),
                str(i),
                "2",
                str(hdir / f"rank_{rank}.json"),
                str(env_file),
                str(keys),
            ]
        )
    env = {**os.environ, "PYTHONPATH": f"{flashinfer_dir(fi)}{os.pathsep}{Path.cwd()}"}
    return run_ranks(argvs, env)


def _deployment_verdict(hdir: Path):  # type: ignore[no-untyped-def]
    [dep] = gather(inventory.scan([hdir]).caches)
    [group] = dep.groups()
    return sglang_digest(group)


def _key_dir(tmp: Path, fi: str) -> Path:
    hdir = tmp / "flashinfer" / "autotune" / fi / "sm90" / ("c" * 16)
    hdir.mkdir(parents=True)
    return hdir


@pytest.mark.parametrize(("version", "fi"), [("0.5.21", "0.6.18"), ("0.5.23", "0.7.2.post1")])
def test_a_short_rank_loses_the_groups_cache_and_the_aligned_set_survives(
    tmp_path: Path, version: str, fi: str
) -> None:
    hdir = _key_dir(tmp_path, fi.removesuffix(".post1"))
    cf = v1.loads(GEMM_618.read_bytes())  # rank-free keys: every rank looks up the same ones
    short = v1.CacheFile(cf.metadata, dict(list(cf.entries.items())[3:]), None, cf.generation)
    (hdir / f"rank_{RANKS[0]}.json").write_text(v1.dumps(cf))
    (hdir / f"rank_{RANKS[1]}.json").write_text(v1.dumps(short))
    ours = _deployment_verdict(hdir)
    assert sglang_deletes(ours) and ours.differs == (RANKS[1],)
    before = _boot(version, fi, hdir, [cf, cf], tmp_path)
    assert [r["discarded"] for r in before] == [True, True]  # SGLang's own digest, every rank
    assert [r["hits"] for r in before] == [0, 0]

    (hdir / f"rank_{RANKS[0]}.json").write_text(v1.dumps(cf))
    (hdir / f"rank_{RANKS[1]}.json").write_text(v1.dumps(short))
    [plan] = apply([hdir])
    assert plan.aligned is not None and _deployment_verdict(hdir).loads
    for boot in range(2):  # 0.5.21+ saves at every start: the next one must agree again
        after = _boot(version, fi, hdir, [cf, cf], tmp_path)
        assert [r["discarded"] for r in after] == [False, False], boot
        assert all(r["loaded"] == [True] and r["hits"] == len(cf.entries) for r in after)
        assert after[0]["after"] == after[1]["after"] != ""


def test_rank_keyed_moe_files_are_discarded_every_boot_until_aligned(tmp_path: Path) -> None:
    """SGLang 0.5.21 pins FlashInfer 0.6.18, whose CUTLASS MoE keys carry tp_rank: the files two
    TP ranks tune never agree, so upstream deletes them at every start (sglang #40320)."""
    hdir = _key_dir(tmp_path, "0.6.18")
    moe = v1.loads(MOE_618_FUSED.read_bytes())
    own = [_as_rank(moe, 0), _as_rank(moe, 1)]
    for rank, cf in zip(RANKS, own, strict=True):
        (hdir / f"rank_{rank}.json").write_text(v1.dumps(cf))
    assert sglang_deletes(_deployment_verdict(hdir))
    assert [r["discarded"] for r in _boot("0.5.21", "0.6.18", hdir, own, tmp_path)] == [True] * 2

    for rank, cf in zip(RANKS, own, strict=True):
        (hdir / f"rank_{rank}.json").write_text(v1.dumps(cf))
    [plan] = apply([hdir])
    assert plan.aligned is not None and len(plan.aligned.file.entries) == 2 * len(moe.entries)
    for _ in range(2):
        after = _boot("0.5.21", "0.6.18", hdir, own, tmp_path)
        assert [r["discarded"] for r in after] == [False, False]
        # Each rank hits every one of its own rank-keyed entries in the shared file.
        assert [r["hits"] for r in after] == [len(moe.entries)] * 2
