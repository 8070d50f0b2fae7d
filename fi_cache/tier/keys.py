"""vLLM's tier keys as pure functions, and `mooncake://KEY` arguments (fi_cache.versions.tier)."""

from __future__ import annotations

from dataclasses import dataclass

from fi_cache.errors import Refused
from fi_cache.versions import (
    TIER_CONFIG_HASH,
    TIER_FLASHINFER_KIND,
    TIER_KEY_PREFIX,
    VLLM_RANK_FILE,
)

SCHEME = "mooncake://"
# click's Path type and pathlib collapse "//": "mooncake://k" reaches a command as "mooncake:/k".
_COLLAPSED = "mooncake:/"
HASH_DIR_PREFIX = f"{TIER_KEY_PREFIX}/{TIER_FLASHINFER_KIND}/"
# Mooncake lists no keys: a hash dir's ranks are probed by name in one batch, dp0..dp31 x
# rank0..rank511 (16,384 names, ~30 ms). MoE with dp > 1 folds DP into one world, so rank r of
# DP rank d is named rank{d*tp*pp + r}: 32 x 8 x 2 = 512 ranks.
MAX_DP = 32
MAX_RANK = 512


@dataclass(frozen=True)
class TierKey:
    """One table's key: its config hash dir and rank (vLLM's per-rank file name)."""

    config_hash: str
    dp: int
    rank: int

    @property
    def filename(self) -> str:
        return f"autotune_configs_dp{self.dp}_rank{self.rank}.json"

    @property
    def key(self) -> str:
        return rank_key(self.config_hash, self.dp, self.rank)

    @property
    def url(self) -> str:
        return SCHEME + self.key


def rank_key(config_hash: str, dp: int, rank: int) -> str:
    """artifact_key("flashinfer_autotune", hash, "autotune_configs_dp{d}_rank{r}.json")."""
    return f"{HASH_DIR_PREFIX}{config_hash}/autotune_configs_dp{dp}_rank{rank}.json"


def is_tier_arg(arg: object) -> bool:
    return str(arg).startswith(_COLLAPSED)


def _key_text(arg: object) -> str:
    text = str(arg)
    return text[len(SCHEME) :] if text.startswith(SCHEME) else text[len(_COLLAPSED) :]


@dataclass(frozen=True)
class TierArg:
    """A `mooncake://` argument: one table's key, or a hash dir (every rank key under it)."""

    text: str  # as the user wrote it, with the scheme's "//" restored
    config_hash: str
    one: TierKey | None  # None: the whole hash dir

    def candidates(self) -> list[TierKey]:
        """The keys to look at: the one, or every rank name up to the probe bound."""
        if self.one is not None:
            return [self.one]
        return [TierKey(self.config_hash, d, r) for d in range(MAX_DP) for r in range(MAX_RANK)]


def parse_arg(arg: object) -> TierArg:
    """`mooncake://vllm-warmup-cache/flashinfer_autotune/<hash>/[autotune_configs_dp{d}_rank{r}.json]`.
    Raises Refused (exit 2) for any other key: vLLM's daemon reads no other."""
    key = _key_text(arg)
    text = SCHEME + key
    if not key.startswith(HASH_DIR_PREFIX):
        raise Refused(f"not a vLLM warmup-cache key (they start with {HASH_DIR_PREFIX})", text)
    rest = key[len(HASH_DIR_PREFIX) :].rstrip("/")
    config_hash, _, name = rest.partition("/")
    if not TIER_CONFIG_HASH.match(config_hash):
        raise Refused("the config hash is not 64 lowercase hex digits (vLLM's own)", text)
    if not name:
        return TierArg(text, config_hash, None)
    m = VLLM_RANK_FILE.match(name)
    if m is None or "/" in name:
        raise Refused("not a vLLM rank table name (autotune_configs_dp{d}_rank{r}.json)", text)
    return TierArg(text, config_hash, TierKey(config_hash, int(m.group(1)), int(m.group(2))))


def split_args(args: tuple[object, ...]) -> tuple[list[TierArg], list[object]]:
    """The `mooncake://` arguments (parsed) and the rest. A command takes one kind or the other."""
    tier = [parse_arg(a) for a in args if is_tier_arg(a)]
    rest = [a for a in args if not is_tier_arg(a)]
    if tier and rest:
        raise Refused("give mooncake:// keys or paths, not both in one command", str(rest[0]))
    return tier, rest
