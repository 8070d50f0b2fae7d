"""A Mooncake client that only holds memory for the tier tests (as a fleet's daemons or a
`mooncake_client` would): fi-cache mounts no segment, so someone else must hold the tables.
Run as `python pool_holder.py CONFIG_JSON SEGMENT_BYTES`; prints "ready", exits at stdin's EOF."""

from __future__ import annotations

import json
import sys


def main() -> int:
    from mooncake.store import MooncakeDistributedStore

    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    store = MooncakeDistributedStore()
    ret = store.setup(
        "127.0.0.1",
        cfg["metadata_server"],
        int(sys.argv[2]),
        16 << 20,
        "tcp",
        "",
        cfg["master_server_address"],
    )
    print("ready" if ret == 0 else f"setup failed {ret}", flush=True)
    sys.stdin.read()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
