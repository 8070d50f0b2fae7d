"""Where a vLLM release keeps FlashInfer's autotune results, modelled from its code: the answer
fi-cache gives when it cannot ask the vLLM itself (predict.py asks it). Pure: no I/O.

Three shapes (docs/facts.md): one v1 file `<dir>/<config hash>/autotune_configs.json` (0.25-0.31),
per-rank v1 files `..._dp<D>_rank<R>.json` (0.32+), and on 0.33 for one rank on one node
FlashInfer's v2 store `<root>/v2/<environment hash>/entries/` with no vLLM hash in the path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from fi_cache.caches.discover import flashinfer_default_root
from fi_cache.engines.vllm.args import DISABLE_FLAG, ServeArgs, vllm_spelling
from fi_cache.versions import (
    CACHE_SINGLE_RANK_ONLY,
    FLASHINFER_V2_STORE,
    READ_ONLY_FAILS,
    VLLM_CACHE_DIR_ENV,
    VLLM_CACHE_FILE,
    VLLM_DISABLE_AUTOTUNE_FLAG,
    VLLM_EXPERT_FIELDS,
    VLLM_PERSISTENT_CACHE,
    VLLM_RANK_GATE,
    VLLM_SKIP_OPS_ENV,
    VLLM_V2_STORE,
    parse_version,
)

Store = Literal["v1", "v2"]


def store_kind(
    vllm_version: str | None,
    flashinfer_version: str | None,
    args: ServeArgs,
    moe: bool | None = None,
) -> Store:
    """v2 where vLLM 0.33's use_flashinfer_autotune_v2 would say so: world size 1 on one node.
    With dp > 1 an MoE model's DP ranks join one world group (parallel_state.py 0.33:1858-1872,
    v1/engine/core.py 0.33:1546): v1; a dense model's are independent worlds of one: v2. Which
    it is, the HF config says (`moe`); unknown from an argv, MoE is assumed (DP serves MoE),
    and `doctor -- ARGS` asks vLLM itself."""
    version, fi = parse_version(vllm_version), parse_version(flashinfer_version)
    if version is None or version < VLLM_V2_STORE:
        return "v1"
    if fi is not None and fi < FLASHINFER_V2_STORE:
        return "v1"  # has_flashinfer_autotune_v2() is False
    if args.elastic_ep or args.pp > 1 or args.nnodes > 1 or args.tp * args.pp > 1:
        return "v1"
    if args.dp > 1 and moe is not False:
        return "v1"
    return "v2"


def v2_root(environ: Mapping[str, str], home: Path | None = None) -> Path:
    """The root vLLM 0.33 hands FlashInfer's v2 store (the store is `<root>/v2/`)."""
    override = environ.get(VLLM_CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return flashinfer_default_root(environ, home)  # resolve_..._v2_root() None: FlashInfer's


def vllm_cache_root(environ: Mapping[str, str]) -> str:
    """VLLM_CACHE_ROOT as vLLM reads it (envs.py 0.25:644 ... 0.33:714, get_default_cache_root
    0.33:340): an empty value counts as set (so "" or "vllm", relative to the worker's cwd),
    and one expanduser on the result, so "~" in XDG_CACHE_HOME is expanded too."""
    xdg = environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return os.path.expanduser(environ.get("VLLM_CACHE_ROOT", os.path.join(xdg, "vllm")))


def read_only_problem(vllm_version: str | None, args: ServeArgs) -> str | None:
    """Why this vLLM fails on a read-only cache dir even when the namespace is fully warm; None
    when it survives (0.32+, or 0.25/0.26 with more than one rank, which use no cache)."""
    version = parse_version(vllm_version)
    if version is None or version not in READ_ONLY_FAILS:
        return None
    if version in CACHE_SINGLE_RANK_ONLY and args.world_size > 1:
        return None
    return (
        f"vLLM {version} writes its autotune file at every start, warm or not "
        f"({READ_ONLY_FAILS.source}), so it fails on a read-only store; vLLM 0.32+ starts from "
        "a fully warm read-only store"
    )


def argv_refusal(vllm_version: str | None, args: ServeArgs) -> str | None:
    """Why this vLLM rejects the command line before it starts (warm, serve and doctor refuse
    it alike): --disable-flashinfer-autotune before 0.33."""
    version = parse_version(vllm_version)
    if args.disable_flag and version is not None and version < VLLM_DISABLE_AUTOTUNE_FLAG:
        return (
            f"vLLM {version} has no {DISABLE_FLAG} ({VLLM_DISABLE_AUTOTUNE_FLAG} added it) and "
            "would reject the command line: pass --no-enable-flashinfer-autotune"
        )
    return None


def is_moe(config: Mapping[str, Any] | None) -> bool | None:
    """vLLM's `model_config.is_moe` from a model's config.json: the first expert-count field
    present (VLLM_EXPERT_FIELDS) of its text config above 0, or a "moe" block of
    block_configs; None when there is no config to read."""
    if config is None:
        return None
    text = config.get("text_config")
    fields = text if isinstance(text, Mapping) else config
    count = next((fields[f] for f in VLLM_EXPERT_FIELDS if fields.get(f) is not None), 0)
    if isinstance(count, list):
        count = count[0] if count else 0
    if isinstance(count, int) and count > 0:
        return True
    blocks = fields.get("block_configs")
    return isinstance(blocks, list) and any(
        isinstance(b, Mapping) and b.get("block_type") == "moe" and b.get("n_routed_experts")
        for b in blocks
    )


def _folds(args: ServeArgs, moe: bool | None) -> bool:
    """DP folded into the world group: MoE (or unknown: assumed) with dp > 1, or several nodes,
    without elastic EP (parallel_state.py 0.33:1858-1872; a dense model's DP ranks are engines
    of dp 1, v1/engine/core.py 0.33:1546-1556)."""
    dp = args.dp if moe is not False else 1
    return (dp > 1 or args.nnodes > 1) and not args.elastic_ep


def rank_files(
    vllm_version: str | None, flashinfer_version: str | None, args: ServeArgs, moe: bool | None
) -> tuple[str, ...] | None:
    """Every file one hash dir holds for `args` on every node, by vLLM's own naming
    (docs/facts.md, "Rank files by parallel layout"): one autotune_configs.json (0.25-0.31),
    `autotune_configs_dp{d}_rank{r}.json` (0.32+; r the world rank when DP is folded into it),
    none for the v2 store or a vLLM without a cache; None when the version is not known."""
    version = parse_version(vllm_version)
    if version is None:
        return None
    if version < VLLM_PERSISTENT_CACHE:
        return ()
    if store_kind(vllm_version, flashinfer_version, args, moe) == "v2":
        return ()
    if version not in VLLM_RANK_GATE:
        return (VLLM_CACHE_FILE,)
    local = args.tp * args.pp
    fold = _folds(args, moe)
    dps = range(args.dp if moe is not False or args.elastic_ep else 1)
    return tuple(
        f"autotune_configs_dp{d}_rank{d * local + r if fold else r}.json"
        for d in dps
        for r in range(local)
    )


def tune_groups(args: ServeArgs, ranks: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The ranks (`dp{d}_rank{r}`) that load or tune together when pp > 1: each stage's TP
    group, r // tp within a DP rank (kernel_warmup.py 0.32:440, 0.33:465, 0.34:571;
    parallel_state.py lays ranks out as [dp][pp][tp]). () with pp 1: the world group, which
    the names tell (ranks/deployment.py)."""
    if args.pp <= 1:
        return ()
    groups: dict[tuple[int, int], list[str]] = {}
    for name in ranks:
        dp, _, r = name.removeprefix("dp").partition("_rank")
        groups.setdefault((int(dp), int(r) // args.tp), []).append(name)
    return tuple(tuple(g) for g in groups.values())


def skip_ops(environ: Mapping[str, str]) -> str | None:
    """VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS as vLLM 0.33+ reads it (envs.py 0.34:1910-1917): None
    when unset (vLLM's own defaults), else the ops it names, sorted ("" skips nothing)."""
    value = environ.get(VLLM_SKIP_OPS_ENV)
    if value is None:
        return None
    return ",".join(sorted({v.strip() for v in value.split(",") if v.strip()}))


_EXTENSIBLE_ON = {"--enable-extensible-kv-cache", "--no-disable-extensible-kv-cache"}
_EXTENSIBLE_OFF = {"--no-enable-extensible-kv-cache", "--disable-extensible-kv-cache"}


def extensible_kv(args: ServeArgs) -> bool | None:
    """vLLM 0.34's --[no-]enable-extensible-kv-cache as the arguments set it (the last wins);
    None: not set, vLLM's default (on where supported: config/vllm.py 0.34:3190-3254)."""
    said = None
    for arg in args.argv:
        name = vllm_spelling(arg.split("=", 1)[0])
        if name in _EXTENSIBLE_ON:
            said = True
        elif name in _EXTENSIBLE_OFF:
            said = False
    return said
