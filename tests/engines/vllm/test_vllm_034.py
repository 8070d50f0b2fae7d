"""vLLM 0.34.0 read right: what changed from 0.33.0, checked against both releases' own code
(their wheels, tests/vllm_wheels.py)."""

from __future__ import annotations

import pytest

from fi_cache.engines.vllm.args import _is_bool_flag, parse_serve_args
from tests.engines.vllm.serve_flags import serve_flags
from tests.vllm_wheels import RELEASES, need


@pytest.mark.parametrize("version", RELEASES)
def test_every_flag_vllm_takes_alone_is_read_alone_and_no_other(version: str) -> None:
    """fi-cache's table of valueless `vllm serve` flags agrees with the release's parser: the
    token after a valueless flag is the next argument, after any other flag its value."""
    need(version)
    flags = serve_flags(version)
    assert sorted(f for f in flags.valueless if not _is_bool_flag(f)) == []
    assert sorted(f for f in flags.valued if _is_bool_flag(f)) == []


def test_the_derivation_sees_the_flags_034_added() -> None:
    need("0.33.0")
    need("0.34.0")
    new = serve_flags("0.34.0").valueless - serve_flags("0.33.0").valueless
    assert {"--checkpoint-prepare-on-startup", "--shuffle-safetensors-files"} <= new


@pytest.mark.parametrize("flag", ["--shuffle-safetensors-files", "--checkpoint-prepare-on-startup"])
def test_a_034_flag_before_tp_keeps_tp(flag: str) -> None:
    args = parse_serve_args(["Qwen/Qwen3-8B", flag, "-tp", "2"])
    assert (args.model, args.tp, args.world_size) == ("Qwen/Qwen3-8B", 2, 2)
    args = parse_serve_args([flag, "Qwen/Qwen3-8B", "-tp", "2"])
    assert (args.model, args.tp) == ("Qwen/Qwen3-8B", 2)
