"""fi_cache/engines/server.py: an engine's server starts only once the guard that stops it runs
(a fi-cache killed in between leaves no engine), its pid is the engine's, and an engine that
cannot be executed is refused in one line, as Popen words it, with nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fi_cache.engines.server import Server, free_port
from fi_cache.errors import Refused
from tests.conftest import ROOT

FAKE_VLLM = ROOT / "tests" / "fake_vllm.py"

# fi-cache SIGKILLed right after it started the engine's process, before its guard ran: the guard
# is replaced (in this child only) by a SIGKILL of the process itself.
_KILLED_BEFORE_THE_GUARD = """
import json, os, signal, sys
from pathlib import Path
from fi_cache.engines import guard, server

def killed_before_the_guard(pgid, grace, keep_fds=()):
    print(pgid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

server.Guard = guard.Guard = killed_before_the_guard
cmd, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
server.Server(cmd, env, lock_dir=Path(sys.argv[3]))
"""


def _fake_vllm(record: Path) -> tuple[list[str], dict[str, str]]:
    cmd = [sys.executable, str(FAKE_VLLM), "serve", "some/model", "--port", str(free_port())]
    return cmd, {**os.environ, "FAKE_VLLM_RECORD": str(record), "FAKE_VLLM_MODE": "hang"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except (OSError, IndexError):
        return False


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_fi_cache_killed_before_the_guard_ran_leaves_no_engine(tmp_path: Path) -> None:
    """The attack's window: 7 of 7 SIGKILLs there left vLLM (and its children) running."""
    record = tmp_path / "record"
    record.mkdir()
    cmd, env = _fake_vllm(record)
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_BEFORE_THE_GUARD,
            json.dumps(cmd),
            json.dumps(env),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pid = int(killed.stdout)
    try:
        assert _gone(pid, 10), "the engine's process outlived the fi-cache that started it"
        time.sleep(1)  # the stand-in records its start within milliseconds of running
        assert not (record / "starts.jsonl").exists(), "the engine ran without a guard"
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_the_server_pid_is_the_engines_and_stop_ends_it(tmp_path: Path) -> None:
    """What stop and the guard signal is the engine's group, not a launcher's."""
    cmd, env = _fake_vllm(tmp_path)
    server = Server(cmd, env, lock_dir=tmp_path, grace=2)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "starts.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        [start] = [json.loads(s) for s in (tmp_path / "starts.jsonl").read_text().splitlines()]
        assert start["pid"] == server.proc.pid
    finally:
        server.stop(2)
    assert not _alive(server.proc.pid)


@pytest.mark.parametrize(
    ("engine", "why"),
    [
        ("missing", "No such file or directory"),
        ("not-on-path", "No such file or directory"),
        ("not-executable", "Permission denied"),
    ],
)
def test_an_engine_that_cannot_be_executed_is_refused_saying_why(
    tmp_path: Path, engine: str, why: str
) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    cmd = {
        "missing": [str(tmp_path / "no-vllm"), "serve"],
        "not-on-path": ["no-such-vllm-anywhere", "serve"],
        "not-executable": [str(script), "serve"],
    }[engine]
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    started = time.monotonic()
    with pytest.raises(Refused, match=f": cannot start vLLM: {why}$"):
        Server(cmd, env, lock_dir=tmp_path)
    assert time.monotonic() - started < 10  # refused at once, not after a health timeout


def _time_wait_on(port: int) -> None:
    """A server on `port` that closed an accepted connection first: the port is left in
    TIME_WAIT, as a stopped warm's /health polls leave it."""
    import socket

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = listener.accept()
            conn.close()  # the server side closes first: its end goes to TIME_WAIT
            client.recv(1)


def test_a_port_a_stopped_server_just_left_is_free_and_a_listened_one_is_not() -> None:
    """A warm on --port P right after another warm on P (TIME_WAIT, no listener) starts; one
    where something listens is refused."""
    import socket

    from fi_cache.engines.server import port_in_use

    port = free_port()
    _time_wait_on(port)
    assert not port_in_use(port)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port := free_port()))
        busy.listen()
        assert port_in_use(port)
