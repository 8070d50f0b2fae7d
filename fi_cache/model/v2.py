"""FlashInfer's v2 managed store (0.7.0+, opt-in), read-only.

Layout (flashinfer/autotune_cache.py, 0.7.4): `<root>/v2/<env_hash16>/manifest.json` holds the
environment (the `_metadata` fields plus `cache_schema: "v2"` and any non-default measurement
policy); `entries/<sha256(key)[:24]>.json` holds `{"key", "runner", "tactic", ...}`. An entry
whose embedded key does not hash to its file name is a miss for FlashInfer, not an error.
env_hash = sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")))[:16].
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

SCHEMA_DIR = "v2"
MANIFEST = "manifest.json"
ENTRIES_DIR = "entries"
ENV_DIR_NAME = re.compile(r"^[0-9a-f]{16}$")
ENTRY_NAME = re.compile(r"^[0-9a-f]{24}\.json$")


@dataclass(frozen=True)
class V2Entry:
    name: str  # file name under entries/
    key: str
    value: list[Any]  # [runner, tactic, *more], the v1 value shape, for uniform display
    extra: dict[str, Any]  # profiling_policy, key_fields, ... kept as found


def env_hash(manifest: dict[str, Any]) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def entry_file_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24] + ".json"


def parse_entry(name: str, data: Any) -> V2Entry:
    """One entry file's JSON. Raises ValueError with FlashInfer's reason for a miss."""
    if not isinstance(data, dict):
        raise ValueError("entry is not a JSON object")
    for field in ("key", "runner", "tactic"):
        if field not in data:
            raise ValueError(f"entry has no {field!r}")
    key, runner = data["key"], data["runner"]
    if not isinstance(key, str) or not isinstance(runner, str):
        raise ValueError("entry key and runner must be strings")
    if entry_file_name(key) != name:
        raise ValueError(
            "entry key does not hash to its file name (FlashInfer treats it as a miss)"
        )
    extra = {k: v for k, v in data.items() if k not in ("key", "runner", "tactic")}
    return V2Entry(name, key, [runner, data["tactic"]], extra)


def metadata_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The `_metadata`-equivalent fields of a manifest (everything but the schema marker)."""
    return {k: v for k, v in manifest.items() if k != "cache_schema"}
