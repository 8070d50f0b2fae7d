"""Start one process per rank of a gloo group and read each one's JSON line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


def run_ranks(argvs: Sequence[Sequence[str]], env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every rank's last stdout line, parsed, in rank order; a rank that fails fails the test."""
    procs = [
        subprocess.Popen(
            list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv in argvs
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out
