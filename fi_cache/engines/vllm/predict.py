"""Where vLLM will keep its FlashInfer autotune cache for an argv, from vLLM's own code.

The answer comes from predict_child.py, run by the interpreter that runs vLLM (it imports vLLM
and builds the model on the meta device: seconds), and is cached under fi-cache's state dir,
keyed by everything that changes it: the interpreter, its vLLM, the argv, the content of the
files it names (a --config YAML, the model's config.json), and the environment variables vLLM,
FlashInfer, huggingface_hub and transformers read for the path and the hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused, read_regular

CHILD = Path(__file__).with_name("predict_child.py")
# What vLLM (envs.py) and FlashInfer (jit/env.py) read to place the file.
_PATH_ENV = (
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "HOME",
    "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "FLASHINFER_AUTOTUNE_CACHE_DIR",
)  # fmt: skip


@dataclass(frozen=True)
class CacheLocation:
    """The hash dir and file names vLLM will use (`dir` None: it keeps no cache there)."""

    vllm_version: str
    hash: str
    dir: str | None
    files: tuple[str, ...]
    root_from: str  # "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_CACHE_ROOT" or why there is none
    store: str = "v1"  # "v2": FlashInfer's v2 store at `dir` (vLLM 0.33, one rank), no files
    # Every node's rank files (`files` are this node's): MoE with dp > 1 folds DP into one
    # world group, so rank r of DP rank d is `dp{d}_rank{d * tp * pp + r}` on its own node.
    all_files: tuple[str, ...] = ()

    @property
    def paths(self) -> list[Path]:
        return [Path(self.dir) / f for f in self.files] if self.dir else []


# Variables outside VLLM_* that change vLLM's config hash: torch.compile off (compilation config)
# and where and how the HF config is read (huggingface_hub, transformers).
_HASH_ENV = ("TORCH_COMPILE_DISABLE",)
_HASH_ENV_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "HUGGINGFACE_")


def cache_key(python: str, vllm_version: str, argv: Sequence[str], env: Mapping[str, str]) -> str:
    parts = [os.path.abspath(python), vllm_version, json.dumps(list(argv)), os.getcwd()]
    parts += [f"{k}={env.get(k, '')}" for k in (*_PATH_ENV, *_HASH_ENV)]
    # vLLM 0.25-0.29 hash every registered VLLM_* variable into the dir (envs.py compute_hash):
    # an answer for VLLM_FLASHINFER_MOE_FUSED_FINALIZE=1 is not one for =0.
    parts += sorted(f"{k}={v}" for k, v in env.items() if k.startswith(_HASH_ENV_PREFIXES))
    parts += named_contents(argv, env)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def named_contents(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """A digest of what the arguments name and vLLM hashes by content: a file (`--config
    x.yaml`, a local config), a model dir's or an HF id's config.json (engines/hf.py)."""
    from fi_cache.engines import hf

    out = []
    for word in argv:
        value = word.partition("=")[2] if word.startswith("--") else word
        if not value or value.startswith("-"):
            continue
        data = None
        with contextlib.suppress(Refused):  # a FIFO or endless file named: not hashed
            if os.path.isfile(value):
                data = read_regular(value, "file named in the arguments", hf.MAX_CONFIG_BYTES)
        if data is None:
            data = hf.config_bytes(value, env)
        if data is not None:
            out.append(f"{value}:{hashlib.sha256(data).hexdigest()}")
    return out


def predict(
    python: str,
    vllm_version: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    state_dir: Path | None,
    timeout: float = 300.0,
) -> CacheLocation:
    """vLLM's own answer (cached). Raises Refused when vLLM rejects the argv, FiCacheError when
    the child fails or hangs."""
    key = cache_key(python, vllm_version, argv, env)
    cache = state_dir / f"vllm-cache-{key}.json" if state_dir else None
    if cache is not None:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            return _from_json(json.loads(cache.read_text()))
    answer = _ask(python, argv, env, timeout)
    if cache is not None:
        from fi_cache.store.files import atomic_write

        with contextlib.suppress(FiCacheError, OSError):  # a read-only store asks again next time
            atomic_write(cache, json.dumps(asdict(answer)).encode(), lock=False)
    return answer


def _from_json(data: dict[str, object]) -> CacheLocation:
    files, every = data["files"], data.get("all_files", data["files"])
    if not isinstance(files, list) or not isinstance(every, list):
        raise TypeError("files")
    return CacheLocation(
        str(data["vllm_version"]), str(data["hash"]),
        None if data["dir"] is None else str(data["dir"]),
        tuple(str(f) for f in files), str(data["root_from"]), str(data.get("store", "v1")),
        tuple(str(f) for f in every),
    )  # fmt: skip


def _ask(python: str, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CacheLocation:
    try:
        out = subprocess.run(
            [python, str(CHILD), json.dumps({"argv": list(argv)})],
            capture_output=True, text=True, timeout=timeout, env=dict(env), check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise FiCacheError(f"vLLM did not answer within {timeout:.0f}s", python) from None
    except OSError as exc:
        raise FiCacheError(f"cannot run: {exc.strerror}", python) from None
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        data = {"error": "failed", "message": "no answer"}
    if data.get("error") == "vllm-rejected-argv":
        said = [ln for ln in out.stderr.strip().splitlines() if "error:" in ln][-1:]
        raise Refused(f"vLLM rejects these arguments{': ' + said[0] if said else ''}")
    if "error" in data:
        raise FiCacheError(f"vLLM could not compute its cache location: {data.get('message')}")
    return _from_json(data)
