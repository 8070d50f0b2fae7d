"""How a vLLM start reaches unfused (deterministic) MoE finalize: the variable a PR build reads,
fi-cache's plugin (FlashInfer >= 0.7.4 and a vLLM that passes no use_fused_finalize), or not at
all (the table: fi_cache.versions.unfused_route). Reads vLLM's files; imports nothing of it."""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines.api import ModeProblem, Target
from fi_cache.engines.vllm import launch
from fi_cache.environment import Environment
from fi_cache.versions import (
    FINALIZE_ARG,
    VLLM_CUTLASS_MOE_DIR,
    VLLM_CUTLASS_MOE_FILE,
    VLLM_FINALIZE_ENV,
    UnfusedRoute,
    unfused_route,
    vllm_passes_finalize_arg,
)

if TYPE_CHECKING:
    from fi_cache.engines.vllm.args import ServeArgs


@functools.cache
def passes_finalize_arg(site: str | None) -> bool | None:
    """Does the vLLM installed in `site` pass use_fused_finalize to FlashInfer's CUTLASS MoE (its
    flashinfer_cutlass_moe.py names it)? None: no such file to read."""
    root = Path(site or "") / VLLM_CUTLASS_MOE_DIR
    if site is None or not root.is_dir():
        return None
    found = sorted(root.rglob(VLLM_CUTLASS_MOE_FILE))
    try:
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in found]
    except OSError:
        return None
    return any(_passes(t) for t in texts) if texts else None


def _passes(source: str) -> bool:
    """A call in `source` with a use_fused_finalize= keyword (a comment naming it is no call);
    source that does not parse counts as passing it: refused rather than run fused."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return FINALIZE_ARG in source
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call))
    return any(k.arg == FINALIZE_ARG for c in calls for k in c.keywords)


def route(env: Environment) -> tuple[UnfusedRoute | None, str]:
    """The route of this environment's (vLLM, FlashInfer) pair, and why; None: cannot tell."""
    info = env.vllm
    passes = passes_finalize_arg(info.site)
    if passes is None:
        passes = vllm_passes_finalize_arg(info.version)
    return unfused_route(info.supports_finalize_env, env.fingerprint.flashinfer_version, passes)


def mode_problem(
    target: Target[ServeArgs, launch.Launcher], verb: str, uses_ray: bool = False
) -> ModeProblem | None:
    """The unfused namespace on a vLLM that would silently run fused; on the plugin route, what
    it turns on (once, before vLLM starts)."""
    if target.ns.finalize != "unfused":
        return None
    info, env = target.env.vllm, target.env
    way, why = route(env)
    if way == "env":
        return None
    pair = f"vLLM {info.version} with FlashInfer {env.fingerprint.flashinfer_version}"
    if way == "plugin":
        said = [
            f"{pair}: unfused finalize through fi-cache's vLLM plugin (torch's deterministic "
            "algorithms on in vLLM's processes; docs/serving.md)",
            *launch.plugin_notes(os.environ, uses_ray),
        ]
        return ModeProblem(warning="; ".join(said))
    if info.supports_finalize_env is False or way == "impossible":
        return ModeProblem(
            refusal=f"vLLM {info.version} does not read {VLLM_FINALIZE_ENV} "
            f"({info.envs_path}) and {why}: it would {verb} with fused (non-deterministic) "
            f"finalize; {launch.ALTERNATIVES}"
        )
    return ModeProblem(
        warning="cannot inspect the vLLM package from here; make sure it supports "
        f"{VLLM_FINALIZE_ENV}, or the unfused namespace gets fused tactics"
    )


def passes_mode_on(env: Environment, finalize: str) -> bool | None:
    """Does this start run the namespace's finalize mode (what a warm record and pre-flight
    keep as "supports the finalize variable")? True on the plugin route for unfused."""
    if finalize == "unfused" and route(env)[0] == "plugin":
        return True
    return env.vllm.supports_finalize_env
