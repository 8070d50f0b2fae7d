"""Build the payload run.sh installs on the GPU machine (no network there), where PyPI is reachable.

    python3 benchmarks/fi07_h200/payload.py build .fi07   # .fi07/payload.tar.xz + MANIFEST.json

FlashInfer 0.7.2.post1's wheel is 62 MB (deflate) and would not fit one 64 MiB call beside the
checkout; unpacked and packed with xz it is 16 MB. So both FlashInfer wheels travel unpacked (a pure
Python wheel unpacked into a --target dir is what pip installs there, bin/ scripts aside) and the
three binary or missing deps as wheels. The image already has torch 2.11, click, filelock, einops,
ninja, numpy, packaging, requests, tabulate, tqdm, nvidia-ml-py and cuDNN (KINDS.md); FlashInfer's
cuda-python, cuda-tile, nccl4py and nvidia-cutlass-dsl are imported lazily on paths the GEMM plan
does not take (the 0.6.18 device runs of docs/benchmarks.md ran without them too).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/
from pip_download import pip_download

FLASHINFER = ["0.7.2.post1", "0.6.18"]  # vLLM 0.33's pin; the version of the 22-bucket restart
WHEELS = ["apache-tvm-ffi==0.1.15.post2", "nvidia-cudnn-frontend==1.32.0", "platformdirs==4.14.9"]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def download(dest: Path, spec: str) -> None:
    """One requirement at a time: pip refuses two FlashInfer versions in one resolve."""
    pip_download(dest, [spec], PLATFORMS)


def build(out: Path) -> None:
    dl, stage = out / "download", out / "stage"
    dl.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "wheels").mkdir(parents=True)
    for spec in [f"flashinfer-python=={v}" for v in FLASHINFER] + WHEELS:
        download(dl, spec)
    for v in FLASHINFER:
        (whl,) = dl.glob(f"flashinfer_python-{v}-*.whl")
        with zipfile.ZipFile(whl) as z:
            z.extractall(stage / f"flashinfer-{v}")
    for spec in WHEELS:
        name, version = spec.split("==")
        (whl,) = dl.glob(f"{name.replace('-', '_')}-{version}-*.whl")
        shutil.copy(whl, stage / "wheels" / whl.name)
    tarball = out / "payload.tar.xz"
    with open(tarball, "wb") as f:  # xz: FlashInfer's CUDA sources pack 4x better than deflate
        tar = subprocess.Popen(["tar", "cf", "-", "-C", str(stage), "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9", "-c"], stdin=tar.stdout, stdout=f, check=True)
        assert tar.wait() == 0
    shutil.rmtree(stage)
    manifest = {
        "sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
        "bytes": tarball.stat().st_size,
        "flashinfer": FLASHINFER,
        "wheels": sorted(p.name for p in dl.glob("*.whl") if not p.name.startswith("flashinfer")),
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(Path(sys.argv[2]).resolve())
    else:
        sys.exit(__doc__)
