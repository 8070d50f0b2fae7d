"""serve/warm refusals that depend on what the installed vLLM supports (in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_cache import environment
from fi_cache.environment import Environment, VllmInfo
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.namespace import Namespace
from tests.conftest import cli_main_exit


def _env_with(supports: bool | None) -> Environment:
    info = VllmInfo(
        "0.33.0", "/site-packages/vllm/envs.py" if supports is not None else None, supports
    )
    return Environment(Fingerprint(flashinfer_version="0.7.2.post1"), (), info, "2.11.0")


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--deterministic"],
        ["serve", "--finalize", "unfused"],
        ["serve", "--finalize", "unfused", "--deterministic"],
        ["warm", "--finalize", "unfused"],
    ],
)
def test_unfused_on_a_vllm_without_the_variable_is_refused(
    command: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(False))
    code = cli_main_exit(["--store", str(tmp_path), *command, "--", "Qwen/Qwen3-30B-A3B"])
    err = capsys.readouterr().err
    assert code == 2
    assert "vLLM 0.33.0 does not read VLLM_FLASHINFER_MOE_FUSED_FINALIZE" in err
    assert "VLLM_BATCH_INVARIANT=1" in err and "--moe-backend triton" in err and "--force" in err
    assert err.count("\n") == 1


def test_force_goes_on_with_a_warning(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(False))
    monkeypatch.setenv("FI_CACHE_VLLM", str(tmp_path / "missing-vllm"))
    code = cli_main_exit(
        ["--store", str(tmp_path), "serve", "--deterministic", "--force", "--", "m"]
    )
    err = capsys.readouterr().err
    assert "going on: --force" in err and code == 2 and "no vLLM executable" in err


@pytest.mark.parametrize("command", [["serve"], ["warm"]])
def test_the_users_unfused_variable_on_a_vllm_without_it_is_refused(
    command: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """=0 in the environment asks for the unfused namespace, which this vLLM cannot fill."""
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(False))
    monkeypatch.setenv("VLLM_FLASHINFER_MOE_FUSED_FINALIZE", "0")
    code = cli_main_exit(["--store", str(tmp_path), *command, "Qwen/Qwen3-30B-A3B"])
    note, refusal = capsys.readouterr().err.splitlines()
    assert code == 2
    assert note.startswith("fi-cache: VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 in the environment")
    assert "vLLM 0.33.0 does not read VLLM_FLASHINFER_MOE_FUSED_FINALIZE" in refusal


def test_a_cache_dir_of_the_users_is_replaced_with_a_line_saying_so(
    tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(True))
    monkeypatch.setenv("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "/data/my-cache")
    vllm = tmp_path / "vllm"  # found, never run: the handover is caught
    vllm.write_text("#!/bin/sh\nexit 0\n")
    vllm.chmod(0o755)
    monkeypatch.setenv("FI_CACHE_VLLM", str(vllm))

    def caught(handover: object) -> None:
        raise SystemExit(0)

    monkeypatch.setattr("fi_cache.lifecycle.serve.hand_over", caught)
    cli_main_exit(["--store", str(tmp_path), "serve", "--no-warm", "Qwen/Qwen3-30B-A3B"])
    [said] = [ln for ln in capsys.readouterr().err.splitlines() if "my-cache" in ln]
    assert said.startswith("fi-cache: VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=/data/my-cache in the ")
    ns = Namespace(_env_with(True).fingerprint, "fused").path(tmp_path.resolve())
    assert said.endswith(f"vLLM gets {ns / 'vllm'} instead")


@pytest.mark.parametrize(
    "args",
    [
        ["warm", "--timeout", "-1"],
        ["warm", "--timeout", "0"],
        ["warm", "--lock-timeout", "-1"],
        ["serve", "--timeout", "-1"],
        ["serve", "--lock-timeout", "-1"],
    ],
)
def test_a_timeout_that_cannot_be_waited_for_is_refused(
    args: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: pytest.fail("got past parsing"))
    code = cli_main_exit(["--store", str(tmp_path), *args, "--", "Qwen/Qwen3-30B-A3B"])
    err = capsys.readouterr().err
    assert code == 2 and f"Invalid value for '{args[1]}'" in err
    assert not (tmp_path / "namespaces").exists()


@pytest.mark.parametrize(
    "command", [["serve", "--deterministic"], ["warm", "--finalize", "unfused"]]
)
def test_quiet_silences_the_uninspectable_vllm_warning(
    command: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(None))
    monkeypatch.setenv("FI_CACHE_VLLM", str(tmp_path / "missing-vllm"))
    code = cli_main_exit(["--store", str(tmp_path), "-q", *command, "--", "m"])
    err = capsys.readouterr().err
    assert code == 2 and "no vLLM executable" in err and "cannot inspect" not in err
    assert err.count("\n") == 1  # -q: only the error
    cli_main_exit(["--store", str(tmp_path), *command, "--", "m"])
    assert capsys.readouterr().err.count("cannot inspect the vLLM package") == 1


def test_serve_finalize_fused_against_the_users_unfused_variable_is_refused(
    tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """serve --finalize fused reads as warm's: the user's =0 is never overridden."""
    monkeypatch.setattr(environment, "detect", lambda *a, **k: _env_with(True))
    monkeypatch.setenv("VLLM_FLASHINFER_MOE_FUSED_FINALIZE", "0")
    code = cli_main_exit(["--store", str(tmp_path), "serve", "--finalize", "fused", "m"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--finalize fused" in err, err
