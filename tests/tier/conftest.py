"""A real Mooncake store for the tier tests (mooncake_rig.py), started once per session. Skips
where the [mooncake] extra is missing or its native libraries cannot load; under scripts/test.sh
(FI_CACHE_REQUIRE_FLASHINFER=1) an installed but broken package fails instead."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from mooncake_rig import Rig, RigFailed, master_binary, running

SEGMENT_BYTES = 160 << 20  # room for the 64 MiB refusal test and the tables
Tier = Rig


def _unavailable(why: str) -> None:
    if importlib.util.find_spec("mooncake") is not None and os.environ.get(
        "FI_CACHE_REQUIRE_FLASHINFER"
    ):
        pytest.fail(f"Mooncake is installed but {why}")
    pytest.skip(f"no Mooncake store: {why} (pip install 'fi-cache[mooncake]')")


@pytest.fixture(scope="session")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if importlib.util.find_spec("mooncake") is None:
        _unavailable("the mooncake package is not installed")
    probe = subprocess.run(
        [sys.executable, "-c", "import mooncake.store"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        _unavailable(f"mooncake.store does not load ({last})")
    if master_binary() is None:
        _unavailable("no mooncake_master binary")
    try:
        with running(tmp_path_factory.mktemp("mooncake"), SEGMENT_BYTES) as rig:
            yield rig
    except RigFailed as exc:
        pytest.fail(str(exc))
