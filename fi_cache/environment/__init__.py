"""The running environment's fingerprint, read without importing torch, flashinfer or vllm.

Cheap probes (domain.md §8, all measured to match FlashInfer's own values on an H200):
nvidia-smi for the GPU, `torch/version.py` as text for CUDA, dist versions of the NVIDIA
wheels for cuBLAS/cuDNN/cudnn-frontend. On a GPU host with FlashInfer installed, FlashInfer's
own `_collect_metadata()` runs once in a child process (5-7 s, 670 MB) and its answer is
cached in the store, keyed by everything that could change it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from fi_cache.environment.dists import _CUBLAS_DISTS, _CUDNN_DISTS, _FRONTEND_DISTS, _VLLM_DISTS
from fi_cache.environment.dists import Dists as Dists  # re-exported, as are the three below
from fi_cache.environment.dists import dists_here as dists_here
from fi_cache.environment.dists import dists_of as dists_of
from fi_cache.environment.dists import interpreter_id as interpreter_id
from fi_cache.environment.gpus import Gpu as Gpu  # re-exported, as are the three below
from fi_cache.environment.gpus import parse_nvidia_smi as parse_nvidia_smi
from fi_cache.environment.gpus import query_gpus as query_gpus
from fi_cache.environment.gpus import visible as visible
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.versions import (
    FLASHINFER_NOT_ON_PYPI,
    INDETERMINATE_VALUES,
    METADATA_FIELDS_07,
    VLLM_FINALIZE_ENV,
    vllm_arch,
)

_PROBE_TIMEOUT_S = 120
_MAX_PROBE_RECORD = 1 << 20  # FlashInfer's _metadata is under 1 KB of JSON


@dataclass(frozen=True)
class VllmInfo:
    version: str | None
    envs_path: str | None
    supports_finalize_env: bool | None  # None: no vllm/envs.py to read
    flashinfer_pin: str | None = None  # its METADATA's `flashinfer-python==X`, X

    @property
    def site(self) -> str | None:
        """The directory vLLM is installed in (site-packages, a --target dir)."""
        return os.path.dirname(os.path.dirname(self.envs_path)) if self.envs_path else None


@dataclass(frozen=True)
class Environment:
    fingerprint: Fingerprint
    gpus: tuple[Gpu, ...]
    vllm: VllmInfo
    torch_version: str | None
    # field -> where its value came from ("flashinfer", "nvidia-smi", "dist nvidia-cublas", ...)
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    python: str = sys.executable  # the interpreter whose packages these are
    sglang_version: str | None = None  # the sglang dist of that interpreter
    probe_failed: str | None = None  # FlashInfer's metadata probe failed (now or remembered)


# --- pure parsers -------------------------------------------------------------------------------


def torch_cuda_from_version_py(text: str) -> str | None:
    """`torch.version.cuda` from the text of torch/version.py (None for a CPU build)."""
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return m.group(1) if m else None


def cublas_from_dist(version: str) -> str:
    """nvidia-cublas 13.1.0.3 -> "13.1.0" (FlashInfer records major.minor.patch)."""
    return ".".join(version.split(".")[:3])


def cudnn_from_dist(version: str) -> str | None:
    """nvidia-cudnn-cu13 9.19.0.56 -> "91900", as torch.backends.cudnn.version() reports."""
    parts = version.split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        return None
    major, minor, patch = (int(p) for p in parts[:3])
    scale = 10000 if major >= 9 else 1000  # cuDNN 9 changed CUDNN_VERSION's encoding
    return str(major * scale + minor * 100 + patch)


def envs_mentions_finalize(text: str) -> bool:
    return VLLM_FINALIZE_ENV in text


_PIN = re.compile(r"^flashinfer(?:[-_]python)?\s*==\s*([^\s;,]+)\s*$")


def vllm_info(dists: Dists) -> VllmInfo:
    found = dists.version(_VLLM_DISTS)
    envs = dists.file(found[0], "vllm/envs.py") if found else None
    supports = None if envs is None else envs_mentions_finalize(envs[1])
    requires = dists.requires.get(found[0], ()) if found else ()
    pins = [m.group(1) for r in requires if (m := _PIN.match(r))]
    return VllmInfo(
        found[1] if found else None, envs[0] if envs else None, supports, pins[0] if pins else None
    )


def flashinfer_pin_note(vllm: VllmInfo, flashinfer: str | None) -> str | None:
    """vLLM's exact FlashInfer pin against the FlashInfer it will import (the one installed
    beside it): 0.34 pins 0.7.3, which PyPI lacks, so every 0.34 install runs another."""
    pin = vllm.flashinfer_pin
    if pin is None or pin == flashinfer:
        return None
    lacking = (
        f" (PyPI has no {pin}: `pip install vllm=={vllm.version}` cannot resolve, so vLLM was "
        "installed --no-deps)"
        if pin in FLASHINFER_NOT_ON_PYPI
        else ""
    )
    using = f"FlashInfer {flashinfer}" if flashinfer else "no FlashInfer (it tunes nothing)"
    return (
        f"vLLM {vllm.version} pins flashinfer-python=={pin}{lacking}; it imports what is "
        f"installed beside it: {using}, whose version names the cache and its _metadata"
    )


def nvcc_cuda_version(environ: dict[str, str]) -> str | None:
    """The CUDA version FlashInfer reads first, nvcc's (jit/cpp_ext.py 0.7.2.post1 :48-87:
    $CUDA_HOME, $CUDA_PATH, `which nvcc`, /usr/local/cuda); None: FlashInfer uses torch's."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home is None:
        found = shutil.which("nvcc", path=environ.get("PATH"))
        home = str(Path(found).parent.parent) if found else "/usr/local/cuda"
    try:
        out = subprocess.run(
            [os.path.join(home, "bin", "nvcc"), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+),", out.stdout)
    return m.group(1) if m else None


def probe(dists: Dists | None = None, state_dir: Path | None = None) -> Environment:
    """Everything detectable cheaply (well under a second, no heavy imports); the packages as
    `dists` lists them (default: this interpreter's); nvidia-smi's answer kept under
    `state_dir` while the driver shows the same GPUs (gpus.py)."""
    dists = dists or dists_here()
    sources: dict[str, str] = {}
    values: dict[str, str | None] = {}
    where = "" if dists.python == sys.executable else f" in {dists.python}"

    def take(name: str, value: str | None, source: str) -> None:
        values[name] = value
        if value is not None:
            sources[name] = source + where

    fi = dists.version(("flashinfer-python", "flashinfer"))
    take("flashinfer_version", fi[1] if fi else None, f"dist {fi[0]}" if fi else "")
    torch_version = dists.version(("torch",))
    version_py = dists.file("torch", "torch/version.py")
    take(
        "cuda_version",
        torch_cuda_from_version_py(version_py[1]) if version_py else None,
        "torch/version.py",
    )
    if (d := dists.version(_CUBLAS_DISTS)) is not None:
        take("cublas_version", cublas_from_dist(d[1]), f"dist {d[0]}")
    if (d := dists.version(_CUDNN_DISTS)) is not None:
        take("cudnn_version", cudnn_from_dist(d[1]), f"dist {d[0]}")
    if (d := dists.version(_FRONTEND_DISTS)) is not None:
        take("cudnn_frontend_version", d[1], f"dist {d[0]}")
    gpus = visible(query_gpus(state_dir), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if gpus:
        take("gpu", gpus[0].name, "nvidia-smi")  # FlashInfer records the current (first) device
        arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
        caps = [g.compute_cap for g in gpus]
        cuda = values.get("cuda_version")
        if any(c.startswith("12.") for c in caps):  # only SM12x names depend on the CUDA version
            cuda = nvcc_cuda_version(dict(os.environ)) or cuda
        arch = vllm_arch(caps, cuda, arch_list)
        take("arch", arch, "FLASHINFER_CUDA_ARCH_LIST" if arch_list else "nvidia-smi")
    fingerprint = Fingerprint(**{k: v for k, v in values.items() if v is not None})
    vllm = vllm_info(dists)
    pinned = flashinfer_pin_note(vllm, fingerprint.flashinfer_version)
    return Environment(
        fingerprint,
        tuple(gpus),
        vllm,
        torch_version[1] if torch_version else None,
        sources,
        notes=(pinned,) if pinned else (),
        python=dists.python,
        sglang_version=dists.versions.get("sglang"),
    )


# --- FlashInfer's own answer, in a child process -----------------------------------------------

_CHILD = """
import importlib, json
for name in ("flashinfer.autotuner.autotuner", "flashinfer.autotuner"):
    try:
        mod = importlib.import_module(name)
    except ImportError:
        continue
    if hasattr(mod, "_collect_metadata"):
        print(json.dumps(mod._collect_metadata()))
        break
else:
    raise SystemExit("this FlashInfer has no _collect_metadata (needs 0.6.15 or newer)")
"""


def probe_key(env: Environment) -> str:
    """Everything that can change FlashInfer's answer; a new key means probe again."""
    parts = [
        interpreter_id(env.python),  # `python -m fi_cache` and the console script: one answer
        json.dumps(env.fingerprint.metadata(), sort_keys=True),
        env.torch_version or "",
        os.environ.get("LD_LIBRARY_PATH", ""),
        os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        ",".join(g.uuid for g in env.gpus),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def run_flashinfer_probe(
    timeout: float = _PROBE_TIMEOUT_S, python: str | None = None
) -> dict[str, str]:
    """FlashInfer's `_collect_metadata()` from a child of `python` (default: this interpreter).
    Raises RuntimeError on failure."""
    python = python or sys.executable
    try:
        out = subprocess.run(
            [python, "-c", _CHILD],
            capture_output=True,
            text=True,
            errors="replace",  # a child printing bytes that are not UTF-8 is no traceback
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"FlashInfer's metadata probe took over {timeout:.0f}s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot run {python}: {exc.strerror}") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"FlashInfer's metadata probe failed: {last}")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise RuntimeError("FlashInfer's metadata probe printed something other than its answer")
    return {k: str(v) for k, v in data.items()}


def with_flashinfer_metadata(env: Environment, meta: dict[str, str]) -> Environment:
    """The cheap probe's environment, with FlashInfer's own `_metadata` values on top."""
    changes = {
        k: (None if v in INDETERMINATE_VALUES else v)
        for k, v in meta.items()
        if k in METADATA_FIELDS_07
    }
    sources = dict(env.sources)
    sources.update({k: "flashinfer" for k, v in changes.items() if v is not None})
    return replace(env, fingerprint=env.fingerprint.replace(**changes), sources=sources)


def detect(
    state_dir: Path | None,
    *,
    exact: bool | None = None,
    refresh: bool = False,
    python: str | None = None,
) -> Environment:
    """The environment, as exactly as this machine allows, for the packages of `python` (the
    interpreter that runs vLLM; default: fi-cache's own).

    exact=None: ask FlashInfer itself when it is installed and a GPU is visible (its answer is
    cached under `state_dir`); exact=False: cheap probe only; exact=True: ask FlashInfer even
    without a GPU.
    """
    notes: tuple[str, ...] = ()
    dists = None
    if python is not None:
        try:
            dists = dists_of(python, state_dir=state_dir)
        except RuntimeError as exc:
            notes = (f"{exc}; using fi-cache's own packages",)
    env = probe(dists, state_dir)
    if notes:
        env = replace(env, notes=(*env.notes, *notes))
    wanted = exact if exact is not None else bool(env.gpus and env.fingerprint.flashinfer_version)
    if not wanted or env.fingerprint.flashinfer_version is None:
        return env
    cache = state_dir / f"env-{probe_key(env)}.json" if state_dir else None
    if cache is not None and not refresh:
        from fi_cache.errors import Refused, read_regular

        try:  # a FIFO or device planted there is refused at once, never waited on
            cached = json.loads(read_regular(cache, "probe record", _MAX_PROBE_RECORD))
            if isinstance(cached, dict):
                return with_flashinfer_metadata(env, {k: str(v) for k, v in cached.items()})
        except Refused as exc:
            if os.path.lexists(cache):  # there but no file to read: say so, ask FlashInfer again
                note = f"{exc}; asked FlashInfer again (remove it to keep the answer)"
                env = replace(env, notes=(*env.notes, note))
        except (ValueError, RecursionError):
            pass  # not ours: ask FlashInfer again
    failed = cache.with_name(cache.stem + ".failed") if cache is not None else None
    if failed is not None and not refresh and (said := _remembered_failure(failed)) is not None:
        return replace(env, probe_failed=said)  # said once, when it failed: not on every command
    try:
        meta = run_flashinfer_probe(python=env.python)
    except RuntimeError as exc:
        if failed is not None:
            _remember_failure(failed, str(exc))
        return replace(
            env, notes=(*env.notes, f"{exc}; using the cheap probe's values"), probe_failed=str(exc)
        )
    if cache is not None:
        from fi_cache.errors import FiCacheError
        from fi_cache.store import files

        # A read-only store only costs the probe again next time.
        with contextlib.suppress(FiCacheError, OSError):
            files.atomic_write(cache, json.dumps(meta, indent=2).encode())
    return with_flashinfer_metadata(env, meta)


# A failed probe (no driver, a GPU in use, a broken FlashInfer) is asked again after this long,
# or at once with `fi-cache env --refresh`; until then commands use the cheap probe quietly.
_FAILURE_KEPT_S = 3600


def _remembered_failure(record: Path) -> str | None:
    """The failure kept at `record` while it is recent, else None (ask FlashInfer again)."""
    from fi_cache.errors import Refused, read_regular

    try:
        data = json.loads(read_regular(record, "probe record", _MAX_PROBE_RECORD))
    except (Refused, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("error"), str):
        return None
    at = data.get("at")
    if not isinstance(at, (int, float)) or not 0 <= time.time() - at < _FAILURE_KEPT_S:
        return None
    sys.audit("fi_cache.expires", at + _FAILURE_KEPT_S)  # serve's memo holds no longer than it
    return str(data["error"])


def _remember_failure(record: Path, error: str) -> None:
    from fi_cache.errors import FiCacheError
    from fi_cache.store import files

    with contextlib.suppress(FiCacheError, OSError):  # a read-only store: asked again next time
        files.atomic_write(record, json.dumps({"error": error, "at": time.time()}).encode())
