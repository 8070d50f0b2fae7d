"""Processes of this user that /proc shows (Linux; elsewhere none): the engines and daemons that
may be writing a cache dir. A process's environment is read only when its command line is the
one looked for."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Process(Generic[T]):
    pid: int
    argv: list[str]
    environ: dict[str, str]
    extra: T  # what the caller also read of it while it ran (its cwd, its session)


def matching(
    wanted: Callable[[Sequence[str]], bool], extra: Callable[[str], T]
) -> list[Process[T]]:
    """Every other process whose command line `wanted` accepts, with `extra(pid)`; one that is
    gone or another user's (its files unreadable) is left out."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    found = []
    for pid in pids:
        if int(pid) == os.getpid():
            continue
        try:
            raw_argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            words = [w.decode(errors="replace") for w in raw_argv if w]
            if not wanted(words):
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            more = extra(pid)
        except (OSError, ValueError):
            continue
        env = dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw if b"=" in kv)
        found.append(Process(int(pid), words, env, more))
    return found
