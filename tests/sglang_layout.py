"""SGLang's own cache-path code, read from its release wheels at test time, run on CPU.

scripts/test.sh downloads the sglang 0.5.18, 0.5.21 and 0.5.23 wheels (no dependencies) into
.cache/sglang-wheels; the function `flashinfer_autotune_cache_path` and the
SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 branch of `flashinfer_autotune_context` come out of
sglang/srt/model_executor/runner/flashinfer_autotune.py there (nothing of SGLang's is copied
into this repository).

SGLang has no CPU build, so the objects that code reads are stand-ins: the GPU's compute
capability, `flashinfer.__version__`, `envs.SGLANG_CACHE_DIR` (EnvStr with SGLang's default,
environ.py 0.5.23:1383), the model runner and the parallel state. The path arithmetic, the key
and the file names are SGLang's.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import sys
import types
import uuid
from pathlib import Path
from typing import Any

_DEFAULT_WHEELS = Path(__file__).parent.parent / ".cache" / "sglang-wheels"
WHEELS = Path(os.environ.get("FI_CACHE_SGLANG_WHEELS", _DEFAULT_WHEELS))
MODULE = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
# The SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 branch (runs/ files) of flashinfer_autotune_context.
RUNS_LINES = {"0.5.18": (182, 190), "0.5.23": (306, 316)}


class NoWheel(LookupError):
    """The sglang wheel of that version is not in WHEELS (scripts/test.sh downloads it)."""


def sglang_module(version: str, module: str = MODULE) -> str:
    """The text of SGLang `version`'s `module` (flashinfer_autotune.py), from its wheel."""
    import zipfile

    wheel = next(iter(sorted(WHEELS.glob(f"sglang-{version}-*.whl"))), None)
    if wheel is None:
        raise NoWheel(f"no sglang {version} wheel in {WHEELS}")
    with zipfile.ZipFile(wheel) as z:
        return z.read(module).decode()


def sglang_code(version: str) -> str:
    """SGLang `version`'s path function and its runs/ branch (wrapped as `runs_file`)."""
    import ast
    import textwrap

    text = sglang_module(version)
    tree = ast.parse(text)
    [fn] = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "flashinfer_autotune_cache_path"
    ]
    first, last = RUNS_LINES[version]
    block = textwrap.dedent("\n".join(text.splitlines()[first - 1 : last]))
    assert block.startswith("timestamp = "), f"sglang {version}: the runs/ branch moved"
    runs = "def runs_file(cache_path):\n" + textwrap.indent(block, "    ")
    return f"{ast.get_source_segment(text, fn)}\n\n\n{runs}\n    return autotune_cache\n"


def _ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


def sglang_paths(
    version: str,
    cache_dir: Path,
    *,
    flashinfer: str = "0.6.18",
    capability: tuple[int, int] = (9, 0),
    model: str = "Qwen/Qwen3-30B-A3B",
    tp: int = 1,
    ep: int = 1,
    tp_rank: int = 0,
    backend: str = "flashinfer_cutlass",
    gpu_uuid: str = "1b2c3d4e-0000-1111-2222-333344445555",
) -> tuple[Path, Path]:
    """(the rank file, a runs/ file) SGLang `version` ("0.5.18" or "0.5.23") would write."""
    try:
        source = sglang_code(version)
    except NoWheel as exc:  # skipped without it; scripts/test.sh downloads it, so there: fail
        import pytest

        if os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    ps = _ns(
        tp_size=tp,
        pp_size=1,
        attn_dp_size=1,
        moe_ep_size=ep,
        tp_rank=tp_rank,
        pp_rank=0,
        dp_rank=None,
        tp_group=None,
    )
    runner = _ns(
        device="cuda",
        dtype="torch.bfloat16",
        ps=ps,
        is_draft_worker=False,
        gpu_id=tp_rank,
        model_config=_ns(quantization=None, hf_config=type("Qwen3MoeConfig", (), {})()),
    )
    env_value = os.environ.get("SGLANG_CACHE_DIR")
    os.environ["SGLANG_CACHE_DIR"] = str(cache_dir)
    fake_fi = types.ModuleType("flashinfer")
    fake_fi.__version__ = flashinfer  # type: ignore[attr-defined]
    platforms = types.ModuleType("sglang.srt.platforms")
    platforms.current_platform = _ns(get_device_uuid=lambda _id: gpu_uuid)  # type: ignore[attr-defined]
    saved = {n: sys.modules.get(n) for n in ("flashinfer", "sglang.srt.platforms")}
    sys.modules.update({"flashinfer": fake_fi, "sglang.srt.platforms": platforms})
    glb: dict[str, Any] = {
        "Path": Path,
        "hashlib": hashlib,
        "datetime": datetime,
        "uuid": uuid,
        "logger": logging.getLogger("sglang-standin"),
        "ModelRunner": object,
        "torch": _ns(cuda=_ns(get_device_capability=lambda _d: capability)),
        "envs": _ns(
            SGLANG_CACHE_DIR=_ns(
                get=lambda: os.environ.get(
                    "SGLANG_CACHE_DIR", os.path.expanduser("~/.cache/sglang")
                )
            )
        ),
        "get_model": lambda: _ns(model_path=model, quantization=None),
        "get_exec": lambda: _ns(moe=_ns(moe_runner_backend=backend)),
        "get_parallel": lambda: ps,
        "get_flashinfer_autotune_skip_ops": lambda _mr: frozenset(),
    }
    try:
        exec(compile(source, f"sglang-{version}:{MODULE}", "exec"), glb)
        rank_file: Path = glb["flashinfer_autotune_cache_path"](runner)
        return rank_file, glb["runs_file"](rank_file)
    finally:
        restore_modules(saved)
        if env_value is None:
            os.environ.pop("SGLANG_CACHE_DIR", None)
        else:
            os.environ["SGLANG_CACHE_DIR"] = env_value


def restore_modules(saved: dict[str, Any]) -> None:
    """Put back the sys.modules entries stand-ins replaced (None: there was none)."""
    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
