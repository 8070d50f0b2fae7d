"""align never races a running `vllm preload` daemon on its dir: refused in one line (exit 2),
every file left as it was; the same dir aligns once the daemon has exited. The daemon is a
stand-in process that /proc shows as `vllm preload` (tests/tier/standin_daemon.py)."""

from __future__ import annotations

from pathlib import Path

from fi_cache.model import v1
from tests.conftest import GEMM_618
from tests.tier.standin_daemon import preload_daemon

HASH = "d" * 64


def _unaligned(root: Path) -> Path:
    hdir = root / HASH
    hdir.mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    keys = list(cf.entries)
    for i in range(2):
        part = v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys[i::2]}, None, "x")
        (hdir / f"autotune_configs_dp0_rank{i}.json").write_text(v1.dumps(part))
    return hdir


def test_align_leaves_a_running_daemons_dir_alone(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "cache"
    hdir = _unaligned(root)
    before = {p.name: p.read_bytes() for p in hdir.iterdir()}
    with preload_daemon(tmp_path, {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(root)}) as proc:
        r = run("align", hdir)
        dry = run("align", hdir, "--dry-run")
    assert r.code == 2, r.err
    [line] = r.err.splitlines()
    assert f"vLLM's preload daemon (pid {proc.pid}) writes {root.resolve()}" in line
    assert "align once the daemon has exited" in line
    assert dry.code == 2
    assert {p.name: p.read_bytes() for p in hdir.iterdir()} == before
    after = run("align", hdir)  # the daemon is gone: the same dir aligns
    assert after.code == 0, after.err
    assert {p.name: p.read_bytes() for p in hdir.iterdir()} != before
