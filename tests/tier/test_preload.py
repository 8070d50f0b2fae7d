"""`vllm preload ARGS` (fi_cache/tier/preload.py): the daemon's own options set apart, the
engine's arguments judged as `vllm serve`'s, and what the daemons do said by doctor."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fi_cache.errors import Refused
from fi_cache.tier.preload import PRELOAD_OPTIONS, split_preload
from tests.conftest import Result
from tests.vllm_wheels import module_text, need

Run = Callable[..., Result]


def test_the_daemon_options_are_the_wheels() -> None:
    need("0.34.0")
    text = module_text("0.34.0", "vllm/entrypoints/cli/preload.py")
    for name in PRELOAD_OPTIONS:
        assert f'"{name}",' in text


def test_a_preload_line_splits_into_the_engine_and_the_daemon() -> None:
    p = split_preload(
        [
            "/opt/bin/vllm",
            "preload",
            "--model",
            "Qwen/Qwen3-8B",
            "-tp",
            "2",
            "--warmup-cache-stores=mooncake, disk2",
            "--seed-token",
            "s3cret",
        ]
    )
    assert p is not None
    assert p.serve_argv() == ["/opt/bin/vllm", "serve", "--model", "Qwen/Qwen3-8B", "-tp", "2"]
    assert p.stores == ("mooncake", "disk2") and p.seeds
    assert split_preload(["vllm", "serve", "m"]) is None
    with pytest.raises(Refused, match="--seed-token needs a value"):
        split_preload(["vllm", "preload", "--model", "m", "--seed-token"])


def test_doctor_reads_vllm_preload_as_the_daemons_of_that_engine(run: Run) -> None:
    doctor = ["doctor", "--flashinfer-version", "0.7.4", "--vllm-version", "0.33.0", "--"]
    r = run(
        *doctor,
        "vllm",
        "preload",
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "-dp",
        "2",
        "--warmup-cache-stores",
        "mooncake",
        "--seed-token",
        "t",
        "--seed-listen-host",
        "127.0.0.1",
        "--seed-listen-port",
        "9000",
    )
    assert r.code == 0, r.err
    assert "autotune_configs_dp0_rank0.json, autotune_configs_dp1_rank1.json" in r.out
    assert "info    vllm-preload  `vllm preload` daemons tune FlashInfer" in r.out
    assert "installs a peer's table over the local file" in r.out
    assert "fix: fi-cache doctor mooncake://vllm-warmup-cache/flashinfer_autotune/" in r.out
