"""`pip download` for the GPU machine, run here where PyPI is reachable (it has no network): binary
wheels only, no deps, for its Python (CPython 3.12) on the platforms given. The payload builders
(fi07_h200/payload.py, vllm_h200/payload.py) put this folder on sys.path to import it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def pip_download(dest: Path, specs: Sequence[str], platforms: Sequence[str]) -> None:
    """The wheel of each requirement in `specs`, into `dest`."""
    plat = [a for p in platforms for a in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *plat,
        "-d",
        str(dest),
        *specs,
    ]
    subprocess.run(cmd, check=True)
