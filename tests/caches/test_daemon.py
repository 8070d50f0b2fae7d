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


def test_the_cited_wheel_lines_name_the_daemons_command_and_root() -> None:
    """versions/tier.py's PRELOAD_SUBCOMMAND and VLLM_CLI_MODULE, and the root rule, as the 0.34
    wheel has them."""
    import zipfile

    from fi_cache.versions import PRELOAD_SUBCOMMAND, VLLM_CLI_MODULE
    from tests.vllm_wheels import module_text, need, vllm_wheel

    need("0.34.0")
    preload = module_text("0.34.0", "vllm/entrypoints/cli/preload.py").splitlines()
    assert preload[138].strip() == f'name = "{PRELOAD_SUBCOMMAND}"'  # :139
    assert 'ctx = multiprocessing.get_context("spawn")' in preload[316]  # :317, its ranks
    with zipfile.ZipFile(vllm_wheel("0.34.0")) as z:
        entry = z.read("vllm-0.34.0.dist-info/entry_points.txt").decode()
    assert f"vllm = {VLLM_CLI_MODULE}:main" in entry
    root = module_text("0.34.0", "vllm/model_executor/warmup/flashinfer_autotune_cache.py")
    lines = "\n".join(root.splitlines()[39:53])  # :40-53
    assert "override_dir = envs.VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" in lines
    assert 'Path(envs.VLLM_CACHE_ROOT)\n        / "flashinfer_autotune_cache"' in lines
