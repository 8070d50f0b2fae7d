"""What the doctor tests type: `fi-cache --format json doctor`, an SGLang target, two TP ranks'
files, and the findings of one check in the JSON document doctor prints."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import MOE_618_FUSED
from tests.sglang_layout import sglang_paths

# The command whose JSON document (cli.md's contract) the tests read findings from.
JSON_DOCTOR = ("--format", "json", "doctor")


def sglang_serve(line: str) -> tuple[str, ...]:
    """`-- --model-path M LINE`: the `sglang serve` arguments doctor is given after its own, LINE
    split as a shell splits it."""
    return ("--", "--model-path", "M", *shlex.split(line))


# Node 0 of two, TP 4: this node writes tp0 and tp1, node 1 the rest.
NODE_0_OF_2_TP_4 = sglang_serve("--tp-size 4 --nnodes 2 --node-rank 0")


def sglang_target(sglang: str, flashinfer: str | None = None) -> tuple[str, ...]:
    """--flashinfer-version (where given) and --sglang-version, as a user names the stack."""
    fi = ("--flashinfer-version", flashinfer) if flashinfer else ()
    return (*fi, "--sglang-version", sglang)


def findings(doc: dict[str, Any], check: str) -> list[dict[str, Any]]:
    """One check's findings in doctor's JSON document."""
    return [f for f in doc["findings"] if f["check"] == check]


def two_tp_ranks(tmp_path: Path, second: Path = MOE_618_FUSED) -> tuple[Path, Path]:
    """SGLang 0.5.18's TP 2 rank files under tmp_path: rank 0 real FlashInfer 0.6.18, rank 1
    `second`."""
    a, _ = sglang_paths("0.5.18", tmp_path, tp=2, tp_rank=0)
    b, _ = sglang_paths("0.5.18", tmp_path, tp=2, tp_rank=1)
    shutil.copy(MOE_618_FUSED, a)
    shutil.copy(second, b)
    return a, b
