"""serve's pre-flight over the tier, when the deployment uses one: this node's `vllm preload`
daemon writes the namespace's dir and shares tables through Mooncake (`--warmup-cache-stores
mooncake`, with a MOONCAKE_CONFIG_PATH in its environment or serve's). `vllm serve` itself never
reads the tier: only the daemon builds stores (entrypoints/cli/preload.py 0.34:330-375) and
adopts a table, on a node with no local file (warmup_cache.py 0.34:147-169). So the keys judged
are those of the config hash fi-cache's prediction of this start names (none: nothing is
checked), every rank of it, as `doctor mooncake://HASH/` judges them (tier/judge.py).

In serve only a crash is an error: a FlashInfer <= 0.6.17 table of the other finalize mode,
which an adopting daemon installs and the start replays (`Invalid gemm2 profile id`); every
other finding is a warning (the fleet's daemons tune for themselves instead).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.caches import daemon
from fi_cache.errors import FiCacheError
from fi_cache.versions import MOONCAKE_CONFIG_ENV

if TYPE_CHECKING:  # every vLLM serve imports this: the tier's reader only where a daemon uses one
    from fi_cache.doctor.findings import Finding, Severity
    from fi_cache.doctor.inputs import Target

CRASHES = frozenset({"stale-gemm2-profile"})
MOONCAKE = "mooncake"  # the store name (artifact_store.py 0.34:111-113)


def tier_environ(cache_dir: Path, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment that reaches the tier this deployment uses, or None when it uses none:
    no daemon on `cache_dir`, one without the Mooncake store, or no config to reach it."""
    d = daemon.writing(cache_dir)
    if d is None or MOONCAKE not in d.stores:
        return None
    config = d.mooncake_config or environ.get(MOONCAKE_CONFIG_ENV)
    return {**environ, MOONCAKE_CONFIG_ENV: config} if config else None


def check(
    config_hash: Callable[[], str | None],
    cache_dir: Path,
    target: Target,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[Finding], str | None]:
    """The findings on the tier's tables of the config hash (asked for once a daemon on
    `cache_dir` uses a tier: the prediction's lookup costs more than /proc's), and a note when
    the tier could not be read (a start never waits on it: one line, and it starts as it would)."""
    env = tier_environ(cache_dir, os.environ if environ is None else environ)
    if env is None or (known := config_hash()) is None:
        return [], None
    from fi_cache.tier.judge import judge
    from fi_cache.tier.keys import HASH_DIR_PREFIX, SCHEME, parse_arg
    from fi_cache.tier.mooncake import TierClient
    from fi_cache.tier.read import max_value_bytes, read

    url = f"{SCHEME}{HASH_DIR_PREFIX}{known}/"
    try:
        limit = max_value_bytes(env)
        with TierClient.connect(env, limit) as client:
            inv = read(client, [parse_arg(url)], limit)
    except FiCacheError as exc:
        return [], f"tier not checked ({url}): {exc}"
    return [_in_serve(f) for f in judge(inv, target) if f.severity != "info"], None


def _in_serve(f: Finding) -> Finding:
    severity: Severity = "error" if f.check in CRASHES and f.severity == "error" else "warning"
    return replace(f, severity=severity)
