"""Seeding the file vLLM will read from a namespace's earlier files for the same model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.maintenance import seed
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace
from tests.conftest import (
    FIXTURES,
    GEMM_617,
    GEMM_618,
    HASH_A,
    HASH_B,
    MOE_617_FUSED,
    flashinfer_dir,
)

RANK0 = "autotune_configs_dp0_rank0.json"


def _warm(argv: list[str], *paths: str, started: float = 1.0, ok: bool = True) -> WarmRecord:
    files = [CacheFileRecord(p, 0, 0) for p in paths]
    return WarmRecord(started, 1.0, "0.32.0", argv, " ".join(argv), files, None, ok)


def _ns(tmp_path: Path, *warms: WarmRecord) -> tuple[Path, Manifest]:
    ns = Namespace(Fingerprint(flashinfer_version="0.6.18"), "fused")
    m = Manifest.new(ns)
    for w in warms:
        m = m.with_warm(w)
    return tmp_path / "ns", m


def _put(ns_dir: Path, rel: str, source: Path) -> Path:
    path = ns_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, path)
    return path


def _model(name: str):  # type: ignore[no-untyped-def]
    return lambda warm: bool(warm.argv) and warm.argv[0] == name


def test_the_new_file_gets_the_same_models_entries_in_flashinfers_format(tmp_path: Path) -> None:
    ns_dir, m = _ns(tmp_path, _warm(["m", "--max-model-len", "4096"], f"vllm/{HASH_A}/{RANK0}"))
    _put(ns_dir, f"vllm/{HASH_A}/{RANK0}", GEMM_618)
    target = ns_dir / "vllm" / HASH_B / RANK0
    seeds, notes = seed.plan(ns_dir, m, _model("m"), [target])
    assert notes == [] and [s.target for s in seeds] == [target]
    seed.write(seeds[0])
    written = v1.loads(target.read_bytes())
    original = v1.loads(GEMM_618.read_bytes())
    assert written.entries == original.entries and written.metadata == original.metadata
    assert written.generation == v1.compute_generation(written)  # 0.6.18 writes one


def test_another_model_never_gives_its_entries(tmp_path: Path) -> None:
    """Equal shapes, other quantisation: on FlashInfer <= 0.6.17 the keys cannot tell."""
    ns_dir, m = _ns(tmp_path, _warm(["other/model"], f"vllm/{HASH_A}/{RANK0}"))
    _put(ns_dir, f"vllm/{HASH_A}/{RANK0}", MOE_617_FUSED)
    seeds, _ = seed.plan(ns_dir, m, _model("m"), [ns_dir / "vllm" / HASH_B / RANK0])
    assert seeds == []


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    ns_dir, m = _ns(tmp_path, _warm(["m"], f"vllm/{HASH_A}/{RANK0}"))
    _put(ns_dir, f"vllm/{HASH_A}/{RANK0}", GEMM_618)
    target = _put(ns_dir, f"vllm/{HASH_B}/{RANK0}", GEMM_617)
    seeds, _ = seed.plan(ns_dir, m, _model("m"), [target])
    assert seeds == [] and target.read_bytes() == GEMM_617.read_bytes()


def test_flagged_corrupt_and_failed_sources_are_never_used(tmp_path: Path) -> None:
    a, b, c = (f"vllm/{h * 64}/{RANK0}" for h in "cde")
    ns_dir, m = _ns(
        tmp_path,
        _warm(["m"], a, started=1),
        _warm(["m"], b, started=2),
        _warm(["m"], c, started=3, ok=False),
    )
    _put(ns_dir, a, GEMM_618)
    (ns_dir / b).parent.mkdir(parents=True)
    (ns_dir / b).write_text('{"_metadata": {')  # torn
    _put(ns_dir, c, GEMM_618)
    target = ns_dir / "vllm" / HASH_B / RANK0
    seeds, notes = seed.plan(ns_dir, m, _model("m"), [target], exclude=[ns_dir / a])
    assert seeds == []  # a is flagged (doctor's checks), b is corrupt, c's warm failed
    assert len(notes) == 1 and str(ns_dir / b) in notes[0]


def test_ranks_are_seeded_rank_by_rank(tmp_path: Path) -> None:
    """FlashInfer 0.6.18-0.7.1 MoE keys carry the rank: rank 1 takes rank 1's entries only."""
    r0, r1 = f"vllm/{HASH_A}/{RANK0}", f"vllm/{HASH_A}/autotune_configs_dp0_rank1.json"
    ns_dir, m = _ns(tmp_path, _warm(["m", "-tp", "2"], r0, r1))
    _put(ns_dir, r0, GEMM_618)
    _put(ns_dir, r1, GEMM_617)
    targets = [ns_dir / "vllm" / HASH_B / RANK0, ns_dir / "vllm" / HASH_B / Path(r1).name]
    seeds, _ = seed.plan(ns_dir, m, _model("m"), targets)
    by_name = {s.target.name: s.sources for s in seeds}
    assert by_name == {RANK0: (ns_dir / r0,), Path(r1).name: (ns_dir / r1,)}


def test_two_environments_in_one_namespace_are_not_mixed(tmp_path: Path) -> None:
    a, b = f"vllm/{HASH_A}/{RANK0}", f"vllm/{'c' * 64}/{RANK0}"
    ns_dir, m = _ns(tmp_path, _warm(["m"], a, started=1), _warm(["m"], b, started=2))
    _put(ns_dir, a, GEMM_618)
    _put(ns_dir, b, GEMM_617)  # another FlashInfer's _metadata
    seeds, notes = seed.plan(ns_dir, m, _model("m"), [ns_dir / "vllm" / HASH_B / RANK0])
    assert seeds == [] and "not seeding" in notes[0]


@pytest.mark.parametrize("version, source", [("0.6.18", GEMM_618), ("0.6.17", GEMM_617)])
def test_real_flashinfer_loads_every_seeded_entry(
    tmp_path: Path, version: str, source: Path
) -> None:
    ns_dir, m = _ns(tmp_path, _warm(["m"], f"vllm/{HASH_A}/{RANK0}"))
    _put(ns_dir, f"vllm/{HASH_A}/{RANK0}", source)
    target = ns_dir / "vllm" / HASH_B / RANK0
    [s] = seed.plan(ns_dir, m, _model("m"), [target])[0]
    seed.write(s)
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir(version))}
    p = subprocess.run(
        [sys.executable, str(FIXTURES / "fi_load.py"), str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert "error" not in result and result["loaded"] == s.entries == len(
        v1.loads(source.read_bytes()).entries
    )
