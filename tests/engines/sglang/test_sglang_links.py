"""What stays with the user when SGLANG_CACHE_DIR is a namespace's, checked by SGLang's own code
from its wheels: the custom all-reduce P2P probe (custom_all_reduce_utils.py), kernels.lock
(flash_attention_v3.py) and a diffusion worker's torch.compile dirs (gpu_worker.py); and the MoE
runner an a2a backend picks (moe_hook.py)."""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from fi_cache.engines.sglang import launch, links
from fi_cache.engines.sglang.args import parse_sglang_args
from tests.sglang_layout import WHEELS, NoWheel, sglang_module

_P2P = "sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py"
_FA3 = "sglang/kernels/ops/attention/flash_attention_v3.py"
_WORKER = "sglang/multimodal_gen/runtime/managers/gpu_worker.py"
_MOE_HOOK = "sglang/srt/arg_groups/moe_hook.py"


def _text(version: str, module: str) -> str:
    try:
        return sglang_module(version, module)
    except NoWheel as e:
        if os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
            pytest.fail(str(e))
        pytest.skip(str(e))


def _function(text: str, name: str, glb: dict[str, Any]) -> Any:
    """SGLang's top-level function `name` (decorators dropped), compiled into `glb`."""
    [fn] = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name]
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), name, "exec"), glb)
    return glb[name]


def _sglang_p2p_check(
    version: str,
    cache_dir: Path,
    gpus: int,
    can: bool,
    cvd: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> bool:
    """SGLang's `gpu_p2p_access_check(0, 1)` on a host of `gpus` GPUs whose probe answers `can`,
    single process (no torch.distributed); the probe child is stood in for."""
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    state = types.ModuleType("sglang.srt.distributed.parallel_state")
    state.get_world_group = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, state.__name__, state)

    def probe(argv: list[str], input: bytes, capture_output: bool) -> Any:
        src, _, out = pickle.loads(input)
        Path(out).write_bytes(pickle.dumps([can] * len(src)))
        return types.SimpleNamespace(check_returncode=lambda: None, stderr=b"")

    import itertools
    import logging
    import tempfile

    glb: dict[str, Any] = {
        "os": os,
        "json": json,
        "pickle": pickle,
        "sys": sys,
        "tempfile": tempfile,
        "product": itertools.product,
        "logger": logging.getLogger("sglang-p2p"),
        "_gpu_p2p_access_cache": None,
        "__file__": _P2P,
        "subprocess": types.SimpleNamespace(run=probe),
        "dist": types.SimpleNamespace(is_initialized=lambda: False),
        "torch": types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: gpus)),
        "sglang_envs": types.SimpleNamespace(
            SGLANG_CACHE_DIR=types.SimpleNamespace(get=lambda: str(cache_dir))
        ),
    }
    return bool(_function(_text(version, _P2P), "gpu_p2p_access_check", glb)(0, 1))


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
def test_the_p2p_probe_is_the_users_so_a_shared_store_gives_no_host_anothers(
    tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host A (no P2P) and host B (P2P) on one store: each reads its own probe, in its user's
    dir, as without fi-cache; before, B read A's `false` from the namespace and ran without
    custom all-reduce."""
    ns = tmp_path / "store" / "ns" / "sglang"
    a = {"HOME": str(tmp_path / "a"), "CUDA_VISIBLE_DEVICES": "0,1"}
    launch.namespace_env(ns, a, "unfused", version, gpus=8)
    assert _sglang_p2p_check(version, ns, 2, False, "0,1", monkeypatch) is False
    probe = "gpu_p2p_access_cache_for_0,1.json"
    assert (tmp_path / "a" / ".cache" / "sglang" / probe).is_file()  # written through the link
    assert (ns / probe).is_symlink()
    b = {"HOME": str(tmp_path / "b"), "CUDA_VISIBLE_DEVICES": "0,1"}
    launch.namespace_env(ns, b, "unfused", version, gpus=8)
    assert _sglang_p2p_check(version, ns, 2, True, "0,1", monkeypatch) is True
    # CUDA_VISIBLE_DEVICES unset: SGLang names it after every GPU torch sees.
    launch.namespace_env(ns, {"HOME": str(tmp_path / "b")}, "unfused", version, gpus=2)
    assert _sglang_p2p_check(version, ns, 2, True, None, monkeypatch) is True
    assert (tmp_path / "b" / ".cache" / "sglang" / probe).is_file()


def test_a_p2p_probe_in_the_namespace_is_replaced_and_an_unwritable_users_dir_is_not_linked(
    tmp_path: Path,
) -> None:
    ns = tmp_path / "ns" / "sglang"
    ns.mkdir(parents=True)
    name = "gpu_p2p_access_cache_for_0,1,2,3.json"
    (ns / name).write_text('{"0->1": false}')  # another host's, or an older fi-cache's
    env = {"SGLANG_CACHE_DIR": str(tmp_path / "mine")}
    assert links.link_user_files(ns, env, 4) == []
    assert (ns / name).resolve() == tmp_path / "mine" / name
    assert links.p2p_file_name({}, None) is None  # no GPU count: nothing to name
    blocked = tmp_path / "file"
    blocked.write_text("")
    # A user's dir that cannot be made: a dangling link there would fail SGLang's write.
    assert name in links.link_user_files(ns, {"SGLANG_CACHE_DIR": str(blocked / "x")}, 4)
    assert not os.path.lexists(ns / name)


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
def test_the_users_kernels_lock_pins_the_fa3_kernels_under_fi_cache_too(
    tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang loads the Hub FA3 kernels at the version kernels.lock in SGLANG_CACHE_DIR pins, and
    unpinned without one: a user's lock must be seen from the namespace."""
    calls: list[tuple[str, str]] = []
    hub = types.ModuleType("kernels")
    ops = types.SimpleNamespace(flash_attn_with_kvcache=1, flash_attn_varlen_func=2)
    hub.load_kernel = lambda repo, lock: calls.append(("pinned", lock)) or ops  # type: ignore[attr-defined]
    hub.get_kernel = lambda repo, revision: calls.append(("hub", revision)) or ops  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kernels", hub)
    text = _text(version, _FA3)
    ns = tmp_path / "ns" / "sglang"
    mine = tmp_path / "mine"
    env = launch.namespace_env(ns, {"SGLANG_CACHE_DIR": str(mine)}, "unfused", version, gpus=1)
    envs = types.SimpleNamespace(
        SGLANG_USE_SGL_FA3_KERNEL=types.SimpleNamespace(get=lambda: False),
        SGLANG_CACHE_DIR=types.SimpleNamespace(get=lambda: env["SGLANG_CACHE_DIR"]),
    )
    glb: dict[str, Any] = {
        "os": os,
        "envs": envs,
        "DEFAULT_FA3_KERNEL_LOCKFILE": "kernels.lock",
        "SGL_FA3_KERNEL_REPO": "r",
        "SGL_FA3_KERNEL_REVISION": "v1",
    }
    load = _function(text, "_load_fa3_kernels", glb)
    load()
    assert calls[-1] == ("hub", "v1")  # no lock anywhere: as without fi-cache
    (mine / "kernels.lock").write_text("{}")
    load()
    assert calls[-1] == ("pinned", str(ns / "kernels.lock"))  # the user's, through the link


_WORKER_RUN = """
import json, os, sys, tempfile, types, zipfile, ast, logging
wheel, diffusion_root = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
for n in ("sglang", "sglang.srt"):
    sys.modules[n] = types.ModuleType(n)
m = types.ModuleType("sglang.srt.environ"); sys.modules[m.__name__] = m
exec(compile(z.read("sglang/srt/environ.py").decode(), "environ.py", "exec"), m.__dict__)
m.redirect_third_party_caches()  # `import sglang` (sglang/__init__.py 0.5.18+:11-14)
srt = {k: os.path.realpath(os.environ[k]) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
tree = ast.parse(z.read(sys.argv[3]).decode())
[cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUWorker"]
name = "_configure_persistent_torch_compile_cache"
[fn] = [n for n in cls.body if getattr(n, "name", "") == name]
glb = {"os": os, "tempfile": tempfile, "logger": logging.getLogger("w"),
       "third_party_cache_defaults": m.third_party_cache_defaults,
       "envs": types.SimpleNamespace(SGLANG_DIFFUSION_CACHE_ROOT=diffusion_root)}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "gpu_worker.py", "exec"), glb)
glb[fn.name](None)
worker = {k: os.environ[k] for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
print(json.dumps({"srt": srt, "worker": worker}))
"""


def _sglang_worker_dirs(version: str, env: dict[str, str], root: Path) -> dict[str, Any]:
    wheel = next(iter(sorted(WHEELS.glob(f"sglang-{version}-*.whl"))), None)
    if wheel is None:
        _text(version, _WORKER)  # skips or fails as the wheel's absence asks
    assert wheel is not None and zipfile.is_zipfile(wheel)
    out = subprocess.run(
        [sys.executable, "-I", "-c", _WORKER_RUN, str(wheel), str(root), _WORKER],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("version", ["0.5.18", "0.5.21", "0.5.23"])
def test_a_diffusion_worker_keeps_its_own_compile_cache_under_fi_cache(
    tmp_path: Path, version: str
) -> None:
    """SGLang's diffusion worker moves inductor's and Triton's caches to its own root unless the
    value looks user-set; a value fi-cache pinned looked so (gpu_worker.py 0.5.23:366-374)."""
    tmp = tmp_path / "tmp"  # the worker leaves a value under the temp dir alone: not pytest's
    tmp.mkdir()
    home = tmp_path / "home"
    theirs = {"HOME": str(home), "PATH": os.environ["PATH"], "TMPDIR": str(tmp)}
    root = home / ".cache" / "sgl_diffusion"
    before = _sglang_worker_dirs(version, theirs, root)
    assert before["worker"]["TRITON_CACHE_DIR"] == str(root / "torch_compile_cache" / "triton")
    ns = tmp_path / "store" / "ns" / "sglang"
    after = _sglang_worker_dirs(version, launch.namespace_env(ns, theirs, "unfused", version), root)
    assert after == before  # the worker's dirs, and the LLM path's (through the links)
    # A variable the user set is still theirs, in both.
    mine = {**theirs, "TRITON_CACHE_DIR": str(tmp_path / "t")}
    seen = _sglang_worker_dirs(version, launch.namespace_env(ns, mine, "unfused", version), root)
    assert seen["worker"]["TRITON_CACHE_DIR"] == str(tmp_path / "t")


def test_a_link_that_cannot_be_made_pins_the_variable_as_before(tmp_path: Path) -> None:
    ns = tmp_path / "ns" / "sglang"
    ns.mkdir(parents=True)
    (ns / "inductor").write_text("")  # something real where the link goes: kept
    env = launch.namespace_env(ns, {"HOME": str(tmp_path)}, "unfused", "0.5.23")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / ".cache" / "sglang" / "inductor")
    assert "TRITON_CACHE_DIR" not in env and (ns / "triton").is_symlink()
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / ".cache" / "sglang" / "nv")  # still pinned


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
def test_deepep_v2_makes_an_auto_runner_deep_gemm_as_sglang_does(version: str) -> None:
    """The key dir hashes the resolved runner: deep_gemm, not auto (and no FlashInfer MoE)."""
    tree = ast.parse(_text(version, _MOE_HOOK))
    [branch] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "a2a_backend == 'deepep_v2'"
    ]
    said = {
        ast.literal_eval(k.value)
        for n in ast.walk(branch)
        if isinstance(n, ast.Call)
        for k in n.keywords
        if k.arg == "moe_runner_backend"
    }
    assert said == {"deep_gemm"}
    args = parse_sglang_args(
        ["--model-path", "M", "--moe-a2a-backend", "deepep_v2", "--tp-size", "4"]
    )
    assert args.moe_backend == "deep_gemm" and args.ep == 4
    given = parse_sglang_args(
        ["--model-path", "M", "--moe-a2a-backend", "deepep_v2", "--moe-runner-backend", "deep_gemm"]
    )
    assert given.moe_backend == "deep_gemm"
