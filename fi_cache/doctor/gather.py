"""Gather doctor's inputs from disk and the environment (the I/O half; checks stay pure): each
source in its own module of doctor/sources/, put together here."""

from __future__ import annotations

import os
from collections.abc import Sequence
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

__all__ = ["Overrides", "gather", "make_target", "predicted_vllm_dir", "scan", "settle"]


def scan(
    store: Path,
    paths: Sequence[Path],
    logs: Sequence[Path],
    serve_argv: Sequence[str] | None,
    target: Target,
    environ: dict[str, str],
    location: CacheLocation | None = None,
) -> tuple[Inputs, files.Scanned]:
    """Everything read, before the caches are judged against the target (gpu names known)."""
    sglang = None
    if target.sglang_version is not None:
        sglang, serve_argv = sglang_source.read(serve_argv, environ), None
    serve = vllm_source.serve_args(serve_argv, target)
    log_facts = tuple(read_log(p) for p in logs)
    if location is not None and location.dir:
        predicted = Path(location.dir)  # vLLM's own answer, hash dir included
    elif sglang is not None:
        predicted = sglang.predicted
    else:
        predicted = predicted_vllm_dir(target, environ, serve)
    scanned = files.read(store, paths, predicted)
    inputs = Inputs(
        target=target,
        logs=log_facts,
        serve=serve,
        serve_moe=vllm_source.has_experts(serve, environ),
        environ={
            k: v
            for k, v in environ.items()
            if k.startswith(("VLLM_", "FLASHINFER_", "SGLANG_", "SGL_"))
        },
        store=store,
        predicted_dir=predicted if os.path.isdir(predicted) or serve is not None else None,
        location=location,
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


def gather(
    store: Path,
    paths: Sequence[Path],
    logs: Sequence[Path],
    serve_argv: Sequence[str] | None,
    target: Target,
    environ: dict[str, str],
    location: CacheLocation | None = None,
    location_from: str = "",
) -> Inputs:
    """Everything the checks look at. Raises Refused for bad paths, logs and argv."""
    inputs, scanned = scan(store, paths, logs, serve_argv, target, environ, location)
    inputs = dataclass_replace(inputs, location_from=location_from)
    return settle(inputs, scanned, store, paths, target)
