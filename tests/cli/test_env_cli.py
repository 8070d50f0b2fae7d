"""`fi-cache env` as a user runs it: a namespace per finalize mode, a relative store, the lock
strategy of a read-only store."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import VLLM_PYTHON, needs_vllm
from tests.maintenance.test_prune import make_namespace


def test_env_json_names_a_namespace_per_finalize_mode(run, store: Path) -> None:  # type: ignore[no-untyped-def]
    doc = run("--format", "json", "env", "--no-exact").json()
    assert set(doc["metadata"]) >= {
        "flashinfer_version",
        "cuda_version",
        "cublas_version",
        "cudnn_version",
        "cudnn_frontend_version",
        "gpu",
    }
    fused, unfused = doc["namespaces"]["fused"], doc["namespaces"]["unfused"]
    assert fused != unfused and fused.startswith(str(store)) and "/fused-" in fused
    assert "supports_fused_finalize_env" in doc["vllm"]


def test_a_relative_store_works(run, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    r = run("--store", "rel-store", "--format", "json", "env", "--no-exact")
    assert r.json()["store"] == str(tmp_path / "rel-store")


@needs_vllm
def test_env_reads_the_vllm_of_another_venv(run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """fi-cache in its own venv, vLLM in another (the usual install): `env` reports that vLLM,
    read from the interpreter its `vllm` script names, not "not installed"."""
    python = Path(VLLM_PYTHON)
    monkeypatch.setenv("FI_CACHE_VLLM", str(python.parent / "vllm"))
    doc = run("--format", "json", "env", "--no-exact").json()
    assert doc["python"] == str(python)
    assert doc["vllm"]["version"] == "0.32.0"
    assert doc["vllm"]["supports_fused_finalize_env"] is False
    assert doc["vllm"]["envs_path"].startswith(str(python.parent.parent))


def test_env_says_a_read_only_store_is_read_only(  # type: ignore[no-untyped-def]
    run, store: Path, read_only
) -> None:
    """Not "does not honour flock": nothing can be locked there, nor tested."""
    make_namespace(store)
    read_only(store)
    r = run("env", "--no-exact")
    assert r.code == 0, r.err
    [line] = [x for x in r.out.splitlines() if x.startswith("store ")]
    assert "read-only file system" in line and "honour" not in line, line
    why = run("--format", "json", "env", "--no-exact").json()["lock"]["why"]
    assert "read-only file system: nothing here can be locked or written" in why
