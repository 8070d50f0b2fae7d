"""Read tier keys into the same `Cache` objects files become, by the same decoding rules
(caches/inventory.py: v1.loads, the empty-value rule), with the size refused before the bytes
are fetched. A key's `Cache.path` is the key itself (relative); `url(cache)` is what to print."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fi_cache.caches.discover import Found, ScanProblem
from fi_cache.caches.inventory import Cache, env_megabytes
from fi_cache.errors import EXIT_REFUSED
from fi_cache.model import v1
from fi_cache.tier.keys import SCHEME, TierArg, TierKey
from fi_cache.tier.mooncake import TierClient

MAX_TIER_ENV = "FI_CACHE_TIER_MAX_MB"
# A table is kilobytes to tens of MB; a bigger value is refused unread (and the worker's receive
# buffer, registered memory, is this size).
_DEFAULT_TIER_MAX_MB = 32
MB = 1024 * 1024


def max_value_bytes(environ: Mapping[str, str]) -> int:
    del environ  # env_megabytes reads os.environ, as FI_CACHE_MAX_FILE_MB is read
    return env_megabytes(MAX_TIER_ENV, _DEFAULT_TIER_MAX_MB) * MB


def url(path: Path | str) -> str:
    return SCHEME + str(path)


@dataclass
class TierInventory:
    caches: list[Cache] = field(default_factory=list)
    problems: list[ScanProblem] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # arguments under which no key holds a value
    raw: dict[str, bytes] = field(default_factory=dict)  # key -> the bytes as stored


def found_for(key: TierKey) -> Found:
    """A tier key as the layout it mirrors: vLLM's hash dir with its rank file names."""
    return Found(Path(key.key), "v1", "vllm-override", rank=(key.dp, key.rank))


def decode(key: TierKey, data: bytes) -> Cache | ScanProblem:
    """The bytes as fi-cache reads a file (inventory.read): a table, or why it is not one."""
    path = Path(key.key)
    if not data or (len(data) < 64 and not data.strip()):
        return ScanProblem(path, "corrupt-file", "empty value (not a table)")
    try:
        cf = v1.loads(data)
    except v1.FormatError as exc:
        return ScanProblem(path, "corrupt-file", f"not a FlashInfer table: {exc}")
    return Cache(found_for(key), cf, len(data), time.time())


def read(client: TierClient, args: list[TierArg], limit: int) -> TierInventory:
    inv = TierInventory()
    for arg in args:
        keys = arg.candidates()
        present = [
            k for k, ok in zip(keys, client.exists([k.key for k in keys]), strict=True) if ok
        ]
        if not present:
            inv.empty.append(arg.text)
        for key in present:
            size = client.size(key.key)
            if size is None:
                continue  # removed between the two questions
            if size > limit:
                inv.problems.append(
                    ScanProblem(
                        Path(key.key),
                        "corrupt-file",
                        f"{size / MB:.1f} MB is over the {limit // MB} MB a table may be "
                        f"({MAX_TIER_ENV} raises it); not read",
                        EXIT_REFUSED,
                    )
                )
                continue
            data = client.get(key.key)
            inv.raw[key.key] = data
            result = decode(key, data)
            if isinstance(result, Cache):
                inv.caches.append(result)
            else:
                inv.problems.append(result)
    return inv
