"""A stand-in for a running `vllm preload` daemon, as /proc shows one: a process whose command
line is `PYTHON .../vllm preload --model M ...` (a script named vllm, as vLLM's console script
runs) and whose environment names its cache dir. It only waits for its stdin to close: no vLLM,
no GPU; what fi-cache reads of it is the real /proc of a real process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def preload_daemon(
    tmp: Path, env: dict[str, str], cwd: Path | None = None, options: tuple[str, ...] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """A `vllm preload` process running with `env` (added to a bare environment) until the
    block ends; `options`: the daemon's own, after the engine's arguments."""
    bindir = tmp / "standin-bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "vllm"
    # Says it runs (its /proc entry is then whole), and lives until its stdin closes.
    script.write_text("import sys\nprint('up', flush=True)\nsys.stdin.read()\n")
    argv = [
        sys.executable,
        str(script),
        "preload",
        "--model",
        "Qwen/Qwen3-8B",
        "-tp",
        "2",
        *options,
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=cwd or tmp,
        env={"PATH": os.environ["PATH"], **env},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
