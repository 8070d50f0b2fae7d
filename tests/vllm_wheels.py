"""vLLM 0.33.0/0.34.0's and FlashInfer 0.7.4's own code, read from their wheels at test time.

No CPU build of vLLM exists after 0.32 and `pip install vllm==0.34.0` cannot resolve (it pins
flashinfer-python 0.7.3, which the index lacks), so scripts/test.sh downloads the wheels with
--no-deps into .cache/vllm-wheels and .cache/flashinfer-wheels; tests read a module's text with
`module_text`, or unpack the pure-Python part once with `unpacked` and import single modules from it
with stand-ins for what they import (nothing of vLLM's is copied into this repository).
"""

from __future__ import annotations

import os
import zipfile
from functools import cache
from pathlib import Path

import pytest

_CACHE = Path(__file__).parent.parent / ".cache"
VLLM_WHEELS = Path(os.environ.get("FI_CACHE_VLLM_WHEELS", _CACHE / "vllm-wheels"))
FLASHINFER_WHEELS = Path(os.environ.get("FI_CACHE_FLASHINFER_WHEELS", _CACHE / "flashinfer-wheels"))
RELEASES = ("0.33.0", "0.34.0")


class NoWheel(LookupError):
    """The wheel of that version is not there (scripts/test.sh downloads it)."""


def _wheel(folder: Path, dist: str, version: str) -> Path:
    wheel = next(iter(sorted(folder.glob(f"{dist}-{version}-*.whl"))), None)
    if wheel is None:
        raise NoWheel(f"no {dist} {version} wheel in {folder} (scripts/test.sh downloads it)")
    return wheel


def vllm_wheel(version: str) -> Path:
    return _wheel(VLLM_WHEELS, "vllm", version)


def flashinfer_wheel(version: str = "0.7.4") -> Path:
    return _wheel(FLASHINFER_WHEELS, "flashinfer_python", version)


@cache
def module_text(version: str, module: str) -> str:
    """The text of vLLM `version`'s file `module` (e.g. "vllm/engine/arg_utils.py")."""
    with zipfile.ZipFile(vllm_wheel(version)) as z:
        return z.read(module).decode()


@cache
def flashinfer_text(module: str, version: str = "0.7.4") -> str:
    """The text of FlashInfer `version`'s file `module` (e.g. "flashinfer/fused_moe/core.py")."""
    with zipfile.ZipFile(flashinfer_wheel(version)) as z:
        return z.read(module).decode()


@cache
def unpacked(version: str) -> Path:
    """vLLM `version`'s Python files (no compiled extensions) unpacked once under .cache."""
    dest = _CACHE / f"vllm-src-{version}"
    done = dest / ".unpacked"
    if not done.exists():
        with zipfile.ZipFile(vllm_wheel(version)) as z:
            for name in z.namelist():
                if name.endswith(".py"):
                    z.extract(name, dest)
        done.touch()
    return dest


def need(version: str) -> None:
    """Skip the calling test, in one line, when vLLM `version`'s wheel is not there."""
    try:
        vllm_wheel(version)
    except NoWheel as e:
        if os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
            raise
        pytest.skip(str(e))
