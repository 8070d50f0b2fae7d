"""serve's node fill for SGLang, whose key dir only its worker can hash: a second node of
`--tp-size 4 --nnodes 2` whose store holds node 0's rank files (a pulled bundle) gets its own
two by SGLang's names, so the digest over the four ranks finds them equal and keeps them."""

from __future__ import annotations

import shutil
from pathlib import Path

from fi_cache.caches.inventory import scan
from fi_cache.engines.api import Run, Target
from fi_cache.engines.sglang.args import SglangArgs, parse_sglang_args
from fi_cache.engines.sglang.engine import ENGINE
from fi_cache.lifecycle.ranks import complete_node
from fi_cache.lifecycle.report import Report
from fi_cache.ranks.agreement import sglang_deletes, sglang_digest
from fi_cache.ranks.deployment import gather
from tests.conftest import GEMM_618
from tests.sglang_layout import sglang_paths

MODEL = ["--model-path", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass"]


def _run(args: SglangArgs) -> Run[SglangArgs, None]:
    """A start of these arguments: the fill reads the args only."""
    target = Target(
        ns=None,  # type: ignore[arg-type]
        env=None,  # type: ignore[arg-type]
        version="0.5.23",
        path=None,
        argv=args.argv,
        args=args,
        launcher=None,
    )
    return Run(target=target, launcher=None, nothing_to_tune=None)


def _node1(*more: str) -> Run[SglangArgs, None]:
    return _run(
        parse_sglang_args([*MODEL, "--tp-size", "4", "--nnodes", "2", "--node-rank", "1", *more])
    )


def _node0_files(ns_dir: Path) -> Path:
    for rank in (0, 1):
        path, _ = sglang_paths("0.5.23", ns_dir / "sglang", tp=4, tp_rank=rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(GEMM_618, path)
    return path.parent


def test_the_second_node_gets_its_own_rank_files_and_sglang_keeps_all_four(tmp_path: Path) -> None:
    ns_dir = tmp_path / "ns"
    key_dir = _node0_files(ns_dir)
    noted: list[str] = []
    written = complete_node(ENGINE, _node1(), ns_dir, tmp_path, Report(note=noted.append))
    assert sorted(p.name for p in written) == ["rank_tp2_pp0_dp0.json", "rank_tp3_pp0_dp0.json"]
    [dep] = gather(scan([key_dir]).caches)
    [group] = dep.groups()
    assert len(group) == 4 and not sglang_deletes(sglang_digest(group))
    assert any("filled with their union" in n for n in noted)


def test_nothing_is_written_where_another_nodes_ranks_are_missing(tmp_path: Path) -> None:
    """--tp-size 8 on 2 nodes: node 0 holds tp0-tp3, this store only tp0-tp1 (not that layout)."""
    ns_dir = tmp_path / "ns"
    _node0_files(ns_dir)
    args = parse_sglang_args([*MODEL, "--tp-size", "8", "--nnodes", "2", "--node-rank", "1"])
    run = _run(args)
    assert complete_node(ENGINE, run, ns_dir, tmp_path, Report()) == []
