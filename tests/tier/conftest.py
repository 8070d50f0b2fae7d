"""A real Mooncake store for the tier tests: `mooncake_master` (embedded HTTP metadata server) on
free loopback ports, and a client holding a memory segment (fi-cache mounts none), started once
per session. Every socket is on 127.0.0.1. Skips where the [mooncake] extra is missing or its
native libraries cannot load; under scripts/test.sh (FI_CACHE_REQUIRE_FLASHINFER=1) an installed
but broken package fails instead."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
READY_WAIT_S = 20.0
SEGMENT_BYTES = 160 << 20  # room for the 64 MiB refusal test and the tables


@dataclass(frozen=True)
class Tier:
    config: Path  # the MOONCAKE_CONFIG_PATH JSON
    env: dict[str, str]  # os.environ + MOONCAKE_CONFIG_PATH + loopback binding

    def url(self, key: str) -> str:
        return "mooncake://" + key


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unavailable(why: str) -> None:
    if importlib.util.find_spec("mooncake") is not None and os.environ.get(
        "FI_CACHE_REQUIRE_FLASHINFER"
    ):
        pytest.fail(f"Mooncake is installed but {why}")
    pytest.skip(f"no Mooncake store: {why} (pip install 'fi-cache[mooncake]')")


def _master_binary() -> str | None:
    beside = Path(sys.executable).parent / "mooncake_master"
    return str(beside) if beside.exists() else shutil.which("mooncake_master")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    if importlib.util.find_spec("mooncake") is None:
        _unavailable("the mooncake package is not installed")
    probe = subprocess.run(
        [sys.executable, "-c", "import mooncake.store"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        _unavailable(f"mooncake.store does not load ({last})")
    master = _master_binary()
    if master is None:
        _unavailable("no mooncake_master binary")
    assert master is not None
    rpc, http, metrics = _free_port(), _free_port(), _free_port()
    work = tmp_path_factory.mktemp("mooncake")
    log = open(work / "master.log", "wb")  # noqa: SIM115 (closed after the session)
    proc = subprocess.Popen(
        [
            master,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={http}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
            "--default_kv_lease_ttl=200ms",  # evict's removal waits out read leases
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    holder: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + READY_WAIT_S
        while not (_listening(rpc) and _listening(http)):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mooncake_master did not start: see {work / 'master.log'}")
            time.sleep(0.05)
        config = work / "mooncake.json"
        config.write_text(
            json.dumps(
                {
                    "local_hostname": "127.0.0.1",
                    "metadata_server": f"http://127.0.0.1:{http}/metadata",
                    "master_server_address": f"127.0.0.1:{rpc}",
                    "protocol": "tcp",
                    "device_name": "",
                    "global_segment_size": "32MB",  # what vLLM's daemon clients mount
                    "local_buffer_size": "80MB",
                }
            )
        )
        env = {
            **os.environ,
            "MOONCAKE_CONFIG_PATH": str(config),
            "MC_TCP_BIND_ADDRESS": "127.0.0.1",
            "FI_CACHE_TIER_TIMEOUT_S": "20",
        }
        holder = subprocess.Popen(
            [sys.executable, str(HERE / "pool_holder.py"), str(config), str(SEGMENT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**env, "GLOG_minloglevel": "2"},
        )
        assert holder.stdout is not None
        line = holder.stdout.readline().decode().strip()  # the holder answers or exits
        if line != "ready":
            pytest.fail(f"the Mooncake pool holder did not start ({line or 'exited'})")
        yield Tier(config, env)
    finally:
        if holder is not None:
            if holder.stdin is not None:
                holder.stdin.close()
            _stop(holder)
        _stop(proc)
        log.close()
