"""Where SGLang keeps things when fi-cache is not in charge: its cache dir as SGLang reads it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fi_cache.versions import (
    SGLANG_AUTOTUNE_SUBDIR,
    SGLANG_CACHE_DIR_DEFAULT,
    SGLANG_CACHE_DIR_ENV,
    SGLANG_LEGACY_PREFIX,
)


def legacy_name(name: str) -> str:
    """SGLANG_X's legacy twin, SGL_X."""
    legacy, new = SGLANG_LEGACY_PREFIX
    return legacy + name.removeprefix(new)


def effective(environ: Mapping[str, str], name: str) -> str | None:
    """The value SGLang sees for SGLANG_X: its legacy twin SGL_X when set, which SGLang copies
    over it at import (versions.SGLANG_LEGACY_PREFIX), else SGLANG_X itself."""
    twin = legacy_name(name)
    return environ[twin] if twin in environ else environ.get(name)


def user_cache_dir(environ: Mapping[str, str]) -> str:
    """The user's SGLANG_CACHE_DIR as SGLang's derived defaults read it (expanduser: environ.py
    0.5.23:31-37), with the HOME of `environ` (the one SGLang will see)."""
    path = effective(environ, SGLANG_CACHE_DIR_ENV) or SGLANG_CACHE_DIR_DEFAULT
    home = environ.get("HOME")
    if home and (path == "~" or path.startswith("~/")):
        return home + path[1:]
    return os.path.expanduser(path)


def autotune_root(environ: Mapping[str, str]) -> Path:
    """`$SGLANG_CACHE_DIR/flashinfer/autotune`: a set value as given, as flashinfer_autotune.py
    0.5.23:190 joins it (no `~` expansion); the default expanded at import."""
    value = effective(environ, SGLANG_CACHE_DIR_ENV)
    base = Path(value) if value is not None else Path(user_cache_dir(environ))
    return base.joinpath(*SGLANG_AUTOTUNE_SUBDIR)
