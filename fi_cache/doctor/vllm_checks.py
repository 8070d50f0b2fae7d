"""Checks over the target vLLM, its command line and environment (domain.md §5-7)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, Inputs
from fi_cache.engines.vllm import layout
from fi_cache.engines.vllm.args import parse_serve_args
from fi_cache.engines.vllm.launch import ALTERNATIVES
from fi_cache.errors import Refused
from fi_cache.versions import (
    ALL2ALL_ENV,
    ALL2ALL_ENV_READ,
    CACHE_SINGLE_RANK_ONLY,
    DOUBLE_REDUCE,
    DOUBLE_REDUCE_BACKENDS,
    FLASHINFER_NOT_ON_PYPI,
    REMOVED_ENV_EXACT,
    REMOVED_ENV_PREFIX,
    REMOVED_ENV_SINCE,
    VLLM_EXTENSIBLE_KV,
    VLLM_EXTENSIBLE_KV_SKIPS,
    VLLM_FINALIZE_ENV,
    VLLM_FLASHINFER_PINS,
    VLLM_NEWEST_CHECKED,
    VLLM_PERSISTENT_CACHE,
    VLLM_SKIP_OPS,
    VLLM_SKIP_OPS_ENV,
    WARM_CACHE_HANG,
    UnfusedRoute,
    Version,
    parse_version,
    unfused_route,
    vllm_passes_finalize_arg,
)


def _vllm(inp: Inputs) -> str:
    return f"vLLM {inp.target.vllm_version}" if inp.target.vllm_version else "the target vLLM"


def unfused_way(inp: Inputs) -> tuple[UnfusedRoute | None, str]:
    """How the target (vLLM, FlashInfer) pair reaches unfused finalize (versions.unfused_route):
    the variable, fi-cache's plugin, or not at all; None: cannot tell."""
    t = inp.target
    supports = t.vllm_supports_finalize
    version = parse_version(t.vllm_version)
    if supports is None and version is not None and version <= VLLM_NEWEST_CHECKED:
        supports = False  # no release up to the newest checked has the variable
    passes = vllm_passes_finalize_arg(t.vllm_version)
    return unfused_route(supports, t.fingerprint.flashinfer_version, passes)


def selects_unfused(inp: Inputs) -> bool | None:
    """Can the target vLLM run the unfused MoE finalize (fi-cache's plugin counts: its serve and
    warm carry it)? None: cannot tell."""
    version = parse_version(inp.target.vllm_version)
    supports = inp.target.vllm_supports_finalize
    if unfused_way(inp)[0] == "plugin":
        return True
    if supports is None and version is not None and version <= VLLM_NEWEST_CHECKED:
        return False  # no release up to the newest checked has the variable
    return supports


def runs_finalize(inp: Inputs) -> str:
    """The finalize mode the target's start-up runs: the one asked for, except an unfused ask on
    a vLLM that cannot select it, which runs fused (finalize-unsupported says so)."""
    t = inp.target
    if t.finalize == "unfused" and not _moe_off_flashinfer(inp) and selects_unfused(inp) is False:
        return "fused"
    return t.finalize


def finalize_unsupported(inp: Inputs) -> Iterator[Finding]:
    t = inp.target
    if t.finalize != "unfused" or _moe_off_flashinfer(inp):
        return
    version = parse_version(t.vllm_version)
    supports = selects_unfused(inp)
    way, why = unfused_way(inp)
    if way == "plugin":
        yield Finding(
            "finalize-unsupported",
            "info",
            None,
            f"{_vllm(inp)} does not read {VLLM_FINALIZE_ENV}, but {why}: `fi-cache serve "
            "--deterministic` and `warm --finalize unfused` reach unfused finalize that way; a "
            "plain `vllm serve` starts fused",
            "start it with fi-cache serve --deterministic (docs/serving.md: what torch's "
            "deterministic algorithms cost)",
        )
    elif supports is False:
        because = f" ({why})" if way == "impossible" else ""
        yield Finding(
            "finalize-unsupported",
            "error",
            None,
            f"{_vllm(inp)} does not read {VLLM_FINALIZE_ENV}{because}: the unfused "
            "(deterministic) MoE path cannot be selected; it starts with fused finalize whatever "
            "the variable, the namespace or the cache say (this decides start-up: "
            "stale-gemm2-profile judges caches against fused)",
            ALTERNATIVES,
        )
    elif supports is None:
        why = (
            f"newer than the newest release checked, {VLLM_NEWEST_CHECKED}"
            if version
            else "no vllm/envs.py to inspect and no --vllm-version"
        )
        yield Finding(
            "finalize-unsupported",
            "warning",
            None,
            f"cannot tell whether {_vllm(inp)} reads {VLLM_FINALIZE_ENV} ({why})",
            "run doctor where that vLLM is installed: fi-cache reads its vllm/envs.py",
        )


def _moe_off_flashinfer(inp: Inputs) -> bool:
    """The documented alternatives: MoE on another backend, or batch-invariant mode (0.19+)."""
    backend = inp.serve.moe_backend if inp.serve else None
    if backend is not None and not backend.startswith("flashinfer"):
        return True
    return inp.environ.get("VLLM_BATCH_INVARIANT") == "1"


def double_reduce(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    args = inp.serve
    if args is None or version is None or version not in DOUBLE_REDUCE:
        return
    # The all2all kernels run only with data parallel > 1 and expert parallel (use_all2all_kernels,
    # fused_moe/config.py 0.15.1:868-869, 0.21.0:1027-1028); the extra reduce is over TP.
    runs_all2all = args.dp > 1 and args.expert_parallel
    backend, spelled = args.all2all_backend, "--all2all-backend"
    if backend is None and version in ALL2ALL_ENV_READ:
        backend, spelled = inp.environ.get(ALL2ALL_ENV), ALL2ALL_ENV
    if backend in DOUBLE_REDUCE_BACKENDS and runs_all2all and args.tp > 1:
        yield Finding(
            "double-reduce",
            "error",
            None,
            f"vLLM {version} with {spelled} {backend}, data and expert "
            f"parallel and tensor-parallel size {args.tp}: the MoE output is all-reduced again "
            "after FlashInfer's combine reduced it (wrong outputs; GSM8K 0.93 -> 0.81 in the "
            "fix's report)",
            f"upgrade to vLLM >= {DOUBLE_REDUCE.end} ({DOUBLE_REDUCE.source}), or use -tp 1 or "
            "another --all2all-backend",
        )


def _warm_cache_for_target(inp: Inputs) -> str | None:
    fi = inp.target.fingerprint.flashinfer_version
    for view in inp.caches:
        if not view.applies:
            continue
        path = view.cache.path
        if inp.predicted_dir is not None and inp.predicted_dir in path.parents:
            return str(path)
        if (
            view.namespace_dir is not None
            and view.namespace_finalize == inp.target.finalize
            and (fi is None or view.cache.flashinfer_version == fi)
        ):
            return str(path)
    return None


def warm_cache_hang(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    args = inp.serve
    if args is None or version is None or args.world_size <= 1 or args.autotune_off:
        return
    if version in WARM_CACHE_HANG and (cache := _warm_cache_for_target(inp)) is not None:
        yield Finding(
            "warm-cache-hang",
            "warning",
            cache,
            f"vLLM {version} with world size {args.world_size} and a warm autotune cache: start-up "
            f"can deadlock ({WARM_CACHE_HANG.source})",
            f"upgrade to vLLM >= {WARM_CACHE_HANG.end} (per-rank files, loaded only when every "
            "rank has one), or start this one without the "
            "cache (--no-enable-flashinfer-autotune / -O0, or an empty cache dir)",
        )


def cache_unused(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    args = inp.serve
    if args is None or version is None or args.world_size <= 1 or args.autotune_off:
        return
    if version in CACHE_SINGLE_RANK_ONLY:
        yield Finding(
            "cache-unused",
            "info",
            None,
            f"vLLM {version} uses the autotune cache only with world size 1; this run "
            f"(world size {args.world_size}) re-tunes at every start and saves nothing",
            "upgrade to vLLM >= 0.27 to keep tuning results with tensor/data parallelism",
        )


def removed_env(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    if version is None or version < REMOVED_ENV_SINCE:
        return
    for name in sorted(inp.environ):
        if name in REMOVED_ENV_EXACT or name.startswith(REMOVED_ENV_PREFIX):
            yield Finding(
                "removed-env",
                "warning",
                None,
                f"{name} is set, but vLLM {version} no longer reads it (removed in "
                f"{REMOVED_ENV_SINCE}): it does nothing",
                "unset it; choose the MoE backend with --moe-backend",
            )


def flashinfer_pin(inp: Inputs) -> Iterator[Finding]:
    """A vLLM release whose exact FlashInfer pin is not what it will import (0.34 pins 0.7.3,
    which PyPI lacks): the FlashInfer installed beside it names the cache and its _metadata."""
    version = parse_version(inp.target.vllm_version)
    pin = VLLM_FLASHINFER_PINS.get(version) if version is not None else None
    fi = inp.target.fingerprint.flashinfer_version
    if pin is None or pin == fi:
        return
    lacking = (
        f"PyPI has no flashinfer-python {pin}, so `pip install vllm=={version}` cannot resolve "
        "and vLLM is installed with --no-deps beside a FlashInfer chosen by hand; "
        if pin in FLASHINFER_NOT_ON_PYPI
        else ""
    )
    using = (
        f"this one imports FlashInfer {fi}"
        if fi
        else "which FlashInfer it imports is not known here (give --flashinfer-version)"
    )
    yield Finding(
        "flashinfer-pin",
        "info",
        None,
        f"vLLM {version} pins flashinfer-python=={pin} (its METADATA); {lacking}{using}: "
        "that version names the cache dir and its _metadata",
        "tune and serve with the same FlashInfer: a cache tuned under another is not read",
    )


def _scope(skip: str | None, extensible: bool | None, version: Version) -> str:
    """What a start leaves untuned, in words."""
    if skip is not None:
        return f"{VLLM_SKIP_OPS_ENV}={skip}" if skip else f"{VLLM_SKIP_OPS_ENV}= (nothing skipped)"
    if version >= VLLM_EXTENSIBLE_KV:
        off = extensible is False
        return (
            "the extensible KV cache off (MLA decode tuned)"
            if off
            else f"the extensible KV cache on ({VLLM_EXTENSIBLE_KV_SKIPS} not tuned)"
        )
    return f"no {VLLM_SKIP_OPS_ENV}"


def _warmed_scopes(inp: Inputs, version: Version) -> set[str]:
    """The tuning scopes the namespaces' recorded warms of this model ran under: a warm's key
    is its argv's unless VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS was set (engines/vllm/engine.py)."""
    assert inp.serve is not None
    seen, out = set(), set()
    for view in inp.caches:
        m = view.manifest
        if m is None or not view.applies or view.namespace_dir in seen:
            continue
        seen.add(view.namespace_dir)
        for w in m.warms:
            if not w.ok or w.engine != "vllm" or not w.argv:
                continue
            with contextlib.suppress(Refused):
                theirs = parse_serve_args(w.argv)
                if theirs.model != inp.serve.model:
                    continue
                skip = None if w.argv_key == theirs.key else "(a value not recorded)"
                out.add(_scope(skip, layout.extensible_kv(theirs), version))
    return out


def tuning_scope(inp: Inputs) -> Iterator[Finding]:
    """What vLLM 0.33+ leaves untuned outside its hash (VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS,
    0.34's extensible KV cache skipping trtllm_batch_decode_mla): a start under another
    setting loads the same dir and, on a full hit, skips its sweep."""
    version = parse_version(inp.target.vllm_version)
    serve = inp.serve
    if serve is None or version is None or version < VLLM_SKIP_OPS or serve.autotune_off:
        return
    skip, extensible = layout.skip_ops(inp.environ), layout.extensible_kv(serve)
    ours = _scope(skip, extensible, version)
    other = sorted(_warmed_scopes(inp, version) - {ours})
    if not other and skip is None:
        return
    why = (
        f"vLLM {version} does not hash what it leaves untuned, so a start under another setting "
        "reads the same hash dir and, when every rank's file passes its gate, skips its tuning "
        "sweep: what one start left untuned stays on FlashInfer's fallback tactic in the other"
    )
    if other:
        yield Finding(
            "tuning-scope",
            "warning",
            None,
            f"this start runs with {ours}; the namespace's warm of {serve.model} ran with "
            f"{', '.join(other)}. {why}",
            "serve and warm count a warm only for the setting it ran under; to tune what the "
            "earlier warm skipped, warm with that setting into an empty namespace (--store DIR)",
        )
        return
    yield Finding(
        "tuning-scope",
        "info",
        None,
        f"this start runs with {ours}. {why}",
        "serve and warm count a warm only for the setting it ran under",
    )


def _v2_by_model(inp: Inputs) -> bool:
    fi = inp.target.fingerprint.flashinfer_version
    serve, version = inp.serve, inp.target.vllm_version
    return serve is not None and layout.store_kind(version, fi, serve, inp.serve_moe) == "v2"


def _by_layout(inp: Inputs) -> str:
    """The layout model's file names for `-- ARGS` (no vLLM to ask), and what it assumed."""
    serve, fi = inp.serve, inp.target.fingerprint.flashinfer_version
    files = (
        None
        if serve is None
        else layout.rank_files(inp.target.vllm_version, fi, serve, inp.serve_moe)
    )
    named = ", ".join(files) if files else "autotune_configs*.json"
    assumed = ""
    if serve is not None and serve.dp > 1 and inp.serve_moe is None:
        assumed = (
            "; MoE assumed (the model's config.json is not readable here): a dense model's DP "
            "ranks are engines of their own, each dp0_rank* (on vLLM 0.33+ with one GPU per "
            "engine, FlashInfer's v2 store)"
        )
    return f"{named} in <dir>/<config hash>/{assumed}"


def cache_location(inp: Inputs) -> Iterator[Finding]:
    version = parse_version(inp.target.vllm_version)
    if inp.predicted_dir is None or (version is not None and version < VLLM_PERSISTENT_CACHE):
        return
    off = inp.serve is not None and inp.serve.autotune_off
    what = "neither reads nor writes it (autotune is off)" if off else "keeps its cache there"
    loc = inp.location
    if loc is not None and not loc.dir:
        yield Finding(
            "cache-location",
            "info",
            None,
            f"{_vllm(inp)} keeps no FlashInfer autotune cache for these arguments: {loc.root_from}",
            "nothing to warm; FlashInfer's tuning needs it installed with vLLM and an SM90+ GPU",
        )
        return
    how = f" (computed with {inp.location_from})" if inp.location_from else ""
    if loc.store == "v2" if loc is not None else _v2_by_model(inp):
        where = (
            f"FlashInfer's v2 store, <environment hash>/entries/ in this dir{how}: one rank on "
            "one node, so no vLLM config hash; every argv on this environment shares it"
        )
    elif loc is not None and loc.dir:
        where = f"{', '.join(loc.files)} in this dir{how}"
    else:
        where = f"{_by_layout(inp)}{how}"
    yield Finding(
        "cache-location",
        "info",
        str(inp.predicted_dir),
        f"{_vllm(inp)} {what}: {where}; the GPU model and CUDA stack are not part of this path",
        "fi-cache serve gives each environment and finalize mode a dir of its own",
    )
    if loc is not None and loc.depends_on:
        yield Finding(
            "cache-location",
            "info",
            str(inp.predicted_dir),
            f"this hash dir holds only if vLLM's GPU worker keeps what it resolves at start as "
            f"the arguments set it: {'; '.join(loc.depends_on)}",
            "a numeric --max-model-len is known before the start, --block-size N fixes the KV "
            "block size (not a hybrid model's), CUDA graphs are resolved per attention backend "
            "(--enforce-eager has none); a warm checks the dir vLLM names",
        )


CHECKS = (
    Check(
        "finalize-unsupported", f"the target vLLM has no {VLLM_FINALIZE_ENV}", finalize_unsupported
    ),
    Check(
        "double-reduce",
        "vLLM 0.15-0.21 + FlashInfer all2all, data + expert parallel, tensor parallel > 1",
        double_reduce,
    ),
    Check("warm-cache-hang", "vLLM 0.27-0.31, world size > 1 and a warm cache", warm_cache_hang),
    Check(
        "cache-unused",
        "vLLM 0.25-0.26 with world size > 1 never uses the cache (info)",
        cache_unused,
    ),
    Check("removed-env", "environment variables the target vLLM no longer reads", removed_env),
    Check("cache-location", "where vLLM will keep its cache (info)", cache_location),
    Check(
        "tuning-scope",
        "vLLM 0.33+: what VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS or 0.34's extensible KV cache leave "
        "untuned, outside the hash; a recorded warm of the model under another setting",
        tuning_scope,
    ),
    Check(
        "flashinfer-pin",
        "the target vLLM pins a FlashInfer other than the one it imports (info; 0.34: 0.7.3)",
        flashinfer_pin,
    ),
)
