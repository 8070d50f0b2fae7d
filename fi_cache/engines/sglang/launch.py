"""Finding SGLang, choosing its finalize mode, and the environment it runs with on a namespace.

What fi-cache moves: SGLANG_CACHE_DIR, to `<namespace>/sglang`. No release up to 0.5.23 has a
variable for the autotune part alone (docs/research/sglang-releases.md), so the rest is kept
where the user had it: every cache variable SGLang derives from SGLANG_CACHE_DIR is set to the
user's own value unless they set it (versions.SGLANG_DERIVED_CACHES; inductor's and Triton's are
links instead, as a diffusion worker reads them: SGLANG_LINKED_DERIVED), and the dirs and files
SGLang joins to SGLANG_CACHE_DIR itself are links into the user's dir (links.py).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fi_cache.engines.scripts import interpreter, resolve_launcher
from fi_cache.engines.sglang.args import SglangArgs, env_bool
from fi_cache.engines.sglang.layout import effective, legacy_name, user_cache_dir
from fi_cache.errors import Refused
from fi_cache.versions import (
    SGLANG_AUTOTUNE_CACHE_ENV,
    SGLANG_AUTOTUNE_EXTEND_ENV,
    SGLANG_CACHE_DIR_ENV,
    SGLANG_DETERMINISTIC_SKIPS_TUNE,
    SGLANG_FINALIZE_BEFORE_ENV,
    SGLANG_FINALIZE_ENV,
    SGLANG_FINALIZE_FROM,
    SGLANG_LAUNCH_MODULE,
    SGLANG_NEWEST_CHECKED,
    SGLANG_PERSISTENT_CACHE,
    SGLANG_RANK_DIGEST,
    SGLANG_RUNS_FROM,
    parse_version,
    sglang_caches_moved,
    sglang_finalize_default,
)

if TYPE_CHECKING:
    from fi_cache.store.namespace import FinalizeMode

SGLANG_ENV = "FI_CACHE_SGLANG"


@dataclass(frozen=True)
class Launcher:
    """How to start SGLang: its console script (`sglang serve ARGS`, 0.5.5+) or a Python running
    its server module (`PYTHON -m sglang.launch_server ARGS`)."""

    executable: str
    module: bool
    # Where fi-cache keeps what it learnt of this interpreter (the store's state dir): its
    # packages are read once, not by a child at every serve.
    kept_in: Path | None = None

    @property
    def python(self) -> str | None:
        """The interpreter whose packages SGLang runs with (None: not a Python script)."""
        return self.executable if self.module else interpreter(self.executable)

    def command(self, args: SglangArgs, extra: Sequence[str] = ()) -> list[str]:
        # A positional model is 0.5.23's `sglang serve MODEL` only: spell it --model-path.
        argv = [*args.with_model_flag(), *extra]
        if self.module:
            return [self.executable, "-m", SGLANG_LAUNCH_MODULE, *argv]
        return [self.executable, "serve", *argv]


def find_launcher(explicit: str | None) -> Launcher:
    """`--sglang CMD`, else $FI_CACHE_SGLANG, else `sglang` on PATH: the console script, a
    Python, or `PYTHON -m sglang.launch_server`. Raises Refused."""
    found, module = resolve_launcher(
        explicit, SGLANG_ENV, "sglang", SGLANG_LAUNCH_MODULE, "SGLang", "--sglang"
    )
    return Launcher(found, module)


def sglang_python(explicit: str | None) -> str | None:
    """The interpreter of the SGLang fi-cache would launch; None when there is none or it is not
    a Python script."""
    try:
        return find_launcher(explicit).python
    except Refused:
        return None


def require_version(version: str | None, launcher: Launcher) -> str:
    """SGLang's release, which decides its cache layout and finalize variable. Raises Refused
    when it cannot be read (a wrapper script, or no sglang dist in that Python)."""
    if version is not None and parse_version(version) is not None:
        return version
    where = launcher.python or launcher.executable
    raise Refused(
        f"cannot tell which SGLang release {launcher.executable} runs (no sglang package seen by "
        f"{where}): its cache layout and finalize variable depend on it; pass --sglang with the "
        "Python of SGLang's environment"
    )


def choose_finalize(
    environ: Mapping[str, str],
    asked: FinalizeMode | None,
    given: str,
    version: str,
    args: SglangArgs,
    force: bool = False,
) -> tuple[FinalizeMode, str | None]:
    """(The finalize mode SGLang `version` will run, a note to show): the command line (`given`
    spells it), else SGLang's --enable-deterministic-inference (unfused from 0.5.18), else the
    user's SGLANG_FLASHINFER_MOE_FUSED_FINALIZE, else the release's default. A variable that
    contradicts the command line, or one SGLang would not read as a boolean, is refused."""
    v = parse_version(version)
    reads = v is not None and v >= SGLANG_FINALIZE_FROM
    raw = effective(environ, SGLANG_FINALIZE_ENV)
    theirs: FinalizeMode | None = None
    if raw is not None and reads:
        said = env_bool(raw)
        if said is None:
            raise Refused(
                f"{SGLANG_FINALIZE_ENV}={raw!r} in the environment: SGLang reads true/1/yes/y or "
                "false/0/no/n and falls back to its default on anything else; set one, or unset it"
            )
        theirs = "fused" if said else "unfused"
    implied: FinalizeMode | None = "unfused" if args.deterministic and reads else None
    for what, mode in (
        (f"{SGLANG_FINALIZE_ENV}={raw}", theirs),
        ("--enable-deterministic-inference", implied),
    ):
        if asked is not None and mode is not None and mode != asked:
            raise Refused(
                f"{what} asks SGLang for {mode} finalize and {given} for {asked}: drop one"
            )
    if implied == "unfused" and theirs == "fused":
        theirs = None  # SGLang sets the variable to 0 itself (serving_hook.py 0.5.19:404-405)
    if not reads:
        if asked == "unfused":
            why = (
                f"SGLang {version} does not read {SGLANG_FINALIZE_ENV} (from {SGLANG_FINALIZE_FROM}"
                "): it would tune and run fused (non-deterministic) MoE finalize"
            )
            if not force:
                raise Refused(f"{why}; upgrade SGLang (--force to go on anyway)")
            return "unfused", f"{why}, into the unfused namespace (going on: --force)"
        note = None
        if args.deterministic:
            note = (
                f"SGLang {version}'s --enable-deterministic-inference still runs fused MoE "
                f"finalize and tunes it ({SGLANG_FINALIZE_FROM}+ runs unfused): fused namespace"
            )
        return cast("FinalizeMode", SGLANG_FINALIZE_BEFORE_ENV), note
    mode = asked or implied or theirs
    if mode is not None:
        return mode, None
    default = cast("FinalizeMode", sglang_finalize_default(version) or "fused")
    return default, (
        f"{SGLANG_FINALIZE_ENV} unset: SGLang {version} runs {default} finalize by default, "
        f"so the {default} namespace"
    )


def with_environment(args: SglangArgs, environ: Mapping[str, str]) -> SglangArgs:
    """`args` with the environment settings that change what a start keeps or tunes, so that a
    warm under them is not taken for one without (SGLANG_FLASHINFER_AUTOTUNE_CACHE=0,
    SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1)."""
    settings = []
    if env_bool(effective(environ, SGLANG_AUTOTUNE_CACHE_ENV)) is False:
        settings.append(f"{SGLANG_AUTOTUNE_CACHE_ENV}=0")
    if env_bool(effective(environ, SGLANG_AUTOTUNE_EXTEND_ENV)) is True:
        settings.append(f"{SGLANG_AUTOTUNE_EXTEND_ENV}=1")
    return replace(args, environment=tuple(settings)) if settings else args


def nothing_to_tune(environ: Mapping[str, str], version: str, args: SglangArgs) -> str | None:
    """Why this SGLang start will keep no cache, when that is known before it starts."""
    v = parse_version(version)
    if v is not None and v < SGLANG_PERSISTENT_CACHE:
        return f"SGLang {version} keeps no autotune cache (from {SGLANG_PERSISTENT_CACHE})"
    if args.autotune_disabled:
        return "--disable-flashinfer-autotune is in the SGLang arguments"
    if args.deterministic and v is not None and v >= SGLANG_DETERMINISTIC_SKIPS_TUNE:
        return (
            f"SGLang {version} with --enable-deterministic-inference skips FlashInfer "
            "autotuning (and runs unfused finalize)"
        )
    raw = effective(environ, SGLANG_AUTOTUNE_CACHE_ENV)
    if env_bool(raw) is False and v is not None and v >= SGLANG_RUNS_FROM:
        return (
            f"{SGLANG_AUTOTUNE_CACHE_ENV}={raw}: SGLang writes write-only runs/ files and never "
            "reads one back"
        )
    return None


def warnings(version: str, args: SglangArgs) -> list[str]:
    """What a user should know before this SGLang starts on a namespace."""
    v = parse_version(version)
    out = []
    if v is not None and v > SGLANG_NEWEST_CHECKED:
        out.append(
            f"SGLang {version} is newer than the newest release fi-cache was checked against "
            f"({SGLANG_NEWEST_CHECKED}): its cache layout is assumed unchanged"
        )
    if v in SGLANG_RANK_DIGEST and args.ep > 1 and args.tp > 1:
        out.append(
            f"SGLang {version} with --ep-size {args.ep} and --tp-size {args.tp} deletes its "
            "autotune cache at every start (sglang issue #40320): a warm only saves this "
            "start's tuning"
        )
    return out


def launch_env(
    base: Mapping[str, str],
    cache_dir: Path,
    finalize: str,
    version: str,
    linked: Collection[str] = (),
) -> dict[str, str]:
    """The environment SGLang runs with: SGLANG_CACHE_DIR in the namespace, the caches SGLang
    `version` derives from it pinned to the user's own dir (unless set, or `linked`: their dir
    in the namespace is a link to the user's), the finalize mode where the release reads it."""
    env = dict(base)
    theirs = user_cache_dir(base)
    for var, sub in sglang_caches_moved(version):
        if var not in linked:
            env.setdefault(var, os.path.join(theirs, sub) if sub else theirs)
    ours = {SGLANG_CACHE_DIR_ENV: str(cache_dir)}
    v = parse_version(version)
    if v is not None and v >= SGLANG_FINALIZE_FROM:
        ours[SGLANG_FINALIZE_ENV] = "0" if finalize == "unfused" else "1"
    for name, value in ours.items():
        env[name] = value
        if legacy_name(name) in env:
            env[legacy_name(name)] = value  # SGLang would copy the old one over ours
    return env


def namespace_env(
    cache_dir: Path,
    environ: Mapping[str, str],
    finalize: str,
    version: str,
    gpus: int | None = None,
) -> dict[str, str]:
    """SGLang's environment on a namespace's SGLang dir `cache_dir`, which is made, with the
    links into the user's dir (warm and serve start SGLang so); `gpus`: how many GPUs SGLang
    sees, which names its P2P probe file when CUDA_VISIBLE_DEVICES is unset."""
    from fi_cache.engines.sglang import links
    from fi_cache.store.files import ensure_dir

    ensure_dir(cache_dir)
    links.link_direct_caches(cache_dir, environ)
    links.link_user_files(cache_dir, environ, gpus)
    linked = links.link_derived_caches(cache_dir, environ, version)
    return launch_env(environ, cache_dir, finalize, version, linked)
