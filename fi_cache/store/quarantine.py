"""Moving a bad cache aside (doctor --fix): never deleted, always with a note of why."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from fi_cache.errors import Refused
from fi_cache.store.files import atomic_write, ensure_dir


def move_aside(path: Path, quarantine_dir: Path, note: str) -> Path:
    """Move a file or dir into `quarantine_dir` (never delete), with a `.why` note beside it."""
    ensure_dir(quarantine_dir)
    # Every vLLM cache is called autotune_configs.json: prefix a hash of where it came from.
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    dest = quarantine_dir / f"{tag}-{path.name}"
    n = 1
    while os.path.lexists(dest):
        n += 1
        dest = quarantine_dir / f"{tag}-{n}-{path.name}"
    try:
        shutil.move(str(path), str(dest))
    except OSError as exc:
        raise Refused(f"cannot move into quarantine: {exc.strerror}", path) from None
    atomic_write(dest.with_name(dest.name + ".why"), f"{path}\n{note}\n".encode(), lock=False)
    return dest
