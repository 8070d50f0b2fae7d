"""The tier's connection: the JSON file $MOONCAKE_CONFIG_PATH names, read as vLLM reads it
(MooncakeStoreConfig.from_file, distributed/mooncake_store.py 0.34:66-84), checked up front so a
bad file is one line (exit 2) before any process starts."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from fi_cache.errors import Refused, refuse_special
from fi_cache.versions import MOONCAKE_CONFIG_DEFAULTS, MOONCAKE_CONFIG_ENV

_MAX_CONFIG_BYTES = 1 << 20
TIMEOUT_ENV = "FI_CACHE_TIER_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class TierConfig:
    path: str
    metadata_server: str
    master_server_address: str
    protocol: str
    device_name: str
    tenant_id: str
    local_hostname: str


def _text(data: Mapping[str, object], name: str, path: str) -> str:
    value = data.get(name, MOONCAKE_CONFIG_DEFAULTS.get(name, ""))
    if value is None and name == "tenant_id":
        return "default"
    if not isinstance(value, str):
        raise Refused(f"{name} must be a string, not {type(value).__name__}", path)
    return value.strip()


def load(environ: Mapping[str, str]) -> TierConfig:
    """The connection, or Refused naming the file (or the variable) and what is wrong."""
    path = environ.get(MOONCAKE_CONFIG_ENV, "")
    if not path:
        raise Refused(
            f"{MOONCAKE_CONFIG_ENV} is not set: it names the JSON file vLLM's daemon reads"
        )
    refuse_special(path, "Mooncake config")  # before open(): a FIFO would block there
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise Refused(f"cannot read {MOONCAKE_CONFIG_ENV}: {exc.strerror}", path) from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise Refused("is over 1 MB: not a Mooncake config", path)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused(f"not valid JSON ({exc})", path) from None
    if not isinstance(data, dict):
        raise Refused("not a JSON object", path)
    cfg = TierConfig(
        path,
        _text(data, "metadata_server", path),
        _text(data, "master_server_address", path),
        _text(data, "protocol", path),
        _text(data, "device_name", path),
        _text(data, "tenant_id", path) or "default",
        # Not in vLLM's schema (it asks get_ip()); Mooncake's own config files name it.
        _text(data, "local_hostname", path) or socket.gethostname(),
    )
    if not cfg.master_server_address:
        raise Refused("no master_server_address (host:port of mooncake_master)", path)
    if not cfg.metadata_server:
        raise Refused("no metadata_server (e.g. http://HOST:8080/metadata)", path)
    return cfg


def timeout_s(environ: Mapping[str, str]) -> float:
    raw = environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return _DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise Refused(f"{TIMEOUT_ENV}={raw!r}: give seconds (a number over 0)")
    return value
