"""Shared fixtures: real FlashInfer files (tests/fixtures/) and a CLI runner."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from fi_cache.cli import cli

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200"
FI = FIXTURES / "flashinfer"
GEMM_617 = H200 / "flashinfer-0.6.17-gemm.json"
GEMM_618 = H200 / "flashinfer-0.6.18-gemm.json"
MOE_617_FUSED = FI / "fi-0.6.17-moe-fused.json"
MOE_617_UNFUSED = FI / "fi-0.6.17-moe-unfused.json"
MOE_618_FUSED = FI / "fi-0.6.18-moe-fused.json"
MOE_618_UNFUSED = FI / "fi-0.6.18-moe-unfused.json"
HASH_A = "a" * 64
HASH_B = "b" * 64


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.out)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def run(store: Path):  # type: ignore[no-untyped-def]
    """Run `fi-cache ARGS` in-process, through the real entry point (its error handling too),
    against an empty temporary store."""

    def _run(*args: str) -> Result:
        from fi_cache.cli import main

        runner = CliRunner()
        with runner.isolation() as streams:
            try:
                main(["--store", str(store), *map(str, args)])
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
        return Result(code, out, err)

    return _run


@pytest.fixture
def vllm_root(tmp_path: Path) -> Path:
    """A $VLLM_CACHE_ROOT/flashinfer_autotune_cache tree as vLLM 0.27-0.32 lays it out."""
    root = tmp_path / "vllm" / "flashinfer_autotune_cache"
    a = root / "0.6.17" / "90a" / HASH_A
    b = root / "0.6.18" / "90a" / HASH_B
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, a / "autotune_configs.json")
    shutil.copy(MOE_618_UNFUSED, b / "autotune_configs_dp0_rank0.json")
    shutil.copy(GEMM_618, b / "autotune_configs_dp0_rank1.json")
    return root


def cli_main_exit(args: list[str]) -> int:
    """Exit code of the real console entry point (error handling included)."""
    from fi_cache.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


__all__ = ["cli"]
