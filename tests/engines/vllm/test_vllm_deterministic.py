"""Unfused MoE finalize on vLLM releases through fi-cache's vLLM plugin (engines/vllm/plugin/):
FlashInfer 0.7.4's own default and vLLM 0.33/0.34's own call read from their wheels, the plugin
loaded by real vLLM 0.32's `load_general_plugins`, and serve/warm on the stand-in vLLM."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fi_cache.engines.vllm import deterministic, launch
from fi_cache.engines.vllm.plugin import fi_cache_vllm_plugin
from fi_cache.versions import (
    CUBLAS_WORKSPACE_DEFAULT,
    PLUGIN_ENV,
    PLUGIN_NAME,
    unfused_route,
)
from tests.conftest import ROOT, VLLM_PYTHON, needs_vllm
from tests.vllm_rig import MODEL, Rig, make_rig
from tests.vllm_wheels import flashinfer_text, module_text, need, unpacked

CUTLASS_MOE = "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"
CORE = "flashinfer/fused_moe/core.py"
FI_0_7_2 = ROOT / ".cache" / "flashinfer-0.7.2.post1" / CORE


def _function(source: str, name: str) -> ast.FunctionDef:
    return next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name
    )


def _default(fn: ast.FunctionDef, arg: str) -> object:
    """The default of `fn`'s parameter `arg` as a Python value."""
    args = fn.args
    positional = args.posonlyargs + args.args
    pairs = list(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    return next(ast.literal_eval(d) for a, d in pairs if a.arg == arg)


def _none_rule(fn: ast.FunctionDef) -> ast.If:
    """FlashInfer's `if use_fused_finalize is None: ...` at the top of `fn`."""
    return next(
        n
        for n in fn.body
        if isinstance(n, ast.If) and ast.unparse(n.test) == "use_fused_finalize is None"
    )


# --- (2) FlashInfer 0.7.4's own default, read from its wheel and run with torch on CPU ----------

_RUN_RULES = """
import json, sys, torch
out = []
for rule in json.load(sys.stdin):
    for on in (True, False):
        torch.use_deterministic_algorithms(on)
        scope = {"torch": torch, "use_fused_finalize": None}
        exec(rule, scope)
        out.append(scope["use_fused_finalize"])
print(json.dumps(out))
"""


def test_flashinfer_074_runs_unfused_finalize_when_torch_is_deterministic() -> None:
    """cutlass_fused_moe's own None rule (and its workspace-size helper's), cut out of the 0.7.4
    wheel and run: unfused (False) under torch's deterministic algorithms, fused otherwise; at
    the lines fi_cache/versions cites."""
    core = flashinfer_text(CORE)
    rules = []
    for name, line in (("cutlass_fused_moe", 1811), ("cutlass_fused_moe_workspace_size", 2037)):
        fn = _function(core, name)
        assert _default(fn, "use_fused_finalize") is None
        rule = _none_rule(fn)
        assert rule.lineno == line
        rules.append(ast.unparse(rule))
    p = subprocess.run(
        [sys.executable, "-c", _RUN_RULES],
        input=json.dumps(rules),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(p.stdout) == [False, True, False, True]


def test_flashinfer_072_post1_always_fuses() -> None:
    if not FI_0_7_2.exists():
        pytest.skip(f"no {FI_0_7_2} (scripts/test.sh unpacks it)")
    fn = _function(FI_0_7_2.read_text(), "cutlass_fused_moe")
    assert _default(fn, "use_fused_finalize") is True
    [arg] = [a for a in fn.args.args if a.arg == "use_fused_finalize"]
    assert arg.lineno == 1309  # the line fi_cache/versions cites
    assert not [n for n in fn.body if "use_fused_finalize is None" in ast.unparse(n)]


# --- (3) vLLM 0.33/0.34 pass no use_fused_finalize (their wheels) ------------------------------


@pytest.mark.parametrize("version, lines", [("0.33.0", (365, 389)), ("0.34.0", (372, 396))])
def test_vllm_releases_pass_no_use_fused_finalize(version: str, lines: tuple[int, int]) -> None:
    need(version)
    [call] = [
        n
        for n in ast.walk(ast.parse(module_text(version, CUTLASS_MOE)))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "flashinfer_cutlass_fused_moe"
    ]
    assert (call.lineno, call.end_lineno) == lines
    assert "use_fused_finalize" not in {k.arg for k in call.keywords}
    assert deterministic.passes_finalize_arg(str(unpacked(version))) is False  # launch's reading


def test_a_vllm_whose_moe_call_passes_the_flag_is_read_as_passing_it(tmp_path: Path) -> None:
    moe = tmp_path / "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"
    moe.parent.mkdir(parents=True)
    moe.write_text("# FlashInfer's use_fused_finalize defaults to None\nf(x=1)\n")
    assert deterministic.passes_finalize_arg(str(tmp_path)) is False  # a comment is no call
    moe.write_text("f(x=1, use_fused_finalize=envs.X)\n")
    deterministic.passes_finalize_arg.cache_clear()
    assert deterministic.passes_finalize_arg(str(tmp_path)) is True
    assert deterministic.passes_finalize_arg(str(tmp_path / "none")) is None


def test_the_route_table() -> None:
    assert unfused_route(True, "0.7.2.post1", True)[0] == "env"  # a PR #54948 build
    assert unfused_route(False, "0.7.4", False)[0] == "plugin"
    assert unfused_route(False, "0.7.2.post1", False)[0] == "impossible"
    assert unfused_route(False, "0.7.4", True)[0] == "impossible"  # passes the flag itself
    assert unfused_route(None, "0.7.2.post1", False)[0] is None  # a build that may read it
    assert unfused_route(False, "0.7.4", None)[0] is None  # its MoE call not read


# --- (1) real vLLM 0.32 loads the plugin, as every worker does ----------------------------------

_LOAD = """
import json, os, sys
import torch
import vllm.plugins
out = []
for case in json.loads(sys.argv[1]):
    for k in ("FI_CACHE_DETERMINISTIC", "VLLM_PLUGINS"):
        os.environ.pop(k, None)
    os.environ.update(case)
    torch.use_deterministic_algorithms(False)
    vllm.plugins.plugins_loaded = False  # one child, one vLLM import, four processes' worth
    vllm.plugins.load_general_plugins()  # what v1/worker/worker_base.py calls in each worker
    out.append(torch.are_deterministic_algorithms_enabled())
print(json.dumps(out))
"""


@needs_vllm
def test_real_vllm_loads_the_carried_plugin_only_when_asked() -> None:
    """vLLM 0.32's own load_general_plugins, in a child of its interpreter with the environment
    fi-cache's launch gives it (fi-cache not installed there: the plugin dir on PYTHONPATH)."""
    asked = launch.plugin_env({}, uses_ray=False)
    keep = ("FI_CACHE_DETERMINISTIC", "VLLM_PLUGINS")
    filtered = launch.plugin_env({"VLLM_PLUGINS": "fi_cache_test"}, uses_ray=False)
    cases = [
        {k: v for k, v in asked.items() if k in keep},  # serve --deterministic
        {},  # serve: the plugin is found, and does nothing
        {k: v for k, v in filtered.items() if k in keep},  # the user's filter, ours added
        {"FI_CACHE_DETERMINISTIC": "1", "VLLM_PLUGINS": "fi_cache_test"},  # a filter without it
    ]
    env = {**os.environ, "PYTHONPATH": asked["PYTHONPATH"]}
    env.pop("FI_CACHE_DETERMINISTIC", None)
    p = subprocess.run(
        [VLLM_PYTHON, "-c", _LOAD, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == [True, False, True, False]


def test_the_carried_dist_info_names_the_plugin_and_its_switch() -> None:
    [ep] = (launch.PLUGIN_DIR).glob("*.dist-info/entry_points.txt")
    assert ep.read_text().split() == [
        "[vllm.general_plugins]",
        PLUGIN_NAME,
        "=",
        "fi_cache_vllm_plugin:register",
    ]
    assert fi_cache_vllm_plugin.ENV == PLUGIN_ENV
    shipped = (ROOT / "pyproject.toml").read_text()
    module = "fi_cache.engines.vllm.plugin.fi_cache_vllm_plugin"
    assert f'{PLUGIN_NAME} = "{module}:register"' in shipped


def test_plugin_env_keeps_what_the_user_chose() -> None:
    env = launch.plugin_env(
        {
            "VLLM_PLUGINS": "a,b",
            "CUBLAS_WORKSPACE_CONFIG": ":16:8",
            "PYTHONPATH": "/x",
            PLUGIN_ENV: "strict",
        },
        uses_ray=True,
    )
    assert env["VLLM_PLUGINS"] == f"a,b,{PLUGIN_NAME}"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and env[PLUGIN_ENV] == "strict"
    assert env["PYTHONPATH"] == f"{launch.PLUGIN_DIR}{os.pathsep}/x"
    assert env[launch.RAY_PREFIXES_ENV] == "FI_CACHE_,CUBLAS_"
    assert launch.plugin_env({}, False)["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_DEFAULT


# --- (4) serve --deterministic / warm --finalize unfused on the stand-in vLLM -------------------


def _site(rig: Rig, vllm: str, flashinfer: str, passes: bool = False) -> dict[str, str]:
    """vLLM `vllm` (its real envs.py and CUTLASS MoE call, from its wheel; `passes`: that call
    given use_fused_finalize=True) and FlashInfer `flashinfer` as fi-cache sees them installed:
    files to read, nothing to import."""
    need(vllm)
    site = rig.record / f"site-{vllm}-{flashinfer}-{passes}"
    for dist, version in (("vllm", vllm), ("flashinfer_python", flashinfer)):
        meta = site / f"{dist}-{version}.dist-info"
        meta.mkdir(parents=True)
        name = dist.replace("_", "-")
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel in ("vllm/envs.py", CUTLASS_MOE):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        text = module_text(vllm, rel)
        if passes and rel == CUTLASS_MOE:
            call = "_ = flashinfer_cutlass_fused_moe("
            text = text.replace(call, f"{call}use_fused_finalize=True, ")
        (site / rel).write_text(text)
    return {"PYTHONPATH": f"{rig.env['PYTHONPATH']}{os.pathsep}{site}"}


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


def test_serve_deterministic_on_vllm_034_and_flashinfer_074_carries_the_plugin(rig: Rig) -> None:
    site = _site(rig, "0.34.0", "0.7.4")
    p = rig.run(
        "serve",
        "--deterministic",
        "--no-warm",
        "--",
        MODEL,
        FAKE_VLLM_MODE="exit-now",
        VLLM_PLUGINS="other",
        **site,
    )
    assert p.returncode == 0, p.stderr
    assert "vLLM 0.34.0 with FlashInfer 0.7.4: unfused finalize through fi-cache's vLLM plugin" in (
        p.stderr
    )
    assert "fi-cache adds fi_cache_deterministic" in p.stderr
    env = rig.starts()[0]["env"]
    assert "/unfused-" in env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]
    assert env[PLUGIN_ENV] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["VLLM_PLUGINS"] == f"other,{PLUGIN_NAME}"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(launch.PLUGIN_DIR)
    assert "VLLM_FLASHINFER_MOE_FUSED_FINALIZE" not in env  # 0.34 would call it unknown


def test_plain_serve_on_the_same_pair_sets_nothing_of_the_plugin(rig: Rig) -> None:
    p = rig.run(
        "serve",
        "--no-warm",
        "--",
        MODEL,
        FAKE_VLLM_MODE="exit-now",
        **_site(rig, "0.34.0", "0.7.4"),
    )
    assert p.returncode == 0, p.stderr
    env = rig.starts()[0]["env"]
    assert "/fused-" in env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] and PLUGIN_ENV not in env
    assert str(launch.PLUGIN_DIR) not in env["PYTHONPATH"]


@pytest.mark.parametrize(
    "command", [["serve", "--deterministic"], ["warm", "--finalize", "unfused"]]
)
def test_unfused_on_flashinfer_072_post1_is_refused_with_the_reason(
    rig: Rig, command: list[str]
) -> None:
    p = rig.run(*command, "--", MODEL, **_site(rig, "0.34.0", "0.7.2.post1"))
    assert p.returncode == 2 and rig.starts() == []
    assert "vLLM 0.34.0 does not read VLLM_FLASHINFER_MOE_FUSED_FINALIZE" in p.stderr
    assert "FlashInfer 0.7.2.post1 runs fused finalize whatever torch's deterministic mode" in (
        p.stderr
    )
    assert "FlashInfer >= 0.7.4 (fi-cache's vLLM plugin)" in p.stderr


def test_warm_unfused_records_a_warm_that_passed_the_mode_on(rig: Rig) -> None:
    """The warm record says the mode reached FlashInfer, so doctor's pre-flight does not take
    the unfused namespace for one a plain vLLM filled with fused tactics."""
    site = _site(rig, "0.34.0", "0.7.4")
    p = rig.run("--format", "json", "warm", "--finalize", "unfused", "--", MODEL, **site)
    assert p.returncode == 0, p.stderr
    ns = Path(json.loads(p.stdout)["namespace"])
    [warm] = json.loads((ns / "manifest.json").read_text())["warms"]
    assert warm["supports_finalize_env"] is True
    assert rig.starts()[0]["env"][PLUGIN_ENV] == "1"


def test_unfused_on_a_vllm_that_passes_the_flag_itself_is_refused(rig: Rig) -> None:
    p = rig.run("serve", "--deterministic", "--", MODEL, **_site(rig, "0.34.0", "0.7.4", True))
    assert p.returncode == 2 and rig.starts() == []
    assert "this vLLM passes use_fused_finalize to FlashInfer itself" in p.stderr
