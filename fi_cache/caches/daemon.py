"""vLLM preload daemons running on this machine, as /proc shows them, and the cache root each
writes. `vllm preload` (0.33+) tunes FlashInfer into the engine's per-rank files and, with
`--seed-source-*`, installs a peer's table over a local file (warmup_cache.py 0.34:79-116,
seed.py 0.34:102-130): fi-cache's align and seeding leave a dir such a daemon writes alone.

Its spawned workers inherit its environment (entrypoints/cli/preload.py 0.34:317, "spawn"), and
the `vllm preload` process lives as long as they do, so that process alone names the root:
VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, else $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<FlashInfer
workspace> (flashinfer_autotune_root, warmup/flashinfer_autotune_cache.py 0.34:40-53; the
workspace part needs FlashInfer, so the whole flashinfer_autotune_cache dir counts).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fi_cache.caches.processes import matching
from fi_cache.versions import (
    MOONCAKE_CONFIG_ENV,
    PRELOAD_STORES_FLAG,
    PRELOAD_SUBCOMMAND,
    VLLM_CACHE_DIR_ENV,
    VLLM_CACHE_SUBDIR,
    VLLM_CLI_MODULE,
)

# `vllm` is vLLM's console script; `python -m` of its module reaches the same main.
_CLI_MODULES = frozenset({"vllm", VLLM_CLI_MODULE})


@dataclass(frozen=True)
class Daemon:
    """One running `vllm preload`: its pid, the root its ranks write, and its command line."""

    pid: int
    root: str  # real path
    argv: tuple[str, ...]
    mooncake_config: str | None = None  # its MOONCAKE_CONFIG_PATH, absolute

    def describe(self) -> str:
        return f"vLLM's preload daemon (pid {self.pid}) writes {self.root}"

    @property
    def stores(self) -> tuple[str, ...]:
        """Its --warmup-cache-stores names (preload.py 0.34:330-334: comma-separated)."""
        raw = ""
        for i, word in enumerate(self.argv):
            if word == PRELOAD_STORES_FLAG and i + 1 < len(self.argv):
                raw = self.argv[i + 1]
            elif word.startswith(PRELOAD_STORES_FLAG + "="):
                raw = word.partition("=")[2]
        return tuple(n.strip() for n in raw.split(",") if n.strip())


def is_preload(cmdline: Sequence[str]) -> bool:
    """`vllm preload ...`, `PYTHON PATH/vllm preload ...` (the console script behind its
    interpreter), or `PYTHON -m vllm.entrypoints.cli.main preload ...`."""
    words = list(cmdline[:4])
    if words and os.path.basename(words[0]).startswith("python"):
        words = words[1:]  # the interpreter running the script or module
        if words[:1] == ["-m"] and words[1:2] and words[1] in _CLI_MODULES:
            return words[2:3] == [PRELOAD_SUBCOMMAND]
    return (
        bool(words) and os.path.basename(words[0]) == "vllm" and words[1:2] == [PRELOAD_SUBCOMMAND]
    )


def root(environ: Mapping[str, str], cwd: str = "/") -> str:
    """The dir a daemon with `environ`, started in `cwd`, writes its per-rank files under."""
    override = environ.get(VLLM_CACHE_DIR_ENV)
    if override:
        base = os.path.expanduser(override)
    else:  # VLLM_CACHE_ROOT as envs.py reads it: an empty value counts as set
        xdg = environ.get("XDG_CACHE_HOME", os.path.join(environ.get("HOME", "~"), ".cache"))
        base = os.path.join(
            os.path.expanduser(environ.get("VLLM_CACHE_ROOT", os.path.join(xdg, "vllm"))),
            VLLM_CACHE_SUBDIR,
        )
    return os.path.realpath(os.path.join(cwd, base))  # a relative root is the daemon's cwd's


def daemons(procs: Iterable[tuple[int, Sequence[str], Mapping[str, str], str]]) -> list[Daemon]:
    """The preload daemons among (pid, cmdline, environ, cwd) rows."""
    return [
        Daemon(pid, root(environ, cwd), tuple(cmdline), _config(environ, cwd))
        for pid, cmdline, environ, cwd in procs
        if is_preload(cmdline)
    ]


def _config(environ: Mapping[str, str], cwd: str) -> str | None:
    path = environ.get(MOONCAKE_CONFIG_ENV)
    return os.path.join(cwd, os.path.expanduser(path)) if path else None


def running() -> list[Daemon]:
    """The preload daemons this user can see (Linux /proc; elsewhere none)."""
    found = matching(is_preload, lambda pid: os.readlink(f"/proc/{pid}/cwd"))
    return daemons((p.pid, p.argv, p.environ, p.extra) for p in found)


def writing(path: Path, found: Sequence[Daemon] | None = None) -> Daemon | None:
    """The running daemon whose root holds `path` or lies inside it (a store or namespace dir
    given whole), if any. `found`: the daemons to look among (default: those running now)."""
    real = os.path.realpath(path)
    for d in running() if found is None else found:
        if _within(real, d.root) or _within(d.root, real):
            return d
    return None


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)
