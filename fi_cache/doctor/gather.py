"""Gather doctor's inputs from disk and the environment (the I/O half; checks stay pure)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.caches.discover import ScanProblem, leftover_mtime, tmp_leftovers
from fi_cache.caches.inventory import Cache, scan
from fi_cache.doctor.inputs import CacheView, Inputs, Target
from fi_cache.doctor.logs import looks_like_log, read_log
from fi_cache.engines import hf
from fi_cache.engines.sglang import layout as sglang_layout
from fi_cache.engines.sglang import live as sglang_live
from fi_cache.engines.sglang.args import env_bool, parse_sglang_args
from fi_cache.engines.sglang.live import Engine as LiveSglang
from fi_cache.engines.vllm import layout
from fi_cache.engines.vllm.args import ServeArgs, parse_serve_args
from fi_cache.engines.vllm.predict import CacheLocation
from fi_cache.environment import Environment
from fi_cache.errors import CorruptCache, Refused
from fi_cache.model import v2
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import manifest as manifests
from fi_cache.store.namespace import NAMESPACES_DIR, FinalizeMode, Namespace, namespace_parts
from fi_cache.versions import (
    SGLANG_FINALIZE_ENV,
    VLLM_CACHE_DIR_ENV,
    VLLM_CACHE_FILE_RE,
    VLLM_CACHE_SUBDIR,
    VLLM_FINALIZE_ENV,
    VLLM_NEWEST_CHECKED,
    parse_version,
    sglang_finalize_default,
)


@dataclass(frozen=True)
class Overrides:
    flashinfer_version: str | None = None
    vllm_version: str | None = None
    finalize: str | None = None
    gpu: str | None = None
    sglang_version: str | None = None
    sglang_argv: tuple[str, ...] | None = None


def _valid_version(flag: str, text: str | None) -> None:
    if text is not None and parse_version(text) is None:
        raise Refused(f"{flag} {text!r} is not a version (e.g. 0.6.17, 0.7.2.post1)")


def make_target(env: Environment, o: Overrides, environ: dict[str, str]) -> Target:
    """The detected environment, each given field overriding one detected value."""
    _valid_version("--flashinfer-version", o.flashinfer_version)
    _valid_version("--vllm-version", o.vllm_version)
    fp = env.fingerprint
    if o.flashinfer_version:
        fp = fp.replace(flashinfer_version=o.flashinfer_version)
    if o.gpu:
        fp = fp.replace(gpu=o.gpu)
    if o.vllm_version and parse_version(o.vllm_version) != parse_version(env.vllm.version):
        version = parse_version(o.vllm_version)
        # A named release: we know no release up to the newest checked has the variable.
        supports = False if version is not None and version <= VLLM_NEWEST_CHECKED else None
        vllm_version: str | None = o.vllm_version
    else:
        vllm_version, supports = env.vllm.version, env.vllm.supports_finalize_env
    if o.sglang_version is not None:
        return _sglang_target(fp, o, environ)
    finalize = o.finalize or ("unfused" if environ.get(VLLM_FINALIZE_ENV) == "0" else "fused")
    return Target(fp, vllm_version, supports, finalize)


def _sglang_target(fp: Fingerprint, o: Overrides, environ: dict[str, str]) -> Target:
    """SGLang's mode: --finalize, else its flag (deterministic forces unfused), else its
    variable, else its release's default (versions.sglang_finalize_default)."""
    _valid_version("--sglang-version", o.sglang_version)
    args = parse_sglang_args(o.sglang_argv or ())
    said = env_bool(sglang_layout.effective(environ, SGLANG_FINALIZE_ENV))
    if o.finalize:
        finalize = o.finalize
    elif args.deterministic:
        finalize = "unfused"
    elif said is not None and sglang_finalize_default(o.sglang_version) is not None:
        finalize = "fused" if said else "unfused"
    else:
        finalize = sglang_finalize_default(o.sglang_version) or "fused"
    return Target(fp, None, None, finalize, o.sglang_version)


def _moe(serve: ServeArgs | None, environ: dict[str, str]) -> bool | None:
    """Whether the served model has experts, from its config.json here (None: not readable)."""
    if serve is None or not serve.model:
        return None
    return layout.is_moe(hf.read_config(serve.model, environ))


def predicted_vllm_dir(
    target: Target, environ: dict[str, str], serve: ServeArgs | None = None
) -> Path:
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


def _target_namespace(target: Target, store: Path) -> Path:
    mode: FinalizeMode = "unfused" if target.finalize == "unfused" else "fused"
    return Namespace(target.fingerprint, mode).path(store)


def _applies(cache: Cache, ns_dir: Path | None, ours: Path, target: Target) -> str | None:
    """Why the target never loads this cache, or None when it may: it loads only its own
    namespace of the store, and only its version and arch dir of a vLLM cache root."""
    if ns_dir is not None:
        if ns_dir == ours:
            return None
        return f"it is in another namespace of the store; the target's is {ours}"
    fp, found = target.fingerprint, cache.found
    if found.layout == "vllm":
        if fp.flashinfer_version and found.dir_version != fp.flashinfer_version:
            return (
                f"vLLM keeps FlashInfer {found.dir_version}'s caches in their own dir; the "
                f"target (FlashInfer {fp.flashinfer_version}) reads .../{fp.flashinfer_version}/"
                f"{fp.arch or found.arch}/"
            )
        if fp.arch and found.arch != fp.arch:
            return f"it is in the {found.arch} dir; the target's GPU arch is {fp.arch}"
    if found.layout == "sglang" and target.sglang_version is not None:
        if fp.flashinfer_version and found.dir_version != fp.flashinfer_version:
            return (
                f"SGLang keeps FlashInfer {found.dir_version}'s files in their own dir; the "
                f"target runs FlashInfer {fp.flashinfer_version}"
            )
        one = re.fullmatch(r"(\d+)[af]?", fp.arch or "")  # one GPU kind: FlashInfer's "90a"
        if one and found.arch and found.arch != f"sm{one.group(1)}":
            return f"it is in the {found.arch} dir; the target's GPU is sm{one.group(1)}"
    return None


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
    sglang = None
    live: tuple[LiveSglang, ...] = ()
    here = None
    if target.sglang_version is not None:
        sglang, serve_argv = parse_sglang_args(serve_argv or ()), None
        live = tuple(sglang_live.running())
        here = (sglang_layout.user_cache_dir(environ), sglang_live.devices(environ))
    serve: ServeArgs | None = parse_serve_args(serve_argv) if serve_argv is not None else None
    if serve is not None and (why := layout.argv_refusal(target.vllm_version, serve)):
        raise Refused(why)  # as warm and serve refuse it
    log_facts = tuple(read_log(p) for p in logs)
    if location is not None and location.dir:
        predicted = Path(location.dir)  # vLLM's own answer, hash dir included
    elif target.sglang_version is not None:
        predicted = sglang_layout.autotune_root(environ)  # where plain `sglang serve` keeps it
    else:
        predicted = predicted_vllm_dir(target, environ, serve)
    roots_implicit = [store / NAMESPACES_DIR]
    if predicted.is_dir() and store not in predicted.parents:
        roots_implicit.append(predicted)
    inv = scan([r for r in roots_implicit if r.is_dir()], explicit=False)
    given = scan(paths)
    # A log named where a cache goes is not a corrupt cache: it is refused with a pointer to --log.
    as_logs = {
        p
        for p in paths
        if p.is_file() and not VLLM_CACHE_FILE_RE.match(p.name) and looks_like_log(p)
    }
    bad_given = [p for p in given.problems if not (p.check == "corrupt-file" and p.path in as_logs)]
    problems = [*inv.problems, *bad_given]
    ours = _target_namespace(target, store)
    views: list[CacheView] = []
    modes: dict[Path, int] = {}
    manifest_memo: dict[Path, manifests.Manifest | None] = {}
    with contextlib.suppress(OSError):
        modes[store] = store.stat().st_mode  # a private store (0700) wants no sharing advice
    seen: set[Path] = set()
    named = {c.path.resolve() for c in given.caches}
    for cache in [*inv.caches, *given.caches]:
        if (key := cache.path.resolve()) in seen:
            continue  # a PATH inside the store or vLLM's dir: check it once
        seen.add(key)
        parts = namespace_parts(cache.path, store)
        ns_dir = Path(parts["dir"]) if parts else None
        manifest = None
        if ns_dir is not None:
            if ns_dir not in manifest_memo:
                try:
                    manifest_memo[ns_dir] = manifests.load(ns_dir)
                except CorruptCache as exc:
                    manifest_memo[ns_dir] = None
                    problems.append(
                        ScanProblem(Path(exc.path or ns_dir), "corrupt-file", exc.message)
                    )
            manifest = manifest_memo[ns_dir]
            for p in (cache.path, *cache.path.parents):
                with contextlib.suppress(OSError):
                    modes[p] = p.stat().st_mode
                if p == ns_dir:
                    break
        defects = cache.defects()
        finalize = parts["finalize"] if parts else None
        why_not = _applies(cache, ns_dir, ours, target)
        views.append(
            CacheView(
                cache, ns_dir, finalize, manifest, defects, why_not is None, why_not or "",
                key in named,
            )
        )  # fmt: skip
    now = time.time()
    tmp = []
    seen_tmp: set[Path] = set()
    # The whole store, not only its namespaces: killed imports and pulls leave theirs at the top.
    for root in [store, *(r for r in roots_implicit if store not in r.parents), *paths]:
        if root.is_dir():
            for t in tmp_leftovers(root):
                if (key := t.resolve()) in seen_tmp:
                    continue  # a PATH inside the store: report it once
                seen_tmp.add(key)
                try:
                    tmp.append((t, now - leftover_mtime(t)))
                except OSError:
                    continue
    return Inputs(
        target=target,
        caches=tuple(views),
        problems=tuple(problems),
        tmp_files=tuple(tmp),
        logs=log_facts,
        serve=serve,
        serve_moe=_moe(serve, environ),
        environ={
            k: v
            for k, v in environ.items()
            if k.startswith(("VLLM_", "FLASHINFER_", "SGLANG_", "SGL_"))
        },
        modes=modes,
        store=store,
        predicted_dir=predicted if os.path.isdir(predicted) or serve is not None else None,
        location=location,
        location_from=location_from,
        empty=tuple(given.empty),
        logs_as_paths=tuple(sorted(as_logs)),
        sglang=sglang,
        sglang_live=live,
        sglang_here=here,
    )
