"""A real Mooncake store on loopback, for the tier tests (conftest.py) and benchmarks/bench_tier.py:
`mooncake_master` with its embedded HTTP metadata server on free 127.0.0.1 ports, and a client
that holds a memory segment (fi-cache mounts none: someone must hold the tables, as a fleet's
daemons or a `mooncake_client` would). Every socket is on 127.0.0.1; starting is bounded."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
READY_WAIT_S = 20.0


class RigFailed(RuntimeError):
    """The master or the segment holder did not start (the message says where its log is)."""


@dataclass(frozen=True)
class Rig:
    config: Path  # the MOONCAKE_CONFIG_PATH JSON
    env: dict[str, str]  # os.environ + MOONCAKE_CONFIG_PATH + loopback binding


def master_binary() -> str | None:
    beside = Path(sys.executable).parent / "mooncake_master"
    return str(beside) if beside.exists() else shutil.which("mooncake_master")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@contextmanager
def running(work: Path, segment_bytes: int, timeout_s: str = "20") -> Iterator[Rig]:
    master = master_binary()
    if master is None:
        raise RigFailed("no mooncake_master binary")
    rpc, http, metrics = _free_port(), _free_port(), _free_port()
    with open(work / "master.log", "wb") as log:
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
                raise RigFailed(f"mooncake_master did not start: see {work / 'master.log'}")
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
            "FI_CACHE_TIER_TIMEOUT_S": timeout_s,
        }
        holder = subprocess.Popen(
            [sys.executable, str(HERE / "pool_holder.py"), str(config), str(segment_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**env, "GLOG_minloglevel": "2"},
        )
        assert holder.stdout is not None
        line = holder.stdout.readline().decode().strip()  # the holder answers or exits
        if line != "ready":
            raise RigFailed(f"the Mooncake segment holder did not start ({line or 'exited'})")
        yield Rig(config, env)
    finally:
        if holder is not None:
            if holder.stdin is not None:
                holder.stdin.close()
            _stop(holder)
            if holder.stdout is not None:
                holder.stdout.close()
        _stop(proc)
