"""SGLang as an engine: `sglang serve ARGS` with SGLANG_CACHE_DIR in the namespace (launch.py says
what else that moves, and what fi-cache keeps where the user had it; the flow of a warm or serve
is fi_cache/lifecycle/'s).

A warm runs it until /health answers 200: every scheduler is ready only after FlashInfer
autotuning and the save (http_server.py 0.5.23:721-799, engine.py :2013-2041).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines.api import (
    CommandLine,
    Identity,
    Request,
    Run,
    ServerEngine,
    Target,
    Versions,
)
from fi_cache.engines.scripts import pasted_launcher
from fi_cache.engines.sglang import args, launch
from fi_cache.errors import Refused
from fi_cache.versions import (
    SGLANG_AUTOTUNE_SUBDIR,
    SGLANG_CACHE_DIR_ENV,
    SGLANG_DIRECT_CACHES,
    SGLANG_FINALIZE_FROM,
    SGLANG_KERNELS_LOCK,
    SGLANG_MEGAMOE_ENV,
    SGLANG_MEGAMOE_ENV_RANGE,
    SGLANG_PERSISTENT_CACHE,
    SGLANG_SAVES_EVERY_START,
    parse_version,
    sglang_caches_moved,
)

if TYPE_CHECKING:
    from threading import Event

    from fi_cache.environment import Environment
    from fi_cache.ranks.deployment import Expected
    from fi_cache.store.manifest import WarmRecord

# SGLang's own gate decides, from the model and GPU too (flashinfer_autotune.py 0.5.23:91-157):
# a start that tuned nothing is a start with nothing to tune, not a failed warm.
NOTHING_TUNED = (
    "SGLang became healthy and wrote no autotune file: it tunes only with a FlashInfer MoE "
    "backend (e.g. --moe-runner-backend flashinfer_cutlass; the default, auto, often picks "
    "another) or FlashInfer FP4/FP8 GEMMs, on SM90+ GPUs"
)


SglangTarget = Target[args.SglangArgs, launch.Launcher]
SglangRun = Run[args.SglangArgs, launch.Launcher]


def _version(target: SglangTarget) -> str:
    """The release resolve required (it refuses a target without one)."""
    return target.version or ""


def _for_model(
    parsed: args.SglangArgs, version: str, env: Environment
) -> tuple[args.SglangArgs, str | None]:
    """What SGLang's overrides for the model set (models.py), from its config.json here."""
    from fi_cache.engines import hf
    from fi_cache.engines.sglang import models
    from fi_cache.engines.sglang.layout import effective

    config = hf.read_config(parsed.model or "", os.environ)
    caps = [g.compute_cap for g in env.gpus]
    megamoe = parse_version(version) in SGLANG_MEGAMOE_ENV_RANGE and (
        args.env_bool(effective(os.environ, SGLANG_MEGAMOE_ENV)) is True
    )
    on_blackwell = models.blackwell(caps, env.fingerprint.cuda_version)
    return models.for_model(parsed, config, version, on_blackwell, megamoe)


class Sglang(ServerEngine[args.SglangArgs, launch.Launcher]):
    name = "sglang"
    cache_subdir = "sglang"  # SGLANG_CACHE_DIR inside a namespace
    display = "SGLang"
    path_flag = "--sglang"
    nothing_tuned = NOTHING_TUNED
    seeds = True  # its key dir by SGLang's own key code: seeds.py

    def find_executable(self, explicit: str | None) -> str:
        return launch.find_launcher(explicit).executable

    def read_args(self, argv: Sequence[str]) -> args.SglangArgs:
        parsed = args.parse_sglang_args(argv)
        args.require_model(parsed)
        return parsed

    def warm_key(self, a: args.SglangArgs, finalize: str) -> str:
        return a.key  # the finalize mode is the namespace's already

    def autotune_dir(self, ns_dir: Path) -> Path:
        """Where SGLang keeps FlashInfer's autotune files in the namespace (the rest of what
        lands under SGLANG_CACHE_DIR is not a cache fi-cache reads)."""
        return self.cache_dir(ns_dir).joinpath(*SGLANG_AUTOTUNE_SUBDIR)

    def command_line(
        self, path: str | None, argv: Sequence[str]
    ) -> tuple[str | None, tuple[str, ...]]:
        """From a pasted `sglang serve ARGS` or `PYTHON -m sglang.launch_server ARGS` line: its
        launcher is the SGLang to run."""
        return pasted_launcher(
            path, argv, args.split_launcher, launch.find_launcher, self.path_flag, self.display
        )

    def resolve(
        self, request: Request, line: CommandLine[args.SglangArgs], store: Path
    ) -> SglangTarget:
        """Find SGLang and its release, read its arguments, choose the finalize mode. Refused
        before anything is looked up when the arguments alone refuse it (a warm of several
        nodes)."""
        from fi_cache import environment
        from fi_cache.store.namespace import Namespace
        from fi_cache.store.paths import state_dir

        found = launch.find_launcher(line.path)
        launcher = launch.Launcher(found.executable, found.module, state_dir(store))
        parsed = launch.with_environment(line.args, os.environ)
        if request.warm and parsed.nnodes > 1:
            raise Refused(
                f"SGLang with --nnodes {parsed.nnodes} starts only when every node does, and "
                "nodes other than rank 0 answer no /health: warm cannot run it; start `fi-cache "
                "serve --engine sglang` on every node (the first start tunes into the namespace)"
            )
        env = environment.detect(state_dir(store), python=launcher.python)
        # Only the launcher's own Python may say which SGLang it is, never fi-cache's fallback.
        mine = launcher.python is not None and os.path.abspath(env.python) == os.path.abspath(
            launcher.python
        )  # not realpath: a venv's python links to the base interpreter
        version = launch.require_version(env.sglang_version if mine else None, launcher)
        parsed, model_note = _for_model(parsed, version, env)
        finalize, note = launch.choose_finalize(
            os.environ, request.asked, request.given, version, parsed, request.force
        )
        said = [n for n in (note, model_note) if n]
        notes = (*env.notes, *said, *launch.warnings(version, parsed))
        return Target(
            ns=Namespace(env.fingerprint, finalize),
            env=env,
            version=version,
            path=line.path,
            argv=line.argv,
            args=parsed,
            launcher=launcher,
            notes=notes,
        )

    def keeps_no_cache(self, target: SglangTarget) -> str | None:
        """Before 0.5.12 SGLang keeps no cache: nothing to namespace."""
        v = parse_version(target.version)
        if v is not None and v >= SGLANG_PERSISTENT_CACHE:
            return None
        return (
            f"SGLang {target.version} keeps no FlashInfer autotune cache (from "
            f"{SGLANG_PERSISTENT_CACHE})"
        )

    def announce(self, target: SglangTarget, ns_dir: Path, environ: Mapping[str, str]) -> list[str]:
        """Where its cache dir goes and what stays with the user."""
        from fi_cache.engines.sglang.layout import user_cache_dir
        from fi_cache.store.namespace import shared_when_undetected

        out = [shared] if (shared := shared_when_undetected(target.ns)) else []
        kept = [var for var, _ in sglang_caches_moved(_version(target))]
        out.append(
            f"{SGLANG_CACHE_DIR_ENV}={self.cache_dir(ns_dir)} for SGLang (no release moves only "
            f"its autotune dir); kept in {user_cache_dir(environ)}: "
            f"{', '.join([*kept, *SGLANG_DIRECT_CACHES, SGLANG_KERNELS_LOCK])}, the P2P probe"
        )
        return out

    def bind(self, target: SglangTarget) -> SglangRun:
        quiet = launch.nothing_to_tune(os.environ, _version(target), target.args)
        launcher = target.launcher or launch.find_launcher(target.path)  # resolve found it
        return Run(target=target, launcher=launcher, nothing_to_tune=quiet)

    def checked_against(self, run: SglangRun) -> Versions:
        return Versions(sglang=run.target.version)

    def serve_without_warm(self, run: SglangRun) -> str | None:
        if run.nothing_to_tune:
            return f"nothing to warm: {run.nothing_to_tune}; starting SGLang anyway"
        if run.args.nnodes > 1:  # a warm would wait for the other nodes; rank >= 1: no /health
            return (
                f"--nnodes {run.args.nnodes}: no warm first (every node must start together); "
                "SGLang tunes at this start and saves into the namespace"
            )
        return None

    def before_serving(self, run: SglangRun, ns_dir: Path) -> list[str]:
        """A server already running on this namespace's SGLang dir and GPUs this one may use,
        when one of them runs MegaMoE (live.sharing)."""
        from fi_cache.engines.sglang import live

        cache_dir = str(self.cache_dir(ns_dir))
        gpus = live.devices(os.environ)
        found = live.sharing(live.running(), cache_dir, gpus, run.args.moe_backend)
        return [
            f"SGLang pid {e.pid} already serves from {cache_dir} on GPUs {e.gpus}: with "
            "flashinfer_megamoe SGLang says engines sharing GPUs must use separate "
            "SGLANG_CACHE_DIRs (`fi-cache doctor --sglang-version V` explains; give this one "
            "other GPUs)"
            for e in found
        ]

    def environment(
        self, run: SglangRun, ns_dir: Path, environ: Mapping[str, str], warm: bool
    ) -> dict[str, str]:
        """SGLang's dir in the namespace, made, with its links into the user's dir."""
        gpus = len(run.target.env.gpus) or None  # the visible ones: torch's device count
        return launch.namespace_env(
            self.cache_dir(ns_dir), environ, run.ns.finalize, _version(run.target), gpus
        )

    def command(self, run: SglangRun, port: int | None = None) -> list[str]:
        # Warming never needs outside traffic: loopback, our port (argparse: the last flag wins).
        extra = [] if port is None else ["--host", "127.0.0.1", "--port", str(port)]
        cmd: list[str] = run.launcher.command(run.args, extra)
        return cmd

    def same_model(self, run: SglangRun, argv: Sequence[str]) -> bool:
        from fi_cache.engines.sglang import seeds

        try:
            return seeds.same_model(args.parse_sglang_args(argv), run.args)
        except Refused:
            return False

    def seed_source(self, run: SglangRun, warm: WarmRecord) -> bool:
        from fi_cache.engines.sglang import seeds

        return seeds.usable(run, warm)

    def seed_targets(
        self, run: SglangRun, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        """This node's rank files in the key dir SGLang's own key code names for this start,
        its worker's values solved from an earlier warm's dir (seeds.py)."""
        from fi_cache.engines.sglang import seeds
        from fi_cache.store import manifest

        found = manifest.load(ns_dir)
        earlier = [w for w in (found.warms if found else ()) if w.engine == self.name and w.ok]
        return seeds.targets(run, earlier, self.autotune_dir(ns_dir))

    def rank_names(self, run: SglangRun) -> Expected | None:
        """SGLang's own launch rule (layout.py): the key dir hashes the model's HF config on
        the worker, the names follow from the arguments."""
        from fi_cache.engines.sglang.layout import rank_layout
        from fi_cache.ranks.deployment import Expected

        layout = rank_layout(run.args)
        if len(layout.ranks) < 2:
            return None  # one rank: nothing to agree with
        return Expected("sglang", layout.ranks, layout.node)

    def read_only_problem(self, run: SglangRun) -> str | None:
        version = parse_version(run.target.version)
        if version is None or version not in SGLANG_SAVES_EVERY_START or run.nothing_to_tune:
            return None
        return (
            f"SGLang {version} saves its rank file at every start, warm or not "
            f"({SGLANG_SAVES_EVERY_START.source}), and FlashInfer's save fails in a read-only "
            "dir, so the start fails on this store"
        )

    def identity(self, run: SglangRun) -> Identity:
        v = parse_version(run.target.version)
        reads = v is not None and v >= SGLANG_FINALIZE_FROM
        return Identity(None, reads, run.target.version)


ENGINE = Sglang()
