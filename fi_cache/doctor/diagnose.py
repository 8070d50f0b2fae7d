"""The doctor as a library: `diagnose(request) -> Diagnosis`. Detect the environment, make the
target, ask vLLM where its cache goes, gather the inputs, run the checks, plan the fixes.
`fi-cache doctor` parses its options into a Request and renders the Diagnosis; serve's
pre-flight asks with a NamespaceRequest (one namespace, its own environment, a few checks).
Nothing here prints or writes: `--fix` applies the plan with doctor/fix.py's apply."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, Inputs, Target

if TYPE_CHECKING:  # types only: serve's pre-flight imports this, and pays for what it loads
    from fi_cache.doctor.fix import Action
    from fi_cache.environment import Environment
    from fi_cache.store.manifest import Manifest


@dataclass(frozen=True)
class Request:
    """What `fi-cache doctor` is asked: the store, PATHs, logs, the engine's command line, the
    target's fields that override the detected ones, the check ids wanted (all when empty)."""

    store: Path
    paths: tuple[Path, ...] = ()
    logs: tuple[Path, ...] = ()
    # `-- ARGS`: `vllm serve` arguments or a pasted vLLM line; `sglang serve`'s with sglang_version
    engine_argv: tuple[str, ...] | None = None
    flashinfer_version: str | None = None
    vllm_version: str | None = None
    sglang_version: str | None = None
    finalize: str | None = None
    gpu: str | None = None  # a full name, or the short one `ls` prints ("H200")
    only: tuple[str, ...] = ()
    fix: bool = False  # plan --fix's actions
    environ: Mapping[str, str] | None = None  # default: os.environ
    # Findings of what wraps the engine (`vllm preload`), given vLLM's config hash when known.
    wrapper: Callable[[str | None], Sequence[Finding]] | None = None


@dataclass(frozen=True)
class NamespaceRequest:
    """serve's pre-flight: the caches under one namespace's engine dir, judged against the
    environment and finalize mode the namespace is for, by the checks named."""

    target: Target
    namespace_dir: Path
    cache_dir: Path
    manifest: Manifest | None
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Diagnosis:
    target: Target
    findings: tuple[Finding, ...]
    inputs: Inputs
    actions: tuple[Action, ...] = ()  # --fix's plan, pinned namespaces' left out
    held: tuple[tuple[Action, Path], ...] = ()  # left as they are: their namespace is pinned

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def refused(self) -> bool:
        """PATHs that hold no cache, or are logs: doctor exits 2 after its findings."""
        return bool(self.inputs.empty or self.inputs.logs_as_paths)


# (the environment, the target, the engine's arguments with a pasted launcher taken out, environ)
_Resolved = tuple["Environment", Target, "tuple[str, ...] | None", dict[str, str]]


def target_of(request: Request) -> Target:
    """The environment the request is judged against (a GPU short name resolved against this
    machine's GPUs)."""
    return _resolve(request)[1]


def diagnose(request: Request | NamespaceRequest) -> Diagnosis:
    """Raises Refused (exit 2) for bad versions, check ids, argv, PATHs and logs."""
    from fi_cache import doctor

    if isinstance(request, NamespaceRequest):
        from fi_cache.doctor.sources.files import in_namespace

        r = request
        views, problems = in_namespace(r.cache_dir, r.namespace_dir, r.target.finalize, r.manifest)
        inputs = Inputs(r.target, views, problems)
        return Diagnosis(r.target, tuple(doctor.run_checks(inputs, r.checks)), inputs)
    return _diagnose(request)


def _diagnose(request: Request) -> Diagnosis:
    from fi_cache import doctor
    from fi_cache.doctor import fix as fixes
    from fi_cache.doctor import gather
    from fi_cache.doctor.sources import vllm as vllm_source
    from fi_cache.doctor.target import resolve_gpu
    from fi_cache.store.paths import state_dir

    env, target, argv, environ = _resolve(request)
    if request.sglang_version is not None:
        location, why = None, ""  # SGLang is never asked: no CPU build to ask
    else:
        state = state_dir(request.store)
        location, why = vllm_source.location(env, target, argv, environ, state)
    asked = gather.GatherRequest(
        store=request.store,
        paths=request.paths,
        logs=request.logs,
        serve_argv=argv,
        target=target,
        environ=environ,
        location=location,
        location_from=why,
    )
    inputs, scanned = gather.scan(asked)
    if request.gpu:  # the short name `ls` prints, resolved against the caches' names too
        known = {*scanned.gpu_names(), *(g.name for g in env.gpus)}
        if (gpu := resolve_gpu(request.gpu, known)) != target.fingerprint.gpu:
            target = Target(target.fingerprint.replace(gpu=gpu), *_rest(target))
    inputs = gather.settle(inputs, scanned, request.store, request.paths, target)
    findings = doctor.run(inputs, request.only)
    wanted = not request.only or "vllm-preload" in request.only
    if request.wrapper is not None and wanted:
        findings += request.wrapper(location.hash if location else None)
    actions = fixes.plan(findings, inputs) if request.fix else []
    kept, held = fixes.hold_pinned(actions, request.store)
    return Diagnosis(target, tuple(findings), inputs, tuple(kept), tuple(held))


def _resolve(request: Request) -> _Resolved:
    from fi_cache import doctor, environment
    from fi_cache.doctor import check_ids
    from fi_cache.doctor.target import Overrides, make_target, resolve_gpu
    from fi_cache.engines import serving
    from fi_cache.engines.vllm.launch import vllm_python
    from fi_cache.errors import Refused
    from fi_cache.store.paths import state_dir

    if unknown := check_ids.unknown(request.only, doctor.checks()):
        known = ", ".join(sorted(c.id for c in check_ids.declared(doctor.checks())))
        raise Refused(f"unknown check id {unknown[0]!r}; known: {known}")
    argv = request.engine_argv
    vllm_path = None
    if argv is not None and request.sglang_version is None:  # a pasted `vllm serve ...` line
        vllm_path, argv = serving("vllm").command_line(None, argv)
    env = environment.detect(state_dir(request.store), python=vllm_python(vllm_path))
    environ = dict(os.environ if request.environ is None else request.environ)
    gpu = request.gpu and resolve_gpu(request.gpu, [g.name for g in env.gpus])
    sglang_argv = tuple(argv or ()) if request.sglang_version is not None else None
    overrides = Overrides(
        request.flashinfer_version,
        request.vllm_version,
        request.finalize,
        gpu,
        request.sglang_version,
        sglang_argv,
    )
    target = make_target(env, overrides, environ)
    return env, target, tuple(argv) if argv is not None else None, environ


def _rest(t: Target) -> tuple[str | None, bool | None, str, str | None]:
    return t.vllm_version, t.vllm_supports_finalize, t.finalize, t.sglang_version
