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
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fi_cache.errors import FiCacheError, Refused, read_regular
from fi_cache.versions import VLLM_IR_PROVIDER_FILES

CHILD = Path(__file__).with_name("predict_child.py")
# What vLLM (envs.py) and FlashInfer (jit/env.py) read to place the file.
_PATH_ENV = (
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
    "VLLM_CACHE_ROOT",
    "XDG_CACHE_HOME",
    "HOME",
    "FLASHINFER_WORKSPACE_BASE",
    "FLASHINFER_CUDA_ARCH_LIST",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "FLASHINFER_AUTOTUNE_CACHE_DIR",
)


SWEEP_NOT_REPORTED = "not reported (an answer from an earlier fi-cache)"


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
    # What vLLM's GPU worker resolves before it hashes (CUDA-graph sizes, an auto-fitted
    # --max-model-len): the answer holds only if it keeps them as the arguments set them.
    depends_on: tuple[str, ...] = ()
    # The largest token count of each pass of vLLM's tuning sweep for this config (None: not
    # known, `sweep_unknown` says why): what a seed must hold on 0.33+ (model/sweep.py).
    sweep_tokens: tuple[int, ...] | None = None
    sweep_unknown: str = SWEEP_NOT_REPORTED

    @property
    def paths(self) -> list[Path]:
        return [Path(self.dir) / f for f in self.files] if self.dir else []


# Variables outside VLLM_* that change vLLM's config hash: torch.compile off (compilation config)
# and where and how the HF config is read (huggingface_hub, transformers).
_HASH_ENV = ("TORCH_COMPILE_DISABLE",)
_HASH_ENV_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "HUGGINGFACE_")


def cache_key(
    python: str,
    vllm_version: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    site: str | None = None,
) -> str:
    """`site`: the directory vLLM is installed in; the releases installed beside it (transformers
    parses the HF config vLLM hashes; torch, FlashInfer) are part of the answer's identity."""
    parts = [os.path.abspath(python), vllm_version, json.dumps(list(argv)), os.getcwd()]
    parts += [f"{k}={env.get(k, '')}" for k in (*_PATH_ENV, *_HASH_ENV, "PYTHONPATH")]
    parts += installed(site)
    # vLLM 0.25-0.29 hash every registered VLLM_* variable into the dir (envs.py compute_hash):
    # an answer for VLLM_FLASHINFER_MOE_FUSED_FINALIZE=1 is not one for =0.
    parts += sorted(f"{k}={v}" for k, v in env.items() if k.startswith(_HASH_ENV_PREFIXES))
    parts += named_contents(argv, env)
    parts += hashed_sources(site)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


_SOURCE_LIMIT = 8 << 20  # a kernel's Python source; more is not one


def hashed_sources(site: str | None) -> list[str]:
    """A digest of each IR-op provider file vLLM hashes by its text (versions.
    VLLM_IR_PROVIDER_FILES): a patched kernel is another hash dir under the same dist-info."""
    if not site:
        return []
    out = []
    for rel in VLLM_IR_PROVIDER_FILES:
        try:
            data = read_regular(os.path.join(site, rel), "vLLM source file", _SOURCE_LIMIT)
        except (Refused, OSError):
            out.append(f"{rel}:absent")  # a release without it, or removed: not the same
        else:
            out.append(f"{rel}:{hashlib.sha256(data).hexdigest()}")
    return out


def installed(site: str | None) -> list[str]:
    """The distributions in `site` by name and version (their dist-info dirs: one listdir)."""
    if not site:
        return []
    with contextlib.suppress(OSError):
        return sorted(n for n in os.listdir(site) if n.endswith((".dist-info", ".egg-info")))
    return []


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


def cached(
    python: str,
    vllm_version: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    state_dir: Path | None,
    site: str | None = None,
) -> CacheLocation | None:
    """An earlier answer for exactly these inputs, without asking vLLM (None: none kept)."""
    if state_dir is None:
        return None
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return _lookup(_kept(state_dir, cache_key(python, vllm_version, argv, env, site)), env)
    return None


def _lookup(kept: Path, env: Mapping[str, str]) -> CacheLocation | None:
    """A saved answer, unless it names files outside the cache dir fi-cache gave vLLM (one
    planted in the store's state dir would have warm seed them anywhere): asked again then."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        found = _from_json(json.loads(kept.read_text()))
        root = env.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
        return found if _in_cache_dir(found, root) else None
    return None


def _in_cache_dir(found: CacheLocation, root: str | None) -> bool:
    from fi_cache.store.paths import Unconfined, relative_problem, within

    if any(relative_problem(f) or "/" in f for f in (*found.files, *found.all_files)):
        return False
    if found.store != "v1" or found.dir is None or root is None or found.dir == root:
        return True  # (a v2 store's files are never seeded: its root may lie anywhere)
    try:
        within(Path(root), Path(found.dir))
    except Unconfined:
        return False
    return True


def _kept(state_dir: Path, key: str) -> Path:
    return state_dir / f"vllm-cache-{key}.json"


def predict(
    python: str,
    vllm_version: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    state_dir: Path | None,
    timeout: float = 300.0,
    stop: threading.Event | None = None,
    site: str | None = None,
) -> CacheLocation:
    """vLLM's own answer (cached). Raises Refused when vLLM rejects the argv, FiCacheError when
    the child fails or hangs, or `stop` is set (the child is killed then)."""
    # the key once: it lists vLLM's site and hashes the files the arguments name
    kept = _kept(state_dir, cache_key(python, vllm_version, argv, env, site)) if state_dir else None
    if kept is not None and (known := _lookup(kept, env)) is not None:
        return known
    answer = _ask(python, argv, env, timeout, stop)
    if kept is not None:
        from fi_cache.store.files import atomic_write

        with contextlib.suppress(FiCacheError, OSError):  # a read-only store asks again next time
            atomic_write(kept, json.dumps(asdict(answer)).encode(), lock=False)
    return answer


def _answer(
    child: subprocess.Popen[str], timeout: float, stop: threading.Event | None
) -> tuple[str | None, str | None]:
    """(stdout, stderr) of the child; (None, None) when `stop` was set first, (None, why) when
    it took longer than `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"vLLM did not answer within {timeout:.0f}s"
        if stop is not None and stop.is_set():
            return None, None
        try:  # in short steps when a warm may stop us (its engine got there first)
            return child.communicate(timeout=min(left, 0.2) if stop else left)
        except subprocess.TimeoutExpired:
            continue


def _from_json(data: dict[str, object]) -> CacheLocation:
    files, every = data["files"], data.get("all_files", data["files"])
    if not isinstance(files, list) or not isinstance(every, list):
        raise TypeError("files")
    return CacheLocation(
        str(data["vllm_version"]),
        str(data["hash"]),
        None if data["dir"] is None else str(data["dir"]),
        tuple(str(f) for f in files),
        str(data["root_from"]),
        str(data.get("store", "v1")),
        tuple(str(f) for f in every),
        tuple(str(d) for d in _listed(data, "depends_on")),
        *_sweep(data),
    )


def _sweep(data: dict[str, object]) -> tuple[tuple[int, ...] | None, str]:
    """(sweep_tokens, sweep_unknown) from the child's `sweep` or a kept answer's two fields."""
    kept = {"tokens": data.get("sweep_tokens"), "unknown": data.get("sweep_unknown")}
    found = data.get("sweep", kept)
    if not isinstance(found, dict):
        raise TypeError("sweep")
    tokens, unknown = found.get("tokens"), str(found.get("unknown") or "")
    if tokens is None:
        return None, unknown or SWEEP_NOT_REPORTED
    if not isinstance(tokens, list) or not all(type(t) is int and t > 0 for t in tokens):
        raise TypeError("sweep tokens")
    return tuple(tokens), ""


def _listed(data: dict[str, object], key: str) -> list[object]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise TypeError(key)
    return value


def _ask(
    python: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    stop: threading.Event | None,
) -> CacheLocation:
    try:
        child = subprocess.Popen(
            [python, str(CHILD), json.dumps({"argv": list(argv)})],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
        )
    except OSError as exc:
        raise FiCacheError(f"cannot run: {exc.strerror}", python) from None
    try:
        stdout, stderr = _answer(child, timeout, stop)
    finally:
        if child.poll() is None:  # stopped, timed out or interrupted: no child left behind
            child.kill()
            child.communicate()
    if stdout is None or stderr is None:
        raise FiCacheError(stderr or "stopped before vLLM answered", python)
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        data = {"error": "failed", "message": "no answer"}
    if data.get("error") == "vllm-rejected-argv":
        said = [ln for ln in stderr.strip().splitlines() if "error:" in ln][-1:]
        raise Refused(f"vLLM rejects these arguments{': ' + said[0] if said else ''}")
    if "error" in data:
        raise FiCacheError(f"vLLM could not compute its cache location: {data.get('message')}")
    return _from_json(data)
