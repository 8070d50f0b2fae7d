"""Files fi-cache writes load in the real FlashInfer (`AutoTuner.load_configs`).

FlashInfer is imported in a child process (tests/fixtures/fi_load.py) from the dirs listed in
FI_CACHE_FLASHINFER_DIRS, which scripts/test.sh fills with FlashInfer 0.6.17 and 0.6.18
(installed --no-deps beside a CPU torch). Without them these tests skip; under scripts/test.sh
(FI_CACHE_REQUIRE_FLASHINFER=1) they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.model import v1
from fi_cache.store.files import atomic_write
from tests.conftest import (
    FIXTURES,
    GEMM_617,
    GEMM_618,
    MOE_617_FUSED,
    MOE_618_FUSED,
    flashinfer_dir,
)


def _load_with_flashinfer(version: str, path: Path) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir(version))}  # skips, or fails in CI
    p = subprocess.run(
        [sys.executable, str(FIXTURES / "fi_load.py"), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def _merge_write(sources: list[Path], out: Path) -> v1.CacheFile:
    """What fi-cache's writers do: union of same-metadata files, FlashInfer layout, atomic."""
    files = [v1.loads(p.read_bytes()) for p in sources]
    entries: dict[str, list[object]] = {}
    for f in files:
        entries.update(f.entries)
    merged = v1.CacheFile(files[0].metadata, entries, generation=files[0].generation)
    atomic_write(out, v1.dumps(merged).encode())
    return merged


@pytest.mark.parametrize(
    "version, sources",
    [("0.6.17", [GEMM_617, MOE_617_FUSED]), ("0.6.18", [GEMM_618, MOE_618_FUSED])],
)
def test_flashinfer_loads_every_entry_fi_cache_wrote(
    version: str, sources: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "autotune_configs.json"
    merged = _merge_write(sources, out)
    result = _load_with_flashinfer(version, out)
    assert "error" not in result, result.get("error")
    assert result["flashinfer_version"] == version and result["returned"] is True
    assert result["loaded"] == len(merged.entries) == 70
    assert sorted(result["keys"]) == sorted(merged.entries)
    assert result["values"] == {k: v[:2] for k, v in merged.entries.items()}
    if version == "0.6.17":  # no `_generation` written, so no bogus entry for a 0.6.17 reader
        assert not any(k.startswith("_") for k in result["keys"])
