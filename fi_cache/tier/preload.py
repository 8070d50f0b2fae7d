"""`vllm preload ARGS`: vLLM 0.33+'s weight-cache daemon command line, read as fi-cache reads
`vllm serve` (pure functions). Its arguments are the engine's (EngineArgs, model by `--model`)
plus the daemon's own options (entrypoints/cli/preload.py 0.34:141-221); the daemon tunes
FlashInfer into the engine's per-rank files with attention skipped (warmup_cache.py 0.34:79-116),
seeds peers over D2D (`--seed-*`) and shares tables through `--warmup-cache-stores`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from fi_cache.doctor.findings import Finding
from fi_cache.errors import Refused
from fi_cache.tier.keys import HASH_DIR_PREFIX, SCHEME
from fi_cache.versions import PRELOAD_SEED_TOKEN_FLAG, PRELOAD_STORES_FLAG

# The daemon's own options, each with a value (preload.py 0.34:144-221, add_cli_args).
PRELOAD_OPTIONS = frozenset(
    {
        "--weight-cache-socket-dir",
        "--weight-cache-master-port",
        "--weight-cache-draft-master-port",
        "--weight-cache-health-port",
        "--weight-cache-health-host",
        "--seed-listen-host",
        "--seed-listen-port",
        "--seed-source-host",
        "--seed-source-port",
        PRELOAD_SEED_TOKEN_FLAG,
        PRELOAD_STORES_FLAG,
    }
)


@dataclass(frozen=True)
class Preload:
    launcher: str  # `vllm` or PATH/vllm
    engine_argv: tuple[str, ...]  # the engine's arguments, as `vllm serve` takes them
    options: dict[str, str]  # the daemon's own

    @property
    def stores(self) -> tuple[str, ...]:
        raw = self.options.get(PRELOAD_STORES_FLAG, "")
        return tuple(n.strip() for n in raw.split(",") if n.strip())  # preload.py 0.34:330-334

    @property
    def seeds(self) -> bool:
        return bool(self.options.get(PRELOAD_SEED_TOKEN_FLAG))

    def serve_argv(self) -> list[str]:
        """The same engine as `vllm serve` would be started: what fi-cache's predictions read."""
        return [self.launcher, "serve", *self.engine_argv]


def split_preload(argv: Sequence[str]) -> Preload | None:
    """`vllm preload ARGS` (None for any other line). A daemon option without its value: exit 2."""
    if len(argv) < 2 or argv[1] != "preload" or os.path.basename(argv[0]) != "vllm":
        return None
    engine: list[str] = []
    options: dict[str, str] = {}
    words = list(argv[2:])
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in PRELOAD_OPTIONS:
            if not eq:
                if i + 1 >= len(words):
                    raise Refused(f"vllm preload: {name} needs a value")
                value = words[i + 1]
                i += 1
            options[name] = value
        else:
            engine.append(word)
        i += 1
    return Preload(argv[0], tuple(engine), options)


def findings(p: Preload, config_hash: str | None) -> list[Finding]:
    """What the daemons do to the files this engine reads, and where to look."""
    hash_dir = SCHEME + HASH_DIR_PREFIX + (config_hash or "<config hash>") + "/"
    out = [
        Finding(
            "vllm-preload",
            "info",
            None,
            "`vllm preload` daemons tune FlashInfer into the engine's own per-rank files with "
            "attention skipped (warmup_cache.py 0.34:79-116); when every rank then hits, vLLM "
            "0.33+ skips its sweep at engine start and the attention ops stay untuned. Its "
            "world is every daemon: for a dense model with dp > 1 its hash and rank names "
            "differ from the engine's",
            "let the engine's first start tune attention (or warm through fi-cache), and run "
            "the daemon with VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR in fi-cache's namespace "
            "(docs/fleet.md)",
        )
    ]
    if p.seeds:
        out.append(
            Finding(
                "vllm-preload",
                "info",
                None,
                "D2D seeding (--seed-token) installs a peer's table over the local file when "
                "the shared stores gave nothing, checking `_metadata` only (seed.py 0.34:102-130): "
                "keys, tactic ids and finalize mode are never looked at",
                "keep every seeding peer on one GPU, stack and finalize mode; `fi-cache doctor` "
                "the installed files after the daemons start",
            )
        )
    if "mooncake" in p.stores:
        out.append(
            Finding(
                "vllm-preload",
                "info",
                None,
                "the daemons adopt from and publish to the Mooncake tier "
                f"({PRELOAD_STORES_FLAG} mooncake): a key holds the first table published, "
                "for every GPU and finalize mode, and vLLM never replaces it",
                f"fi-cache doctor {hash_dir} judges what they will adopt "
                "(MOONCAKE_CONFIG_PATH as the daemons have it)",
            )
        )
    return out
