"""The contract every engine keeps: a program fi-cache runs to fill a namespace with FlashInfer
autotune caches (vLLM's `vllm serve`, SGLang's `sglang serve`, FlashInfer's own autotuner in a
child process).

`Engine` is what every engine says about itself; `ServerEngine` is what a serving engine adds
so that fi_cache/lifecycle/ can warm and serve it: only what differs between engines (its
command line, its arguments, its finalize rule, its environment, what it reads and writes,
"nothing to tune"). The data the lifecycle and an engine hand each other is defined here too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from fi_cache.caches.discover import is_v2_env_dir
from fi_cache.errors import FiCacheError
from fi_cache.store.manifest import Manifest, WarmRecord

if TYPE_CHECKING:
    from threading import Event

    from fi_cache.environment import Environment
    from fi_cache.model.v1 import CacheFile as V1File
    from fi_cache.ranks.deployment import Expected
    from fi_cache.store.namespace import FinalizeMode, Namespace


def _present(path: Path) -> bool:
    return path.is_file() or is_v2_env_dir(path)


class WarmFailed(FiCacheError):
    """The engine exited early, timed out, or wrote no cache; `lines` are its last log lines."""

    def __init__(self, message: str, lines: list[str], log: list[str] | None = None) -> None:
        super().__init__(message)
        self.lines = lines
        self.log = log if log is not None else lines  # all it printed (bounded), for a log file
        self.saved_log: Path | None = None  # where the lifecycle kept `log` for doctor --log
        self.crash: str | None = None  # a gemm profile-id crash seen in `log`
        self.root_cause: str | None = None  # the first exception, when the tail misses it


class ServedArgs(Protocol):
    """What the lifecycle reads of a serving engine's parsed arguments."""

    @property
    def argv(self) -> tuple[str, ...]: ...  # as the engine gets them
    @property
    def model(self) -> str | None: ...
    @property
    def key(self) -> str: ...  # a warm's identity: the arguments without where it listens


ArgsT = TypeVar("ArgsT")  # an engine's parsed arguments
ServedT = TypeVar("ServedT", bound=ServedArgs)  # a serving engine's
LauncherT = TypeVar("LauncherT")  # how a serving engine is started (its launch.Launcher)


class Engine(ABC, Generic[ArgsT]):
    """What fi-cache needs to know about one engine."""

    name: ClassVar[str]  # `--engine NAME`, and the `engine` of its warm records
    cache_subdir: ClassVar[str]  # where its caches live inside a namespace

    def cache_dir(self, ns_dir: Path) -> Path:
        """Where this engine's caches land inside the namespace `ns_dir`."""
        return ns_dir / self.cache_subdir

    @abstractmethod
    def find_executable(self, explicit: str | None) -> str:
        """The program to run: `explicit` (a flag), else the engine's variable, else its
        default. Raises Refused when there is none."""

    @abstractmethod
    def read_args(self, argv: Sequence[str]) -> ArgsT:
        """What fi-cache needs from the engine's arguments. Raises Refused where the engine
        itself would reject them."""

    @abstractmethod
    def warm_key(self, args: ArgsT, finalize: str) -> str:
        """What makes two warms of one namespace "the same" (recorded as `argv_key`)."""

    def is_warm(self, ns_dir: Path, m: Manifest | None, args: ArgsT, finalize: str) -> bool:
        """A successful warm of these arguments is recorded and its caches are still there: v1
        files, or FlashInfer v2 store dirs (vLLM 0.33 with one rank records its env dir)."""
        last = m.last_warm(self.warm_key(args, finalize)) if m else None
        return last is not None and all(_present(ns_dir / f.path) for f in last.files)


@dataclass(frozen=True, kw_only=True)
class Request:
    """What a warm or serve command line asks of a serving engine."""

    path: str | None  # --vllm / --sglang: the engine to run (None: its variable, then PATH)
    argv: tuple[str, ...]  # the engine's arguments, as given (a pasted launcher included)
    asked: FinalizeMode | None  # the finalize mode the command line asks for
    given: str  # how the command line spells `asked`, for messages
    implied: str  # the flag the user's own finalize variable stands for, for messages
    force: bool = False
    warm: bool = False  # a warm (the engine is stopped once healthy), not a serve


@dataclass(frozen=True, kw_only=True)
class CommandLine(Generic[ServedT]):
    """The engine's command line, read once: refused here where the engine would refuse it."""

    path: str | None  # the launcher, after a pasted command line was read
    argv: tuple[str, ...]  # the engine's arguments without a pasted launcher
    args: ServedT  # `argv` parsed


@dataclass(frozen=True, kw_only=True)
class Target(Generic[ServedT, LauncherT]):
    """The namespace a start will use and what was found deciding it."""

    ns: Namespace
    env: Environment  # of the Python that runs the engine
    version: str | None  # the engine's release
    path: str | None  # the launcher, after a pasted command line was read
    argv: tuple[str, ...]  # the engine's arguments without a pasted launcher
    args: ServedT  # what the engine reads of `argv` (after its environment and model's overrides)
    launcher: LauncherT | None  # None: none found (bind refuses, after what resolve said)
    notes: tuple[str, ...] = ()  # what the user should hear before anything starts


@dataclass(frozen=True, kw_only=True)
class Run(Generic[ServedT, LauncherT]):
    """One engine start on a namespace, as decided before it starts."""

    target: Target[ServedT, LauncherT]
    launcher: LauncherT  # how the engine is started
    nothing_to_tune: str | None  # known up front: this start keeps no cache, and why

    @property
    def args(self) -> ServedT:
        """The engine's parsed arguments (read once, by `ServerEngine.read`)."""
        return self.target.args

    @property
    def ns(self) -> Namespace:
        return self.target.ns

    @property
    def env(self) -> Environment:
        return self.target.env


@dataclass(frozen=True)
class Versions:
    """The releases doctor's pre-flight checks judge a namespace against."""

    vllm: str | None = None
    supports_finalize: bool | None = None  # does that vLLM read the finalize variable
    sglang: str | None = None


@dataclass(frozen=True)
class Identity:
    """Who warmed, as a warm record keeps it."""

    vllm_version: str | None
    supports_finalize_env: bool | None
    engine_version: str | None = None


@dataclass(frozen=True)
class ModeProblem:
    """The finalize mode asked for is one this engine would not run."""

    refusal: str | None = None  # refused unless --force
    warning: str | None = None  # said, and the start goes on


class ServerEngine(Engine[ServedT], Generic[ServedT, LauncherT]):
    """A serving engine: warmed by running it until /health answers, served by exec."""

    display: ClassVar[str]  # its name in messages: "vLLM"
    path_flag: ClassVar[str]  # fi-cache's option naming the engine to run: "--vllm"
    # An empty start is fine, and why (None: a start that saved nothing failed, empty_start).
    nothing_tuned: ClassVar[str | None] = None
    empty_start: ClassVar[str] = ""
    seeds: ClassVar[bool] = False  # fills the file it will read from earlier files first

    @abstractmethod
    def command_line(
        self, path: str | None, argv: Sequence[str]
    ) -> tuple[str | None, tuple[str, ...]]:
        """(The engine to run, its arguments) from a pasted engine command line."""

    def read(self, request: Request) -> CommandLine[ServedT]:
        """The command line read once, before anything is looked up: a pasted launcher taken
        out, the arguments parsed. Raises Refused where the engine would reject them."""
        path, argv = self.command_line(request.path, request.argv)
        return CommandLine(path=path, argv=argv, args=self.read_args(argv))

    @abstractmethod
    def resolve(
        self, request: Request, line: CommandLine[ServedT], store: Path
    ) -> Target[ServedT, LauncherT]:
        """The namespace: the engine's release and environment, its finalize rule. Raises
        Refused."""

    @abstractmethod
    def bind(self, target: Target[ServedT, LauncherT]) -> Run[ServedT, LauncherT]:
        """What will start on `target`: refusals that need its release, the launcher that
        starts it. Raises Refused."""

    def mode_problem(self, target: Target[ServedT, LauncherT], verb: str) -> ModeProblem | None:
        """Why the namespace's finalize mode would not be the one this engine runs (`verb`:
        "tune" for a warm, "serve")."""
        return None

    def keeps_no_cache(self, target: Target[ServedT, LauncherT]) -> str | None:
        """Why this release keeps no autotune cache at all (nothing to namespace)."""
        return None

    def announce(
        self, target: Target[ServedT, LauncherT], ns_dir: Path, environ: Mapping[str, str]
    ) -> list[str]:
        """What a user may not expect, said before the engine starts."""
        return []

    def autotune_dir(self, ns_dir: Path) -> Path:
        """Where its autotune files land in the namespace: what a warm watches and pre-flight
        checks."""
        return self.cache_dir(ns_dir)

    @abstractmethod
    def checked_against(self, run: Run[ServedT, LauncherT]) -> Versions:
        """The releases pre-flight judges the namespace's caches against."""

    def read_only_problem(self, run: Run[ServedT, LauncherT]) -> str | None:
        """Why this start fails on a read-only namespace even when it is fully warm."""
        return None

    def serve_without_warm(self, run: Run[ServedT, LauncherT]) -> str | None:
        """Why serve starts this cold namespace without a warm first (said as a warning)."""
        return None

    def before_serving(self, run: Run[ServedT, LauncherT], ns_dir: Path) -> list[str]:
        """Warnings about other servers, said just before serve hands over."""
        return []

    @abstractmethod
    def environment(
        self, run: Run[ServedT, LauncherT], ns_dir: Path, environ: Mapping[str, str], warm: bool
    ) -> dict[str, str]:
        """The environment the engine runs with on `ns_dir`, with what it needs there made
        (`warm`: for a warm, which writes into the namespace)."""

    @abstractmethod
    def command(self, run: Run[ServedT, LauncherT], port: int | None = None) -> list[str]:
        """The command line that starts it; `port`: a warm's, on loopback (None: serve's, as
        given)."""

    @abstractmethod
    def identity(self, run: Run[ServedT, LauncherT]) -> Identity:
        """What a warm record keeps of who warmed."""

    def same_model(self, run: Run[ServedT, LauncherT], argv: Sequence[str]) -> bool:
        """Does an earlier warm's argv serve this run's model (seeding's sources)?"""
        return False

    def seed_source(self, run: Run[ServedT, LauncherT], warm: WarmRecord) -> bool:
        """May an earlier warm's files seed this start's (seeding's sources)?"""
        return self.same_model(run, warm.argv)

    def seed_targets(
        self, run: Run[ServedT, LauncherT], ns_dir: Path, store: Path, stop: Event | None = None
    ) -> tuple[list[Path], str | None]:
        """(The files this start will read, inside `ns_dir`; why there is nothing to seed).
        `stop`: set when the answer is no longer wanted (raise FiCacheError then)."""
        return [], None

    def seed_targets_known(
        self, run: Run[ServedT, LauncherT], ns_dir: Path, store: Path
    ) -> tuple[list[Path], str | None] | None:
        """seed_targets' answer when it comes without seconds of work; None when it does not
        (vLLM's own code, not yet asked for these arguments): a warm then asks seed_targets
        while the engine starts, which reads its file only at its kernel warm-up."""
        return self.seed_targets(run, ns_dir, store)

    def seed_gap(
        self, run: Run[ServedT, LauncherT], tables: Sequence[tuple[Path, V1File]]
    ) -> str | None:
        """Why these planned seeds (target, table) must not be placed, in one line: the engine
        would take them as complete and tune nothing they lack (None: seed them)."""
        return None

    def one_rank(self, run: Run[ServedT, LauncherT]) -> bool:
        """This start is one rank on one node: it has no other rank's file to agree with."""
        return False

    def tune_groups(self, run: Run[ServedT, LauncherT]) -> Expected | None:
        """The deployment's tune groups where its arguments say and its files' names cannot
        (vLLM with pp > 1: each stage's TP group), for warm's align; None: the names say."""
        return None

    def rank_names(self, run: Run[ServedT, LauncherT]) -> Expected | None:
        """The deployment's rank files by name (every rank and this node's) where the engine's
        dir for them is known only on its worker (SGLang's key hash), so seed_targets cannot
        name them; None when seed_targets does, or one rank only."""
        return None
