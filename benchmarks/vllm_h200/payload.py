"""Build the wheel payload for run.sh (issue 22) where PyPI is reachable, and check it.

    python3 payload.py build OUT [PART_MIB]   # download, repack vLLM, check, tar.xz, split
    python3 payload.py check WHEEL_DIR        # every Requires-Dist met by the image or the payload

The tar's first members are EARLY (FlashInfer and tvm-ffi, ~19 MB of zip): they lie wholly in
part1, so the first device call can take them out of part1 alone (run.sh early) and start the
~6-minute build of fused_moe_90 while the other parts travel.

The GPU machine has no network; its image (KINDS.md's package list) lacks most of vLLM's serving
deps. WHEELS are what `vllm serve` of a bf16 Qwen3-MoE with dummy weights imports there, found by
importing vLLM's serve path, engine, worker, model and MoE modules on CPU (a stub libcuda and a
CUDA platform faked in-process; nothing else was missing). vLLM's other requirements are imported
lazily on paths this run does not take (ray, mistral_common, compressed_tensors, cutlass-dsl, ...).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/
from pip_download import pip_download

WHEELS = [
    "vllm==0.26.0",
    "flashinfer-python==0.6.17",
    "apache-tvm-ffi==0.1.15.post2",
    "nvidia-cudnn-frontend==1.32.0",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "typing-inspection==0.4.5",
    "annotated-types==0.8.0",
    "uvicorn==0.55.0",
    "openai==2.36.0",
    "jiter==0.19.0",
    "distro==1.9.0",
    "sniffio==1.3.1",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
    "blake3==1.0.11",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "ijson==3.6.0",
    "pybase64==1.5.1",
    "setproctitle==1.3.8",
    "watchfiles==1.3.0",
    "python-multipart==0.0.34",
    "python-json-logger==4.2.0",
    "partial-json-parser==0.2.1.1.post7",
    "prometheus-fastapi-instrumentator==8.1.0",
    "openai-harmony==0.0.8",
    "llguidance==1.7.6",
    "xgrammar==0.2.9",
    "model-hosting-container-standards==0.1.16",
    "jmespath==1.1.0",
    "supervisor==4.3.0",
    "platformdirs==4.14.9",
]
# What the trimmed build imports (with the image's torch): the tar's first members.
EARLY = ["flashinfer-python", "apache-tvm-ffi"]
# openai 3.x needs httpx2 (not on the image); 2.36 uses httpx. platformdirs is fi-cache's own dep.
REMOVED = [  # files of the vLLM wheel left out (never loaded by this run; see README.md)
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # FA2, 305 MB; SM90 imports FA3 (kept), runs Triton
    *(f"vllm/third_party/deep_gemm/_C.cpython-3{v}-x86_64-linux-gnu.so" for v in (10, 11, 13, 14)),
]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 27, 28, 31, 34, 35)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# The image's Python is 3.12.3 on x86-64 Linux: requirement markers are judged for it.
MARKERS = {str(k): str(v) for k, v in default_environment().items()}
MARKERS.update(
    python_version="3.12",
    python_full_version="3.12.3",
    platform_machine="x86_64",
    sys_platform="linux",
    platform_system="Linux",
    implementation_name="cpython",
    platform_python_implementation="CPython",
)
KINDS = Path("/work/.library/device/KINDS.md")
IMAGE_VERSIONS = {  # the few versions KINDS.md gives (a 'pip list' row); others are names only
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "tokenizers": "0.23.2",
    "numpy": "2.5.2",
    "triton": "3.6.0",
    "huggingface-hub": "1.33.0",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "torchaudio": "2.11.0",
    "torchvision": "0.26.0",
}


def image_names() -> set[str]:
    text = KINDS.read_text()
    line = text[text.index("## Python packages already there") :].split("Packages: ", 1)[1]
    return {canonicalize_name(n) for n in line.split("\n", 1)[0].rstrip(".").split(", ")}


def download(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    pip_download(dest, WHEELS, PLATFORMS)


def repack_vllm(src: Path, dest: Path) -> dict[str, int]:
    """The vLLM wheel without REMOVED (RECORD rows too), stored uncompressed: xz packs it better."""
    removed: dict[str, int] = {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename in REMOVED:
                removed[info.filename] = info.file_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = csv.reader(io.StringIO(data.decode()))
                rows = [r for r in rows if r and r[0] not in REMOVED]  # type: ignore[assignment]
                out = io.StringIO()
                csv.writer(out, lineterminator="\n").writerows(rows)
                data = out.getvalue().encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_STORED)
    assert sorted(removed) == sorted(REMOVED), sorted(set(REMOVED) - set(removed))
    return removed


def metadata(whl: Path) -> tuple[str, str, list[Requirement]]:
    name, version, _, _ = parse_wheel_filename(whl.name)
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    dist = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    reqs = [Requirement(r) for r in dist]
    reqs = [r for r in reqs if r.marker is None or r.marker.evaluate({**MARKERS, "extra": ""})]
    return canonicalize_name(name), str(version), reqs


def check(wheel_dir: Path) -> list[str]:
    """Unmet requirements of the payload's wheels (non-extra), judged against image + payload."""
    have = {n: v for n, v, _ in (metadata(w) for w in sorted(wheel_dir.glob("*.whl")))}
    image = image_names()
    report = []
    for whl in sorted(wheel_dir.glob("*.whl")):
        name, version, reqs = metadata(whl)
        for r in reqs:
            dep = canonicalize_name(r.name)
            if dep in have:
                ok = r.specifier.contains(have[dep], prereleases=True)
                where = f"payload {have[dep]}"
            elif dep in image:
                known = IMAGE_VERSIONS.get(dep)
                ok = known is None or r.specifier.contains(known, prereleases=True)
                where = f"image {known or '(version not listed)'}"
            else:
                ok, where = False, "missing"
            if not ok:
                report.append(f"{name} {version}: {r} -> {where}")
    return report


def _early(whl: Path) -> int | None:
    """The wheel's place in EARLY, or None."""
    name = canonicalize_name(parse_wheel_filename(whl.name)[0])
    return EARLY.index(name) if name in EARLY else None


def build(out: Path, part_mib: int) -> None:
    dl, wheels = out / "download", out / "wheels"
    download(dl)
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    removed: dict[str, int] = {}
    for whl in sorted(dl.glob("*.whl")):
        if whl.name.startswith("vllm-"):
            removed = repack_vllm(whl, wheels / whl.name)
        else:
            (wheels / whl.name).write_bytes(whl.read_bytes())
    names = {parse_wheel_filename(w.name)[0] for w in wheels.glob("*.whl")}
    assert len(names) == len(WHEELS), "one wheel per requirement (two versions stop the install)"
    unmet = check(wheels)
    tarball = out / "payload.tar.xz"
    order = sorted(wheels.glob("*.whl"), key=lambda w: (_early(w) is None, _early(w) or 0, w.name))
    members = [f"wheels/{w.name}" for w in order]
    early = [m for w, m in zip(order, members, strict=True) if _early(w) is not None]
    early_bytes = sum((out / m).stat().st_size for m in early)
    assert len(early) == len(EARLY) and early_bytes + (1 << 20) < part_mib << 20, early
    with open(tarball, "wb") as f:  # xz -T0: the wheels hold ~480 MB, mostly CUDA fatbins
        tar = subprocess.Popen(["tar", "cf", "-", "-C", str(out), *members], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-6", "-c"], stdin=tar.stdout, stdout=f, check=True)
        assert tar.wait() == 0
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    for old in out.glob("part[0-9]*"):
        old.unlink()
    data, size, parts = tarball.read_bytes(), part_mib << 20, []
    for i in range(0, len(data), size):
        part = out / f"part{i // size + 1}"
        part.write_bytes(data[i : i + size])
        parts.append(
            {
                "path": part.name,
                "bytes": part.stat().st_size,
                "sha256": hashlib.sha256(part.read_bytes()).hexdigest(),
            }
        )
    tarball.unlink()  # the parts are the payload; the folder is git-ignored
    manifest = {
        "sha256": digest,
        "bytes": len(data),
        "parts": parts,
        "early": early,
        "wheels": {w.name: w.stat().st_size for w in sorted(wheels.glob("*.whl"))},
        "removed_from_vllm_wheel": removed,
        "unmet_requirements": unmet,
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "payload.sha256").write_text(f"{digest}  payload.tar.xz\n")
    print(json.dumps({k: manifest[k] for k in ("sha256", "bytes", "parts", "early")}, indent=1))
    print(f"{len(unmet)} requirements not met by image or payload (see MANIFEST.json)")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "build":
        build(Path(sys.argv[2]).resolve(), int(sys.argv[3]) if len(sys.argv) > 3 else 58)
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        print("\n".join(check(Path(sys.argv[2]))) or "all met")
    else:
        sys.exit(__doc__)
