"""Commands that only read files import no torch, FlashInfer, vLLM or Mooncake (each costs seconds).

Each command runs in a fresh interpreter, as a user's would, and reports the heavy modules it
ended up holding; `python -X importtime` shows the same by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = FIXTURES / "h200" / "flashinfer-0.6.18-gemm.json"
LOG = FIXTURES / "h200" / "flashinfer-0.6.18-tune.log"
HEAVY = ("torch", "flashinfer", "vllm", "sglang", "mooncake", "fsspec")

_CHILD = """
import json, sys
from fi_cache.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(HEAVY)))
print("HEAVY=" + json.dumps(heavy), file=sys.stderr)
"""


def _heavy_modules_after(tmp_path: Path, *args: str) -> list[str]:
    child = _CHILD.replace("json.loads(HEAVY)", repr(list(HEAVY)))
    done = subprocess.run(
        [sys.executable, "-c", child, "--store", str(tmp_path / "store"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    [line] = [s for s in done.stderr.splitlines() if s.startswith("HEAVY=")]
    return list(json.loads(line.removeprefix("HEAVY=")))


@pytest.mark.parametrize(
    "args",
    [
        ("ls", "--no-store", str(GEMM)),
        ("show", str(GEMM)),
        ("verify", str(GEMM)),
        ("diff", str(GEMM), str(GEMM)),
        ("doctor", "--flashinfer-version", "0.6.18", "--gpu", "NVIDIA H200", str(GEMM)),
        ("doctor", "--log", str(LOG)),
        ("coverage", str(GEMM), "--log", str(LOG)),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_command_that_only_reads_files_imports_nothing_heavy(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    assert _heavy_modules_after(tmp_path, *args) == []
