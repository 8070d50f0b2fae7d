"""Gather doctor's inputs from disk and the environment (the I/O half; checks stay pure): each
source in its own module of doctor/sources/, put together here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from pathlib import Path

from fi_cache.doctor.inputs import Inputs, Target
from fi_cache.doctor.logs import read_log
from fi_cache.doctor.sources import files
from fi_cache.doctor.sources import sglang as sglang_source
from fi_cache.doctor.sources import vllm as vllm_source
from fi_cache.doctor.sources.vllm import predicted_dir as predicted_vllm_dir
from fi_cache.doctor.target import Overrides, make_target
from fi_cache.engines.vllm.predict import CacheLocation

__all__ = [
    "GatherRequest",
    "Overrides",
    "gather",
    "make_target",
    "predicted_vllm_dir",
    "scan",
    "settle",
]


@dataclass(frozen=True, kw_only=True)
class GatherRequest:
    """What doctor reads (the store, PATHs, logs, the engine's arguments, its environment, vLLM's
    own answer for its cache dir) and the target the caches are first judged against."""

    store: Path
    target: Target
    environ: dict[str, str]
    paths: Sequence[Path] = ()
    logs: Sequence[Path] = ()
    serve_argv: Sequence[str] | None = None
    location: CacheLocation | None = None
    location_from: str = ""  # which answer cache-location gives, and why


def scan(request: GatherRequest) -> tuple[Inputs, files.Scanned]:
    """Everything read, before the caches are judged against the target (gpu names known)."""
    r = request
    sglang, serve_argv = None, r.serve_argv
    if r.target.sglang_version is not None:
        sglang, serve_argv = sglang_source.read(serve_argv, r.environ), None
    serve = vllm_source.serve_args(serve_argv, r.target)
    log_facts = tuple(read_log(p) for p in r.logs)
    if r.location is not None and r.location.dir:
        predicted = Path(r.location.dir)  # vLLM's own answer, hash dir included
    elif sglang is not None:
        predicted = sglang.predicted
    else:
        predicted = predicted_vllm_dir(r.target, r.environ, serve)
    scanned = files.read(r.store, r.paths, predicted)
    inputs = Inputs(
        target=r.target,
        logs=log_facts,
        serve=serve,
        serve_moe=vllm_source.has_experts(serve, r.environ),
        environ={
            k: v
            for k, v in r.environ.items()
            if k.startswith(("VLLM_", "FLASHINFER_", "SGLANG_", "SGL_"))
        },
        store=r.store,
        predicted_dir=predicted if os.path.isdir(predicted) or serve is not None else None,
        location=r.location,
        location_from=r.location_from,
        sglang=sglang.args if sglang else None,
        sglang_live=sglang.live if sglang else (),
        sglang_here=sglang.here if sglang else None,
    )
    return inputs, scanned


def settle(
    inputs: Inputs, scanned: files.Scanned, store: Path, paths: Sequence[Path], target: Target
) -> Inputs:
    """The inputs with the caches judged against `target`."""
    found = files.judged(scanned, store, paths, target)
    return dataclass_replace(
        inputs,
        target=target,
        caches=found.caches,
        problems=found.problems,
        tmp_files=found.tmp_files,
        modes=found.modes,
        empty=found.empty,
        logs_as_paths=found.logs_as_paths,
    )


def gather(request: GatherRequest) -> Inputs:
    """Everything the checks look at. Raises Refused for bad paths, logs and argv."""
    inputs, scanned = scan(request)
    return settle(inputs, scanned, request.store, request.paths, request.target)
