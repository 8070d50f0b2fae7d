"""A serve reads the engine's command line once: the lifecycle (prepare.py) parses it before
anything is looked up and carries the parsed arguments to the end, never parsing them again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.engines.vllm import args
from fi_cache.environment import Environment, VllmInfo
from fi_cache.lifecycle.report import Report
from fi_cache.lifecycle.serve import ServeOptions, serve
from fi_cache.model.fingerprint import Fingerprint
from tests.conftest import cli_main_exit
from tests.third_engine import Args, Third, request


class Counted(Third):
    """The stand-in engine, counting how often its arguments are read."""

    def __init__(self) -> None:
        self.reads = 0

    def read_args(self, argv: Sequence[str]) -> Args:
        self.reads += 1
        return super().read_args(argv)


def test_the_lifecycle_reads_a_serves_arguments_once(tmp_path: Path) -> None:
    engine = Counted()
    handover = serve(engine, request("m", warm=False), ServeOptions(warm=False), tmp_path, Report())
    assert handover.command[-1] == "m"
    assert engine.reads == 1


def test_a_vllm_serve_parses_its_argv_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fi-cache serve -- M -tp 2`: vLLM's arguments are parsed once (it was 3: the model check,
    the finalize rule's Ray check, bind)."""
    info = VllmInfo("0.33.0", "/site-packages/vllm/envs.py", True)
    env = Environment(Fingerprint(flashinfer_version="0.7.2.post1"), (), info, "2.11.0")
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)
    vllm = tmp_path / "vllm"  # found, never run: the handover is caught
    vllm.write_text("#!/bin/sh\nexit 0\n")
    vllm.chmod(0o755)
    monkeypatch.setenv("FI_CACHE_VLLM", str(vllm))
    parsed: list[tuple[str, ...]] = []
    parse = args.parse_serve_args

    def counted(argv: Sequence[str]) -> args.ServeArgs:
        parsed.append(tuple(argv))
        return parse(argv)

    handed: list[object] = []

    def caught(handover: object) -> None:
        handed.append(handover)
        raise SystemExit(0)

    monkeypatch.setattr(args, "parse_serve_args", counted)
    monkeypatch.setattr("fi_cache.lifecycle.serve.hand_over", caught)
    store = tmp_path / "store"
    code = cli_main_exit(["--store", str(store), "serve", "--no-warm", "--", "M", "-tp", "2"])
    assert code == 0 and handed, capsys.readouterr().err
    assert parsed == [("M", "-tp", "2")]
