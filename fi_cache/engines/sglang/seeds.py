"""Which earlier SGLang warms may seed a start, and the rank files that start will read: its key
dir by SGLang's own key code (keydir.py), with the worker's values solved from an earlier warm's
dir. The lifecycle's seeding (fi_cache/lifecycle/seeding.py) writes the files.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines import hf
from fi_cache.engines.api import Run
from fi_cache.engines.sglang import keydir, models
from fi_cache.engines.sglang.args import SglangArgs, parse_sglang_args
from fi_cache.engines.sglang.layout import rank_layout
from fi_cache.errors import FiCacheError
from fi_cache.store.manifest import WarmRecord
from fi_cache.versions import (
    SGLANG_ARCH_DIR,
    SGLANG_CANDIDATE_SELECTION,
    SGLANG_KEY_DIR,
    SGLANG_KEY_MODULE,
    SGLANG_RANK_FILE,
    parse_version,
)

if TYPE_CHECKING:
    from fi_cache.engines.sglang.launch import Launcher

_MEGAMOE = ("flashinfer_megamoe",)  # args resolve the aliases


def key_code(launcher: Launcher) -> keydir.KeyCode:
    """The key code of the SGLang `launcher`'s Python has installed. Raises KeyCodeChanged."""
    return _key_code(launcher.python or "", launcher.kept_in)


@functools.lru_cache(maxsize=4)
def _key_code(python: str, kept_in: Path | None) -> keydir.KeyCode:
    from fi_cache.environment import dists_of

    try:
        found = dists_of(python, wanted=(("sglang", SGLANG_KEY_MODULE),), state_dir=kept_in)
    except RuntimeError as exc:
        raise keydir.KeyCodeChanged(str(exc)) from None
    file = found.file("sglang", SGLANG_KEY_MODULE)
    if file is None:
        raise keydir.KeyCodeChanged(f"{python}'s sglang has no {SGLANG_KEY_MODULE}")
    return keydir.KeyCode(file[1], file[0])


@dataclass(frozen=True)
class Solved:
    """An earlier warm whose key dir SGLang's code reproduces: its inputs, arguments, and
    where its files are (FlashInfer version and arch dir names)."""

    inputs: keydir.KeyInputs
    args: SglangArgs
    fi_arch: tuple[str, str]


def same_model(a: SglangArgs, b: SglangArgs) -> bool:
    """One model at one dtype and quantisation (as given), however the model is named."""
    if (a.dtype, a.quantization) != (b.dtype, b.quantization) or not (a.model and b.model):
        return False
    return hf.same_model(a.model, b.model, os.environ)


def solved(run: Run[SglangArgs, Launcher], warm: WarmRecord) -> Solved | str:
    """The earlier warm's key inputs, or why they cannot be had."""
    try:
        earlier = parse_sglang_args(warm.argv)
    except FiCacheError:
        return "its arguments are not SGLang's"
    if not same_model(earlier, run.args):
        return "another model"
    dirs = {_key_dir(f.path) for f in warm.files} - {None}
    if len(dirs) != 1:
        return "its files are not in one SGLang key dir"
    [(fi, arch, key)] = dirs  # type: ignore[misc]
    code = key_code(run.launcher)
    config = hf.read_config(run.args.model or "", os.environ) or hf.read_config(
        earlier.model or "", os.environ
    )
    if config is None:
        return f"no config.json of {run.args.model} here (local dir or Hugging Face cache)"
    # The earlier start's layout as SGLang's model overrides set it (GPU family not known here).
    earlier = models.for_model(earlier, config, warm.engine_version, None)[0]
    inputs = keydir.solve(code, earlier, config, key)
    if inputs is None:
        return _why_unsolved(run, warm, key)
    return Solved(inputs, earlier, (fi, arch))


def _why_unsolved(run: Run[SglangArgs, Launcher], warm: WarmRecord, key: str) -> str:
    now, then = parse_version(run.target.version), parse_version(warm.engine_version or "")
    if (
        now in SGLANG_CANDIDATE_SELECTION
        and then is not None
        and then not in (SGLANG_CANDIDATE_SELECTION)
    ):
        return (
            f"SGLang {now} re-tunes files of SGLang {then} on purpose (candidate_selection="
            f"v2_default in its key: {SGLANG_CANDIDATE_SELECTION.source})"
        )
    return (
        f"SGLang {run.target.version}'s key code gives no key {key} for its arguments (SGLang "
        "resolved one of them in a way fi-cache does not try)"
    )


def _key_dir(rel: str) -> tuple[str, str, str] | None:
    parts = Path(rel).parts
    if len(parts) < 4 or not SGLANG_RANK_FILE.match(parts[-1]):
        return None
    fi, arch, key = parts[-4:-1]
    return (fi, arch, key) if SGLANG_ARCH_DIR.match(arch) and SGLANG_KEY_DIR.match(key) else None


def usable(run: Run[SglangArgs, Launcher], warm: WarmRecord) -> bool:
    """Its files may seed this start's: same model, a key SGLang's code reproduces, and no op
    this start skips that it tuned."""
    try:
        found = solved(run, warm)
        return isinstance(found, Solved) and _carry(run, found)[0] is not None
    except keydir.KeyCodeChanged:
        return False


def _carry(
    run: Run[SglangArgs, Launcher], found: Solved
) -> tuple[keydir.KeyInputs | None, str | None]:
    return keydir.carried(found.inputs, found.args, run.args, key_code(run.launcher))


def targets(
    run: Run[SglangArgs, Launcher], warms: list[WarmRecord], root: Path
) -> tuple[list[Path], str | None]:
    """This node's rank files under `root` (the namespace's autotune dir) as SGLang's code
    names them, from the newest earlier warm that solves; ([], why) when none does."""
    if (run.args.moe_backend or "") in _MEGAMOE:
        return [], "not seeding: MegaMoE's rank files carry each GPU's UUID (known on the worker)"
    if run.launcher is None or run.launcher.python is None:
        return [], "not seeding: no Python of SGLang's found to read its key code from"
    whys: list[str] = []  # the newest warm's reason is the one said
    try:
        for warm in sorted(warms, key=lambda w: w.started, reverse=True):
            found = solved(run, warm)
            if found == "another model":
                continue
            if isinstance(found, str):
                whys.append(found)
                continue
            inputs, why_not = _carry(run, found)
            if inputs is None:
                whys.append(why_not or "")
                continue
            key = key_code(run.launcher).key(inputs)
            names = rank_layout(run.args).node
            return list(keydir.rank_paths(root, found.fi_arch, key, names)), None
    except keydir.KeyCodeChanged as exc:
        return [], f"not seeding: SGLang's key code could not be run ({exc})"
    return [], f"not seeding: {whys[0] if whys else 'no earlier warm of this model'}"
