"""vLLM's side of a diagnosis: its `serve` arguments, where it will keep its cache (its own
answer when it can be asked, else fi-cache's layout model), and whether the model has experts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fi_cache.doctor.inputs import Target
from fi_cache.engines import hf
from fi_cache.engines.vllm import layout
from fi_cache.engines.vllm.args import ServeArgs, parse_serve_args
from fi_cache.engines.vllm.predict import CacheLocation
from fi_cache.environment import Environment
from fi_cache.errors import FiCacheError, Refused
from fi_cache.model import v2
from fi_cache.versions import VLLM_CACHE_DIR_ENV, VLLM_CACHE_SUBDIR


def serve_args(argv: Sequence[str] | None, target: Target) -> ServeArgs | None:
    """`-- ARGS` read as vLLM reads them; raises Refused for what vLLM would reject."""
    if argv is None:
        return None
    serve = parse_serve_args(argv)
    if why := layout.argv_refusal(target.vllm_version, serve):
        raise Refused(why)  # as warm and serve refuse it
    return serve


def has_experts(serve: ServeArgs | None, environ: dict[str, str]) -> bool | None:
    """Whether the served model has experts, from its config.json here (None: not readable)."""
    if serve is None or not serve.model:
        return None
    return layout.is_moe(hf.read_config(serve.model, environ))


def predicted_dir(target: Target, environ: dict[str, str], serve: ServeArgs | None = None) -> Path:
    """Where vLLM keeps its cache when nothing else is in charge (domain.md §5): its v1 dir, or
    on vLLM 0.33 with one rank FlashInfer's v2 store (engines/vllm/layout.py)."""
    if serve is not None:
        fi = target.fingerprint.flashinfer_version
        if layout.store_kind(target.vllm_version, fi, serve) == "v2":
            return layout.v2_root(environ) / v2.SCHEMA_DIR
    override = environ.get(VLLM_CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = Path(layout.vllm_cache_root(environ)) / VLLM_CACHE_SUBDIR
    fp = target.fingerprint
    if fp.flashinfer_version and fp.arch:
        return base / fp.flashinfer_version / fp.arch
    return base


def location(
    env: Environment,
    target: Target,
    argv: Sequence[str] | None,
    environ: dict[str, str],
    state: Path,
) -> tuple[CacheLocation | None, str]:
    """(vLLM's own answer for `-- ARGS` or None, which of the two answers doctor gives and why).
    A vLLM that rejects the arguments is refused here (exit 2), in vLLM's words."""
    from fi_cache.engines.vllm.predict import predict

    if argv is None:
        return None, ""
    if env.vllm.version is None:
        return None, "fi-cache's layout model (no vLLM found to ask)"
    if target.vllm_version != env.vllm.version:
        return None, f"fi-cache's layout model (the target is vLLM {target.vllm_version})"
    try:
        where = predict(
            env.python, env.vllm.version, list(argv), environ, state, site=env.vllm.site
        )
        return where, "vLLM's own code"
    except Refused:
        raise
    except FiCacheError as exc:
        return None, f"fi-cache's layout model (asking vLLM failed: {exc})"
