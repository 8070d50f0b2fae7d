"""SGLang servers running on this machine, as /proc shows them: which cache dir, GPUs and MoE
backend each uses. For --moe-runner-backend flashinfer_megamoe (0.5.22+) SGLang says engines
sharing physical GPUs must use separate SGLANG_CACHE_DIRs (flashinfer_autotune.py 0.5.22:176-189:
its records need one writer per file; ordinary tactics are merged best-effort): doctor and serve
look for two that do not."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fi_cache.caches.processes import matching
from fi_cache.engines.sglang.layout import user_cache_dir
from fi_cache.versions import SGLANG_LAUNCH_MODULE


@dataclass(frozen=True)
class Engine:
    """One SGLang server: its process tree (one session), its cache dir and visible GPUs."""

    pid: int  # its lowest pid: the launcher
    session: int
    cache_dir: str
    devices: frozenset[str] | None  # CUDA_VISIBLE_DEVICES; None: all of the machine's GPUs
    backend: str | None = None  # --moe-runner-backend on its command line

    @property
    def gpus(self) -> str:
        return ",".join(sorted(self.devices)) if self.devices is not None else "all"


def is_sglang(cmdline: Sequence[str]) -> bool:
    """`sglang serve ...`, `python -m sglang.launch_server ...`, or one of its processes
    (SGLang names them `sglang::scheduler_TP0` and so on)."""
    if cmdline and cmdline[0].startswith("sglang::"):
        return True
    for i, word in enumerate(cmdline):
        if os.path.basename(word) == "sglang" and cmdline[i + 1 : i + 2] == ["serve"]:
            return True
        if word == "-m" and cmdline[i + 1 : i + 2] == [SGLANG_LAUNCH_MODULE]:
            return True
    return False


def devices(environ: Mapping[str, str]) -> frozenset[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return frozenset(d.strip() for d in value.split(",") if d.strip())


def share_gpus(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    """Whether two CUDA_VISIBLE_DEVICES lists can name one GPU (unset: every GPU)."""
    return a is None or b is None or bool(a & b)


def backend(cmdline: Sequence[str]) -> str | None:
    """--moe-runner-backend of an SGLang command line (None: not given, or not readable)."""
    from fi_cache.engines.sglang.args import parse_sglang_args
    from fi_cache.errors import Refused

    for i, word in enumerate(cmdline):
        if word in ("serve", SGLANG_LAUNCH_MODULE):
            try:
                return parse_sglang_args(cmdline[i + 1 :]).moe_backend
            except Refused:
                return None
    return None


def engines(procs: Iterable[tuple[int, int, Sequence[str], Mapping[str, str]]]) -> list[Engine]:
    """The SGLang servers among (pid, session, cmdline, environ) rows, one per session (its
    launcher's pid, the backend of whichever process of it names one)."""
    found: dict[int, Engine] = {}
    for pid, session, cmdline, environ in procs:
        if not is_sglang(cmdline):
            continue
        cache_dir = os.path.realpath(user_cache_dir(environ))
        here = Engine(pid, session, cache_dir, devices(environ), backend(cmdline))
        if session in found:
            was = found[session]
            first = here if pid < was.pid else was
            here = replace(first, backend=was.backend or here.backend)
        found[session] = here
    return sorted(found.values(), key=lambda e: e.pid)


def running() -> list[Engine]:
    """The SGLang servers this user can see (Linux /proc; elsewhere none)."""
    found = matching(is_sglang, lambda pid: os.getsid(int(pid)))
    return engines((p.pid, p.extra, p.argv, p.environ) for p in found)


MEGAMOE = "flashinfer_megamoe"


def sharing(
    engines_: Sequence[Engine], cache_dir: str, gpus: frozenset[str] | None, backend: str | None
) -> list[Engine]:
    """The running servers that would write the same MegaMoE rank files as a server of
    `backend` on `cache_dir` and `gpus`: same dir, GPUs that can overlap, one of them MegaMoE."""
    real = os.path.realpath(cache_dir)
    return [
        e
        for e in engines_
        if e.cache_dir == real and share_gpus(e.devices, gpus) and MEGAMOE in (e.backend, backend)
    ]
