"""The GPUs this machine has, as nvidia-smi lists them, and the answer kept while the driver shows
the same GPUs: nvidia-smi costs tens of milliseconds to seconds at every command (it initialises
NVML), and a child process is what serve's memo cannot replay (lifecycle/serve_memo/).

The kept answer is keyed by what the driver itself shows in /proc/driver/nvidia (each GPU's
model, UUID and bus location; the driver's version), this boot, and the nvidia-smi that answered:
the index, UUID, name and compute capability of a GPU do not change while those do not. Where
/proc shows no driver (a CUDA-less host, a fake nvidia-smi in a test), nvidia-smi runs each time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

NVIDIA_PROC = "/proc/driver/nvidia"
_QUERY = ("--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader")
_MAX_ANSWER = 1 << 20


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str  # "9.0"
    uuid: str = ""


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit() or "\ufffd" in line:
            continue  # a name that was not UTF-8 is not the one FlashInfer records
        gpus.append(Gpu(int(parts[0]), parts[2], parts[3], parts[1]))
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs a CUDA process sees, in its order (CUDA_VISIBLE_DEVICES: indices or UUIDs)."""
    if cuda_visible_devices is None:
        return gpus
    chosen = []
    for item in (s.strip() for s in cuda_visible_devices.split(",")):
        if not item:
            break
        match = [g for g in gpus if str(g.index) == item or (g.uuid and g.uuid.startswith(item))]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen.append(match[0])
    return chosen


def driver_key(smi: str, proc: str = NVIDIA_PROC) -> str | None:
    """What names this machine's nvidia-smi answer, or None where the driver shows nothing."""
    try:
        gpu_dirs = sorted(os.listdir(os.path.join(proc, "gpus")))
        parts = [_read(os.path.join(proc, "version"))]
        parts += [_read(os.path.join(proc, "gpus", d, "information")) for d in gpu_dirs]
        parts.append(_read("/proc/sys/kernel/random/boot_id"))
        st = os.stat(smi)
    except OSError:
        return None
    if not gpu_dirs:
        return None
    parts.append(f"{os.path.realpath(smi)} {st.st_mtime_ns} {st.st_size} {st.st_ino}")
    return hashlib.sha256("\0".join(parts).encode(errors="surrogateescape")).hexdigest()[:20]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read(1 << 16)


def query_gpus(state_dir: Path | None = None, proc: str = NVIDIA_PROC) -> list[Gpu]:
    """nvidia-smi's GPUs (none where it is missing or fails), kept under `state_dir` while the
    driver shows the same GPUs."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []  # no child to start (and none for serve's memo to refuse: its PATH is stamped)
    key = driver_key(smi, proc) if state_dir is not None else None
    kept = state_dir / f"gpus-{key}.txt" if state_dir is not None and key else None
    if kept is not None and (text := _kept(kept)) is not None:
        return parse_nvidia_smi(text)
    try:
        out = subprocess.run(
            [smi, *_QUERY],
            capture_output=True,
            text=True,
            errors="replace",  # a tool printing bytes that are not UTF-8 is no traceback
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    gpus = parse_nvidia_smi(out.stdout)
    if kept is not None and gpus:
        from fi_cache.errors import FiCacheError
        from fi_cache.store import files

        with contextlib.suppress(FiCacheError, OSError):  # a read-only store: asked again
            files.atomic_write(kept, out.stdout.encode())
    return gpus


def _kept(path: Path) -> str | None:
    from fi_cache.errors import Refused, read_regular

    try:  # a FIFO or device planted there is refused at once, never waited on
        return read_regular(path, "GPU list", _MAX_ANSWER).decode("utf-8", errors="replace")
    except (Refused, OSError):
        return None
