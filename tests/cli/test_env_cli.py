"""`fi-cache env` as a user runs it: a namespace per finalize mode, a relative store."""

from __future__ import annotations

from pathlib import Path


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
