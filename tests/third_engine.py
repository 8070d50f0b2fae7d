"""A STAND-IN third serving engine for the lifecycle's tests: its command is tests/fake_vllm.py
(not vLLM) under another name, another namespace dir (`third/`) and its own finalize rule;
nothing in fi_cache knows it. Given only its adapter (engines/api.py's ServerEngine), the
lifecycle must warm, seed, record and serve it like vLLM and SGLang.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event

from fi_cache.engines.api import CommandLine, Identity, Request, Run, ServerEngine, Target, Versions
from fi_cache.environment import Environment, Gpu, VllmInfo
from fi_cache.errors import Refused
from fi_cache.lifecycle.report import Report
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.namespace import Namespace
from tests.conftest import ROOT

FAKE = ROOT / "tests" / "fake_vllm.py"
FP = Fingerprint(
    flashinfer_version="0.6.18",
    cuda_version="13.0",
    cublas_version="13.1.0",
    cudnn_version="91900",
    cudnn_frontend_version="1.32.0",
    gpu="NVIDIA H200",
    arch="90a",
)


@dataclass(frozen=True)
class Args:
    argv: tuple[str, ...]
    model: str | None
    key: str


ThirdTarget = Target[Args, None]
ThirdRun = Run[Args, None]


def key_args(argv: Sequence[str]) -> list[str]:
    """fake_vllm.py's hash input: the argv without --port/--host and their values."""
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok in ("--port", "--host"):
            skip = True
        else:
            out.append(tok)
    return out


class Third(ServerEngine[Args, None]):
    """A serving engine fi_cache has never heard of."""

    name = "third"
    cache_subdir = "third"
    display = "Third"
    path_flag = "--third"
    empty_start = "Third became healthy and saved nothing"
    seeds = True

    def find_executable(self, explicit: str | None) -> str:
        return sys.executable

    def read_args(self, argv: Sequence[str]) -> Args:
        if not argv or argv[0].startswith("-"):
            raise Refused("Third needs a model first")
        return Args(tuple(argv), argv[0], json.dumps(key_args(argv)))

    def warm_key(self, args: Args, finalize: str) -> str:
        return args.key

    def command_line(
        self, path: str | None, argv: Sequence[str]
    ) -> tuple[str | None, tuple[str, ...]]:
        return path, tuple(argv)

    def resolve(self, request: Request, line: CommandLine[Args], store: Path) -> ThirdTarget:
        mode = request.asked or "unfused"  # its own rule: unfused unless asked
        env = Environment(FP, (Gpu(0, "NVIDIA H200", "9.0"),), VllmInfo(None, None, None), None)
        return Target(
            ns=Namespace(FP, mode),
            env=env,
            version="1.0",
            path=line.path,
            argv=line.argv,
            args=line.args,
            launcher=None,
            notes=("third: chose " + mode,),
        )

    def bind(self, target: ThirdTarget) -> ThirdRun:
        return Run(target=target, launcher=None, nothing_to_tune=None)

    def checked_against(self, run: ThirdRun) -> Versions:
        return Versions()

    def environment(
        self, run: ThirdRun, ns_dir: Path, environ: Mapping[str, str], warm: bool
    ) -> dict[str, str]:
        if warm:
            self.cache_dir(ns_dir).mkdir(parents=True, exist_ok=True)
        env = dict(environ)
        env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = str(self.cache_dir(ns_dir))
        env.setdefault("FAKE_VLLM_TUNE_SECONDS", "0")  # a test may make it tune slowly
        return env

    def command(self, run: ThirdRun, port: int | None = None) -> list[str]:
        extra = [] if port is None else ["--host", "127.0.0.1", "--port", str(port)]
        return [sys.executable, str(FAKE), "serve", *run.args.argv, *extra]

    def identity(self, run: ThirdRun) -> Identity:
        return Identity(None, True, run.target.version)

    def same_model(self, run: ThirdRun, argv: Sequence[str]) -> bool:
        return bool(argv) and argv[0] == run.args.model

    def seed_targets(
        self, run: ThirdRun, ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        digest = hashlib.sha256(
            json.dumps([run.args.model, sorted(key_args(run.args.argv))]).encode()
        ).hexdigest()
        return [self.cache_dir(ns_dir) / digest / "autotune_configs.json"], None


@dataclass
class Heard:
    warned: list[str] = field(default_factory=list)
    noted: list[str] = field(default_factory=list)

    def report(self) -> Report:
        return Report(warn=self.warned.append, note=self.noted.append)


def request(*argv: str, warm: bool = True) -> Request:
    return Request(
        path=None,
        argv=argv,
        asked=None,
        given="--finalize",
        implied="--finalize unfused",
        warm=warm,
    )
