"""Running `vllm preload` daemons found on the real /proc (fi_cache/caches/daemon.py), with the
cache root each writes: a stand-in process whose command line and environment are a daemon's."""

from __future__ import annotations

from pathlib import Path

from fi_cache.caches import daemon
from tests.tier.standin_daemon import preload_daemon


def test_a_running_daemon_is_found_with_the_dir_its_environment_names(tmp_path: Path) -> None:
    ns = tmp_path / "store" / "ns" / "vllm"
    ns.mkdir(parents=True)
    hash_dir = ns / ("a" * 64)
    with preload_daemon(tmp_path, {"VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": str(ns)}) as proc:
        [found] = [d for d in daemon.running() if d.pid == proc.pid]
        assert found.root == str(ns.resolve())
        assert daemon.writing(hash_dir) == found  # a hash dir under its root
        assert daemon.writing(tmp_path / "store") == found  # the store holding it
        assert daemon.writing(tmp_path / "elsewhere") is None
    assert daemon.writing(hash_dir) is None  # gone with the process


def test_without_the_override_the_daemon_writes_under_vllm_cache_root(tmp_path: Path) -> None:
    env = {"VLLM_CACHE_ROOT": "vroot", "HOME": str(tmp_path)}  # relative: the daemon's cwd's
    with preload_daemon(tmp_path, env, cwd=tmp_path) as proc:
        [found] = [d for d in daemon.running() if d.pid == proc.pid]
    assert found.root == str((tmp_path / "vroot" / "flashinfer_autotune_cache").resolve())


def test_only_a_preload_command_line_is_a_daemon() -> None:
    assert daemon.is_preload(["vllm", "preload", "--model", "m"])
    assert daemon.is_preload(["/usr/bin/python3", "/venv/bin/vllm", "preload"])
    assert daemon.is_preload(["python", "-m", "vllm.entrypoints.cli.main", "preload"])
    assert not daemon.is_preload(["vllm", "serve", "preload"])  # a model named preload
    assert not daemon.is_preload(["python", "-m", "vllm.entrypoints.cli.main", "serve"])
    assert not daemon.is_preload(["grep", "vllm", "preload"])
