"""The child process that holds a Mooncake client for fi-cache (`python -m fi_cache.tier.worker`).

Mooncake's `setup` against a master that does not answer retries and then waits forever, inside
native code: only a separate process can be given a deadline (tier/mooncake.py kills it). It
reads one JSON request a line on stdin and answers one JSON line on stdout; its native logs go
where the parent sends its stderr. It mounts no segment: a short-lived process must never hold
the fleet's tables (they would vanish with it).
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import time
from typing import Any

# Mooncake's answers (mooncake-store types.h): no such object; a reader's lease still holds it.
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
_CLOSE_S = 10  # unregistering from the master takes about a second


def _setup(store: Any, req: dict[str, Any]) -> int:
    kwargs: dict[str, Any] = {}
    if req.get("tenant_id", "default") != "default":
        kwargs["tenant_id"] = req["tenant_id"]
    return int(
        store.setup(
            req["local_hostname"],
            req["metadata_server"],
            0,  # global segment: none (see the module docstring)
            req["local_buffer_size"],
            req["protocol"],
            req["device_name"],
            req["master_server_address"],
            **kwargs,
        )
    )


def _remove(store: Any, key: str, wait_s: float) -> int:
    """Remove, waiting out read leases (a reader's lease, ours included, lasts seconds)."""
    deadline = time.monotonic() + wait_s
    while True:
        ret = int(store.remove(key))
        if ret != OBJECT_HAS_LEASE or time.monotonic() > deadline:
            return ret
        time.sleep(0.05)


def handle(store: Any, req: dict[str, Any]) -> dict[str, Any]:
    op = req["op"]
    if op == "exists":
        return {"found": [int(x) == 1 for x in store.batch_is_exist(req["keys"])]}
    if op == "size":
        return {"size": int(store.get_size(req["key"]))}
    if op == "get":
        return {"data": base64.b64encode(store.get(req["key"])).decode()}
    if op == "put":  # first writer wins, as vLLM's MooncakeArtifactStore.put
        if int(store.is_exist(req["key"])) == 1:
            return {"ret": 0, "written": False}
        ret = int(store.put(req["key"], base64.b64decode(req["data"])))
        return {"ret": ret, "written": ret == 0}
    if op == "remove":
        return {"ret": _remove(store, req["key"], float(req.get("wait_s", 0)))}
    return {"error": f"unknown op {op!r}"}


def main() -> int:
    import os

    # Replies get a private copy of stdout; anything native code prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "setup":
            reply: dict[str, Any] = {"ret": _setup(store, req)}
        else:
            reply = handle(store, req)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    out.close()
    signal.alarm(_CLOSE_S)  # the parent no longer waits: never outlive it by more than this
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
