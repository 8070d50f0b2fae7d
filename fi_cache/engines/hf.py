"""Which Hugging Face `config.json` an engine's model argument names, read without the hub
library: a local model dir's own, or the copy of an HF id in the hub cache that the engine's
first start downloaded (huggingface_hub's layout: `models--ORG--NAME/refs/main` names the
snapshot under `snapshots/`; its cache dir from HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub: huggingface_hub/constants.py 1.x).

Seeding asks it two things: is a local path the same model as an HF id (engines hash the
literal model argument, so the two get different cache dirs), and what the config says of the
model's class and quantisation.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fi_cache.errors import Refused, read_regular

MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; anything bigger is the wrong file


def hub_cache(environ: Mapping[str, str]) -> Path:
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    home = environ.get("HF_HOME") or os.path.join(environ.get("HOME", "~"), ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def config_file(model: str, environ: Mapping[str, str]) -> Path | None:
    """The config.json `model` (a dir or an `ORG/NAME` id) names here, or None."""
    local = Path(model).expanduser()
    if local.is_dir():
        found = local / "config.json"
        return found if found.is_file() else None
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    repo = hub_cache(environ) / ("models--" + model.replace("/", "--"))
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        revision = ""
    snapshots = [repo / "snapshots" / revision] if revision else []
    with contextlib.suppress(OSError):  # no refs/main (an offline copy): the newest snapshot
        snapshots += sorted(
            (repo / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True
        )
    return next((s / "config.json" for s in snapshots if (s / "config.json").is_file()), None)


def config_bytes(model: str, environ: Mapping[str, str]) -> bytes | None:
    path = config_file(model, environ)
    if path is None:
        return None
    try:  # a FIFO or /dev/zero planted as config.json never makes this wait or read forever
        return read_regular(path, "config.json", MAX_CONFIG_BYTES)
    except Refused:
        return None


def read_config(model: str, environ: Mapping[str, str]) -> dict[str, Any] | None:
    data = config_bytes(model, environ)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def same_model(a: str, b: str, environ: Mapping[str, str]) -> bool:
    """The same model argument, or two whose config.json are byte for byte equal (an HF id and
    its local snapshot): tactics depend on shapes, dtypes and quantisation, all in the config."""
    if a == b:
        return True
    first = config_bytes(a, environ)
    return first is not None and first == config_bytes(b, environ)
