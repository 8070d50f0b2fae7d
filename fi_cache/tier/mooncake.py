"""fi-cache's one Mooncake client: a worker child process (tier/worker.py) under deadlines.

Every write fi-cache makes to the tier goes through `publish` and `remove` here, as every write
to disk goes through fi_cache/store/files.py. An unreachable master is a Refused (exit 2) after
the timeout, never a hang: the parent waits on a pipe with a deadline and kills the child.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fi_cache.errors import FiCacheError, Refused
from fi_cache.tier import config as tier_config
from fi_cache.tier.worker import OBJECT_HAS_LEASE, OBJECT_NOT_FOUND

DEBUG_ENV = "FI_CACHE_TIER_DEBUG"  # set: the worker's native logs reach stderr
_BUFFER_SLACK = 4 << 20


class TierError(FiCacheError):
    """The tier failed an operation it accepted (exit 1)."""


@dataclass(frozen=True)
class Published:
    key: str
    written: bool  # False: the key already held a table (first writer wins)


def _missing_package() -> Refused:
    return Refused(
        "the Mooncake client is not installed: pip install 'fi-cache[mooncake]' "
        "(mooncake-transfer-engine-non-cuda)"
    )


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # EPIPE: the worker died with unread input
                pipe.close()


class TierClient:
    """Open with `with TierClient.connect(environ, max_bytes) as tier:`."""

    def __init__(self, cfg: tier_config.TierConfig, proc: subprocess.Popen[bytes], timeout: float):
        self.cfg = cfg
        self._proc = proc
        self._timeout = timeout
        self._buf = b""

    @classmethod
    def connect(cls, environ: Mapping[str, str], max_bytes: int) -> TierClient:
        cfg = tier_config.load(environ)
        timeout = tier_config.timeout_s(environ)
        import importlib.util

        if importlib.util.find_spec("mooncake") is None:
            raise _missing_package()
        env = dict(environ)
        env.setdefault("GLOG_minloglevel", "2")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fi_cache.tier.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if environ.get(DEBUG_ENV) else subprocess.DEVNULL,
            env=env,
        )
        client = cls(cfg, proc, timeout)
        try:
            reply = client._call(
                {
                    "op": "setup",
                    "local_hostname": cfg.local_hostname,
                    "metadata_server": cfg.metadata_server,
                    "master_server_address": cfg.master_server_address,
                    "protocol": cfg.protocol,
                    "device_name": cfg.device_name,
                    "tenant_id": cfg.tenant_id,
                    "local_buffer_size": max_bytes + _BUFFER_SLACK,
                },
                what="connect to",
            )
            if reply.get("ret") != 0:
                raise Refused(
                    f"Mooncake refused the connection (setup answered {reply.get('ret')}): "
                    f"check master_server_address {cfg.master_server_address} and "
                    f"metadata_server {cfg.metadata_server}",
                    cfg.path,
                )
        except BaseException:
            client.close()
            raise
        return client

    def __enter__(self) -> TierClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the worker: at EOF it unregisters from the master (about a second, a heartbeat
        away) on its own, bounded by an alarm, so the command does not wait for it."""
        proc = self._proc
        if proc.poll() is not None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
        except OSError:
            proc.kill()
        threading.Thread(target=_reap, args=(proc,), daemon=True).start()  # never joined

    def _call(self, req: dict[str, Any], what: str = "reach") -> dict[str, Any]:
        """One request, one reply, within the timeout; a dead or silent worker is Refused."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        where = f"{self.cfg.master_server_address} ({self.cfg.path})"
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            raise Refused(f"cannot {what} the Mooncake master {where}: the client died") from None
        deadline = time.monotonic() + self._timeout
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    proc.kill()
                    _reap(proc)
                    raise Refused(
                        f"cannot {what} the Mooncake master {where}: no answer in "
                        f"{self._timeout:g} s ({tier_config.TIMEOUT_ENV} sets the wait)"
                    )
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    _reap(proc)
                    raise Refused(
                        f"cannot {what} the Mooncake master {where}: the client exited "
                        f"({proc.returncode}); {DEBUG_ENV}=1 shows its log"
                    )
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise TierError(str(reply["error"]), self.cfg.path)
        return reply

    # --- reads -----------------------------------------------------------------------------

    def exists(self, keys: list[str]) -> list[bool]:
        if not keys:
            return []
        found: list[bool] = self._call({"op": "exists", "keys": keys})["found"]
        return found

    def size(self, key: str) -> int | None:
        """The value's size in bytes, None when the key holds nothing."""
        size = int(self._call({"op": "size", "key": key})["size"])
        if size == OBJECT_NOT_FOUND:
            return None
        if size < 0:
            raise TierError(f"Mooncake answered {size} for its size", key)
        return size

    def get(self, key: str) -> bytes:
        """The value (call `size` first: this reads it all). Empty: gone, or a native error."""
        return base64.b64decode(self._call({"op": "get", "key": key})["data"])

    # --- the only writes -------------------------------------------------------------------

    def publish(self, key: str, data: bytes) -> Published:
        """Put as vLLM's daemon does: a key that holds a value keeps it (first writer wins)."""
        reply = self._call({"op": "put", "key": key, "data": base64.b64encode(data).decode()})
        if reply["ret"] != 0:
            raise TierError(
                f"Mooncake refused the put ({reply['ret']}): no segment with room? fi-cache "
                "mounts none; the daemons or a mooncake_client hold the tier's data",
                key,
            )
        return Published(key, bool(reply["written"]))

    def remove(self, key: str) -> bool:
        """Remove the key, waiting out read leases up to the timeout. False: it was not there."""
        ret = int(self._call({"op": "remove", "key": key, "wait_s": self._timeout / 2})["ret"])
        if ret == OBJECT_NOT_FOUND:
            return False
        if ret == OBJECT_HAS_LEASE:
            raise TierError("a reader still holds a lease on it: try again in a few seconds", key)
        if ret != 0:
            raise TierError(f"Mooncake refused the removal ({ret})", key)
        return True
