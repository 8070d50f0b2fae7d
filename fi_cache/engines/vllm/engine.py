"""vLLM as an engine: `vllm serve ARGS` with VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR in the namespace
(what fi_cache/lifecycle/ needs from vLLM; the flow of a warm or serve is the lifecycle's)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines.api import (
    CommandLine,
    Identity,
    ModeProblem,
    Request,
    Run,
    ServerEngine,
    Target,
    Versions,
)
from fi_cache.engines.scripts import pasted_launcher
from fi_cache.engines.vllm import args, launch, layout
from fi_cache.environment import Environment
from fi_cache.errors import Refused
from fi_cache.versions import (
    VLLM_CACHE_DIR_ENV,
    VLLM_PERSISTENT_CACHE,
    VLLM_SKIP_OPS_ENV,
    VLLM_SWEEP_SKIPPED_ON_HIT,
    parse_version,
)

if TYPE_CHECKING:
    from threading import Event

    from fi_cache.model.sweep import Sweep
    from fi_cache.model.v1 import CacheFile as V1File
    from fi_cache.ranks.deployment import Expected
    from fi_cache.store.manifest import WarmRecord

EMPTY_START = (
    "vLLM became healthy but neither wrote nor read an autotune cache in the namespace "
    "(FlashInfer autotune off: -O0, "
    "--no-enable-flashinfer-autotune or, on 0.33, --disable-flashinfer-autotune? a model "
    "without FlashInfer kernels? vLLM < 0.25?)"
)


def nothing_to_tune(env: Environment, a: args.ServeArgs) -> str | None:
    """Why this vLLM start will tune and save nothing, when that is known before it starts; None
    when it should tune. vLLM tunes only with FlashInfer installed and device 0 at SM90+
    (kernel_warmup.py 0.32:265-267: has_flashinfer() and has_device_capability(90)), autotune on,
    and keeps a file only from 0.25."""
    version = parse_version(env.vllm.version)
    if a.autotune_off:
        return "FlashInfer autotune is off in the vLLM arguments"
    if version is not None and version < VLLM_PERSISTENT_CACHE:
        return f"vLLM {version} keeps no autotune cache (from {VLLM_PERSISTENT_CACHE})"
    if env.fingerprint.flashinfer_version is None:
        return f"no FlashInfer installed with this vLLM ({env.python})"
    if not env.gpus:
        return "no NVIDIA GPU visible: vLLM tunes FlashInfer kernels on SM90+ GPUs only"
    major = env.gpus[0].compute_cap.partition(".")[0]
    if major.isdigit() and int(major) < 9:
        return f"{env.gpus[0].name} is SM{env.gpus[0].compute_cap}: vLLM tunes on SM90+ only"
    return None


VllmTarget = Target[args.ServeArgs, launch.Launcher]
VllmRun = Run[args.ServeArgs, launch.Launcher]


class Vllm(ServerEngine[args.ServeArgs, launch.Launcher]):
    name = "vllm"
    cache_subdir = "vllm"  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR inside a namespace
    display = "vLLM"
    path_flag = "--vllm"
    empty_start = EMPTY_START
    seeds = True

    def find_executable(self, explicit: str | None) -> str:
        return launch.find_executable(explicit)

    def serve_without_warm(self, run: VllmRun) -> str | None:
        """A start that certainly tunes nothing (autotune off in its arguments, a vLLM without a
        persistent cache) is not warmed first: a warm would start vLLM once more for nothing.
        Detected facts (no FlashInfer, no GPU) may be wrong here, so those still warm."""
        version = parse_version(run.env.vllm.version)
        certain = run.args.autotune_off or (version is not None and version < VLLM_PERSISTENT_CACHE)
        if certain and run.nothing_to_tune:
            return f"nothing to tune ({run.nothing_to_tune}): vLLM starts once, without a warm"
        return None

    def read_args(self, argv: Sequence[str]) -> args.ServeArgs:
        parsed = args.parse_serve_args(argv)
        args.require_model(parsed)
        return parsed

    def warm_key(self, a: args.ServeArgs, finalize: str) -> str:
        """The arguments' key (the finalize mode is the namespace's already), and the ops
        VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS keeps from tuning: not hashed by vLLM, so a warm
        under one setting is no warm for another (the key of a warm without it is unchanged)."""
        scope = layout.skip_ops(os.environ)
        if scope is None:
            return a.key
        return hashlib.sha256(f"{a.key}\0{VLLM_SKIP_OPS_ENV}={scope}".encode()).hexdigest()[:16]

    def command_line(
        self, path: str | None, argv: Sequence[str]
    ) -> tuple[str | None, tuple[str, ...]]:
        """From a pasted `vllm serve ARGS` or `PYTHON -m vllm.entrypoints.openai.api_server
        ARGS` line: its launcher is the vLLM to run."""
        return pasted_launcher(
            path, argv, args.split_launcher, launch.find_launcher, self.path_flag, self.display
        )

    def resolve(
        self, request: Request, line: CommandLine[args.ServeArgs], store: Path
    ) -> VllmTarget:
        """The mode the command line asks for, else the user's VLLM_FLASHINFER_MOE_FUSED_FINALIZE;
        the environment of the interpreter that runs the vLLM fi-cache launches (none found:
        fi-cache's own is asked, and bind refuses after what detection said)."""
        from fi_cache import environment
        from fi_cache.store.namespace import Namespace
        from fi_cache.store.paths import state_dir

        mode, note = launch.user_finalize(os.environ, request.asked, request.given, request.implied)
        try:
            launcher: launch.Launcher | None = launch.find_launcher(line.path)
        except Refused:
            launcher = None
        python = launcher.python if launcher is not None else None
        env = environment.detect(state_dir(store), python=python)
        return Target(
            ns=Namespace(env.fingerprint, mode),
            env=env,
            version=env.vllm.version,
            path=line.path,
            argv=line.argv,
            args=line.args,
            launcher=launcher,
            notes=(*([note] if note else []), *env.notes),
        )

    def mode_problem(self, target: VllmTarget, verb: str) -> ModeProblem | None:
        """The unfused path on a vLLM that would silently ignore it (engines/vllm/deterministic.py:
        the variable, fi-cache's plugin, or refused)."""
        from fi_cache.engines.vllm import deterministic

        return deterministic.mode_problem(target, verb, target.args.uses_ray)

    def announce(self, target: VllmTarget, ns_dir: Path, environ: Mapping[str, str]) -> list[str]:
        """A namespace named by undetected fields (shared with every machine whose detection
        fails alike), and the user's own VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR giving way."""
        from fi_cache.store.namespace import shared_when_undetected

        out = [shared] if (shared := shared_when_undetected(target.ns)) else []
        ours = str(self.cache_dir(ns_dir))
        theirs = environ.get(VLLM_CACHE_DIR_ENV)
        if theirs and os.path.abspath(os.path.expanduser(theirs)) != ours:
            out.append(
                f"{VLLM_CACHE_DIR_ENV}={theirs} in the environment: vLLM gets {ours} instead"
            )
        return out

    def bind(self, target: VllmTarget) -> VllmRun:
        parsed = target.args
        if why := layout.argv_refusal(target.env.vllm.version, parsed):
            raise Refused(why)
        # resolve found it; looked for again only to say why there is none
        launcher = target.launcher or launch.find_launcher(target.path)
        return Run(
            target=target, launcher=launcher, nothing_to_tune=nothing_to_tune(target.env, parsed)
        )

    def checked_against(self, run: VllmRun) -> Versions:
        from fi_cache.engines.vllm.deterministic import passes_mode_on

        supports = passes_mode_on(run.env, run.ns.finalize)  # the plugin route passes it on
        return Versions(vllm=run.env.vllm.version, supports_finalize=supports)

    def read_only_problem(self, run: VllmRun) -> str | None:
        return layout.read_only_problem(run.env.vllm.version, run.args)

    def environment(
        self, run: VllmRun, ns_dir: Path, environ: Mapping[str, str], warm: bool
    ) -> dict[str, str]:
        root = self.cache_dir(ns_dir)
        if warm:
            from fi_cache.store.files import ensure_dir

            ensure_dir(root)
        from fi_cache.engines.vllm import deterministic

        info = run.env.vllm
        env = launch.launch_env(
            dict(environ), root, run.ns.finalize, run.args.uses_ray, info.supports_finalize_env
        )
        if run.ns.finalize == "unfused" and deterministic.route(run.env)[0] == "plugin":
            return launch.plugin_env(env, run.args.uses_ray)
        return env

    def command(self, run: VllmRun, port: int | None = None) -> list[str]:
        # Warming never needs outside traffic: loopback, on our port, in place of the user's.
        cmd: list[str] = run.launcher.command(launch.warm_argv(run.args.argv, port))
        return cmd

    def identity(self, run: VllmRun) -> Identity:
        from fi_cache.engines.vllm.deterministic import passes_mode_on

        return Identity(run.env.vllm.version, passes_mode_on(run.env, run.ns.finalize))

    def same_model(self, run: VllmRun, argv: Sequence[str]) -> bool:
        try:
            return bool(args.parse_serve_args(argv).model == run.args.model)
        except Refused:
            return False

    def seed_source(self, run: VllmRun, warm: WarmRecord) -> bool:
        """The same model; on vLLM 0.33+, which tunes nothing on a full hit, also the same
        sharding, dtypes, quantisation, backends and drafter (engines/vllm/shapes.py): another
        start's table lacks this one's shapes, and nothing would tune them."""
        from fi_cache.engines.vllm.shapes import shaping

        if not self.same_model(run, warm.argv):
            return False
        version = parse_version(run.env.vllm.version)
        if version is None or version < VLLM_SWEEP_SKIPPED_ON_HIT:
            return True
        return shaping(args.parse_serve_args(warm.argv)) == shaping(run.args)

    def one_rank(self, run: VllmRun) -> bool:
        # tp * pp * dp workers (a dense model's dp ranks are engines of their own, but each
        # names its own dp{d}_rank0 file in one dir: a deployment of dp files)
        return bool(run.args.world_size == 1 and run.args.nnodes == 1)

    def tune_groups(self, run: VllmRun) -> Expected | None:
        """With pp > 1 each stage's TP group tunes and loads alone (kernel_warmup.py 0.32:440,
        0.34:571): its ranks by the layout model, the model's MoE from its config.json."""
        if run.args.pp <= 1:
            return None
        from fi_cache.engines import hf
        from fi_cache.ranks.deployment import Expected, rank_name

        a, fi = run.args, run.env.fingerprint.flashinfer_version
        moe = layout.is_moe(hf.read_config(a.model, os.environ)) if a.model else None
        files = layout.rank_files(run.env.vllm.version, fi, a, moe) or ()
        every = tuple(r for f in files if (r := rank_name(f)).startswith("dp"))
        groups = layout.tune_groups(a, every)
        return (
            Expected("vllm", every, every if a.nnodes == 1 else (), None, groups)
            if groups
            else None
        )

    def seed_targets(
        self, run: VllmRun, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        """The files vLLM's own code says this start will read (engines/vllm/predict.py)."""
        answer = self._targets(run, ns_dir, store, stop, ask=True)
        assert answer is not None  # asked: an answer or an error
        return answer

    def seed_targets_known(
        self, run: VllmRun, ns_dir: Path, store: Path
    ) -> tuple[list[Path], str | None] | None:
        """The answer vLLM gave earlier for exactly these inputs; None: not asked yet (its
        child imports vLLM and builds the model on meta, ~25 s on the H200's host)."""
        return self._targets(run, ns_dir, store, None, ask=False)

    def _targets(
        self, run: VllmRun, ns_dir: Path, store: Path, stop: Event | None, ask: bool
    ) -> tuple[list[Path], str | None] | None:
        from fi_cache.engines.vllm import predict
        from fi_cache.store.paths import state_dir

        info = run.env.vllm
        if info.version is None:
            return [], "not seeding: no vLLM found to ask which file it will read"
        environ = self.environment(run, ns_dir, os.environ, warm=False)
        argv, python, kept = list(run.args.argv), run.env.python, state_dir(store)
        asked = (python, info.version, argv, environ, kept)
        if ask:
            where = predict.predict(*asked, stop=stop, site=info.site)
        elif (known := predict.cached(*asked, site=info.site)) is None:
            return None
        else:
            where = known
        if where.store == "v2":
            return [], "nothing to seed: vLLM keeps FlashInfer's v2 store here (no per-config file)"
        if where.dir:  # seed_gap's answer: what vLLM's sweep tunes for this config
            from fi_cache.model.sweep import Sweep

            _SWEEPS[str(Path(where.dir))] = Sweep(where.sweep_tokens, where.sweep_unknown)
        return where.paths, None

    def seed_gap(self, run: VllmRun, tables: Sequence[tuple[Path, V1File]]) -> str | None:
        """vLLM 0.33+ tunes nothing when every rank's file passes its gate: a seed must hold
        every bucket its sweep tunes for this config (model/sweep.py)."""
        from fi_cache.model.sweep import refusal

        known = {_SWEEPS.get(str(target.parent)) for target, _ in tables}
        sweep = known.pop() if len(known) == 1 else None
        return refusal(run.env.vllm.version, sweep, tables)


# vLLM's sweep for each hash dir it named this process (seed_targets, then seed_gap).
_SWEEPS: dict[str, Sweep] = {}

ENGINE = Vllm()
