"""engines/sglang/keydir.py against SGLang's own key code, read from its 0.5.17-0.5.23 wheels
(.cache/sglang-wheels, scripts/test.sh): the key dir fi-cache computes is the one SGLang's
function names in tests/sglang_layout.py's run of it, and the worker's values come back from a
key dir alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fi_cache.engines.sglang import keydir
from fi_cache.engines.sglang.args import parse_sglang_args
from tests import sglang_layout

QWEN = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
M = "Qwen/Qwen3-30B-A3B"


def code(version: str) -> keydir.KeyCode:
    try:
        return keydir.KeyCode(sglang_layout.sglang_module(version), f"sglang-{version}")
    except sglang_layout.NoWheel as exc:
        if os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def inputs(**kw: object) -> keydir.KeyInputs:
    base = dict(
        model_path=M,
        dtype="torch.bfloat16",
        quantization=None,
        moe_backend="flashinfer_cutlass",
        tp=1,
        pp=1,
        attn_dp=1,
        ep=1,
        hf_class="Qwen3MoeConfig",
        skip_ops=frozenset(),
    )
    return keydir.KeyInputs(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["0.5.18", "0.5.23"])
@pytest.mark.parametrize(
    ("tp", "ep", "backend"), [(1, 1, "flashinfer_cutlass"), (4, 4, "flashinfer_trtllm")]
)
def test_the_key_dir_is_the_one_sglangs_own_function_names(
    version: str, tp: int, ep: int, backend: str, tmp_path: Path
) -> None:
    rank_file, _ = sglang_layout.sglang_paths(
        version, tmp_path, model=M, tp=tp, ep=ep, backend=backend
    )
    got = code(version).key(inputs(tp=tp, ep=ep, moe_backend=backend))
    assert got == rank_file.parent.name


def test_releases_that_hash_alike_give_one_dir_and_those_that_do_not_another() -> None:
    keys = {v: code(v).key(inputs()) for v in ("0.5.17", "0.5.18", "0.5.21", "0.5.23")}
    assert keys["0.5.18"] == keys["0.5.21"]
    assert len({keys["0.5.17"], keys["0.5.18"], keys["0.5.23"]}) == 3  # skip ops; candidates
    assert code("0.5.17").skips() == {"mxfp8_gemm"} and code("0.5.23").skips() == frozenset()


def test_the_workers_values_are_solved_from_a_dir_and_a_local_copy_gets_its_key() -> None:
    c = code("0.5.23")
    earlier = parse_sglang_args(["--model-path", M, "--tp-size", "2"])  # backend: auto
    truth = inputs(tp=2, dtype="torch.float16", moe_backend="flashinfer_trtllm")
    solved = keydir.solve(c, earlier, QWEN, c.key(truth))
    assert solved == truth
    now = parse_sglang_args(["--model-path", "/models/qwen3", "--tp-size", "2"])
    carried, why = keydir.carried(solved, earlier, now, c)
    assert why is None and carried is not None
    assert c.key(carried) == c.key(
        inputs(
            model_path="/models/qwen3", tp=2, dtype="torch.float16", moe_backend="flashinfer_trtllm"
        )
    )


def test_an_0_5_17_dir_seeds_0_5_18_whose_release_stopped_skipping_mxfp8_gemm() -> None:
    old_key = code("0.5.17").key(inputs())
    args = parse_sglang_args(["--model-path", M, "--moe-runner-backend", "flashinfer_cutlass"])
    solved = keydir.solve(code("0.5.18"), args, QWEN, old_key)
    assert solved is not None and solved.skip_ops == {"mxfp8_gemm"}
    carried, why = keydir.carried(solved, args, args, code("0.5.18"))
    assert why is None and carried is not None and carried.skip_ops == frozenset()
    assert code("0.5.18").key(carried) == code("0.5.18").key(inputs())


def test_nothing_is_solved_across_0_5_23s_deliberate_retune() -> None:
    args = parse_sglang_args(["--model-path", M, "--moe-runner-backend", "flashinfer_cutlass"])
    assert keydir.solve(code("0.5.23"), args, QWEN, code("0.5.21").key(inputs())) is None


def test_an_op_this_start_skips_but_the_earlier_tuned_is_not_carried() -> None:
    c = code("0.5.23")
    earlier = parse_sglang_args(["--model-path", M, "--moe-runner-backend", "flashinfer_cutlass"])
    solved = keydir.solve(c, earlier, QWEN, c.key(inputs()))
    assert solved is not None
    now = parse_sglang_args([*earlier.argv, "--flashinfer-autotune-skip-ops", "fp8_gemm", "x"])
    assert now.skip_ops == ("fp8_gemm", "x")
    carried, why = keydir.carried(solved, earlier, now, c)
    assert carried is None and why is not None and "skips tuning fp8_gemm, x" in why


def test_auto_is_not_carried_to_other_parallel_sizes() -> None:
    c = code("0.5.23")
    earlier = parse_sglang_args(["--model-path", M])
    solved = keydir.solve(c, earlier, QWEN, c.key(inputs()))
    assert solved is not None and solved.moe_backend == "flashinfer_cutlass"
    carried, why = keydir.carried(
        solved, earlier, parse_sglang_args(["--model-path", M, "--tp", "2"]), c
    )
    assert carried is None and why is not None and "auto" in why


def test_config_classes_come_from_architectures_and_model_type() -> None:
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    assert keydir.config_classes(cfg) == ["DeepseekV3Config"]
    assert keydir.config_classes({"model_type": "qwen3_moe"}) == ["Qwen3MoeConfig"]
    assert keydir.config_classes(None) == []


UNRUNNABLE = [
    "def f(:\n",
    "x = 1\n",
    "import os\ndef flashinfer_autotune_cache_path(m):\n    return os.sep\n",
]


@pytest.mark.parametrize("source", UNRUNNABLE)
def test_key_code_fi_cache_cannot_run_is_said_not_guessed(source: str) -> None:
    with pytest.raises(keydir.KeyCodeChanged):
        keydir.KeyCode(source, "x.py").key(inputs())
