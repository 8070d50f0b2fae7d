#!/usr/bin/env python3
"""`fi-cache pull` + import of a ~100 MB namespace from S3 over loopback HTTP (goal: < 5 s).

    .venv/bin/python benchmarks/bench_pull.py                 # full run (about a minute)
    .venv/bin/python benchmarks/bench_pull.py --mb 20 --runs 3  # a smoke test

Starts moto's standalone S3 server on 127.0.0.1 (nothing else is contacted), builds a store
whose namespace for this machine holds ~100 MB of real-format FlashInfer cache files
(bench_inventory.EntryFactory: the fixtures' key patterns, FlashInfer 0.6.18's byte layout),
pushes it once, then times `fi-cache pull s3://...` into an empty store as a subprocess
(interpreter start-up, environment probe, download, sha256 check, full bundle verification
and install included): median / min / max of --runs. s3fs finds the server through
FSSPEC_S3_ENDPOINT_URL, as a user's MinIO or Ceph would be found.

Cache files compress about 50x, so the bundle moved is a few MB. A second measurement moves
one incompressible object of the same size (--mb) through pull's download path (streamed
into the store, sha256-checked) to show the transfer itself would hold at 100 MB on the wire.
Everything lives under a tempfile.TemporaryDirectory and is removed afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from bench_inventory import EntryFactory  # noqa: E402

GOAL_S = 5.0
BUCKET = "fi-cache-bench"
ENTRIES_PER_FILE = 100_000
ENTRY = "import sys; from fi_cache.cli import main; main(sys.argv[1:])"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_s3() -> tuple[Any, dict[str, str]]:
    """moto on loopback, this process's environment pointed at it, and the bucket."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise SystemExit("bench: needs moto[server] and s3fs (the test extra)") from None
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }
    os.environ.update(env)  # before fsspec's first import: it reads FSSPEC_* then
    import fsspec

    fsspec.filesystem("s3").mkdir(BUCKET)
    return server, env


def build_store(store: Path, target_mb: float) -> tuple[Any, int]:
    """This machine's fused namespace with ~target_mb of cache files; (fingerprint, bytes)."""
    from fi_cache import environment
    from fi_cache.store import manifest as manifests
    from fi_cache.store.namespace import Namespace
    from fi_cache.store.paths import state_dir

    fp = environment.detect(state_dir(store)).fingerprint
    ns = Namespace(fp, "fused")
    ns_dir = ns.path(store)
    cache_dir = ns_dir / "vllm"  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, as warm sets it
    cache_dir.mkdir(parents=True)
    factory = EntryFactory()
    per_entry = len(factory.file_text(1000, seed=0)) / 1000
    total, i = 0, 0
    while total < target_mb * 1e6:
        n = min(ENTRIES_PER_FILE, max(1000, int((target_mb * 1e6 - total) / per_entry)))
        data = factory.file_text(n, seed=i).encode()
        (cache_dir / f"autotune_configs_dp0_rank{i}.json").write_bytes(data)
        total, i = total + len(data), i + 1
    manifests.save(ns_dir, manifests.Manifest.new(ns))
    return fp, total


def cli(env: dict[str, str], *args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, *args], env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench: fi-cache {' '.join(args)} failed: {done.stderr.strip()}")
    return elapsed


def tree_digest(store: Path) -> str:
    h = hashlib.sha256()
    for p in sorted((store / "namespaces").rglob("*.json")):
        h.update(p.relative_to(store).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def stats_line(name: str, times: list[float]) -> str:
    return (
        f"  {name}: median {statistics.median(times):.3f} s  "
        f"min {min(times):.3f}  max {max(times):.3f}  (n={len(times)})"
    )


def bench_pull(tmp: Path, env: dict[str, str], target_mb: float, runs: int) -> float:
    from fi_cache.fleet.bundle import remote_key

    store = tmp / "store-a"
    t0 = time.perf_counter()
    fp, total = build_store(store, target_mb)
    print(f"built a namespace of {total / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    url = f"s3://{BUCKET}/fleet"
    # Without a GPU the fingerprint has unknown fields, which push refuses unless allowed.
    pushed = cli(env, "--store", str(store), "push", "--allow-unknown", url)
    print(f"push (once, as a subprocess): {pushed:.2f} s")
    import fsspec

    size = fsspec.filesystem("s3").size(f"{BUCKET}/fleet/{remote_key(fp)}")
    print(f"bundle on S3: {size / 1e6:.2f} MB for {total / 1e6:.1f} MB of cache files")
    times = []
    for i in range(runs):
        target = tmp / f"store-b{i}"
        times.append(cli(env, "--store", str(target), "pull", url))
        if i == 0 and tree_digest(target) != tree_digest(store):
            raise SystemExit("bench: the pulled namespace differs from the pushed one")
    print(stats_line(f"pull + import of {total / 1e6:.0f} MB of caches (subprocess)", times))
    return statistics.median(times)


def bench_raw_download(tmp: Path, mb: float, runs: int) -> None:
    """pull's download path alone, for an object that is `mb` MB on the wire."""
    import fsspec

    from fi_cache.fleet import transfer

    data = os.urandom(int(mb * 1e6))
    key = "raw/0/0/0.tar.gz"
    remote = transfer.open_remote(f"s3://{BUCKET}/bench")
    fsspec.filesystem("s3").pipe_file(remote.path(key), data)
    sidecar = transfer.Sidecar(key, len(data), hashlib.sha256(data).hexdigest(), 0.0, {})
    times = []
    for i in range(runs):
        dest = tmp / "raw" / f"{i}.tmp"
        start = time.perf_counter()
        transfer._download(remote, key, sidecar, dest, None)
        times.append(time.perf_counter() - start)
        dest.unlink()
    print(stats_line(f"download + sha256 of a {mb:.0f} MB incompressible object", times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="cache bytes to pull (MB)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    server, env = start_s3()
    try:
        with tempfile.TemporaryDirectory(prefix="fi-cache-bench-pull-") as tmp:
            sub_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
            median = bench_pull(Path(tmp), sub_env, args.mb, args.runs)
            bench_raw_download(Path(tmp), args.mb, args.runs)
    finally:
        server.stop()
    verdict = "meets" if median < GOAL_S else "MISSES"
    print(f"\npull + import median {median:.2f} s {verdict} the goal (< {GOAL_S:.0f} s)")
    sys.exit(0 if median < GOAL_S else 1)


if __name__ == "__main__":
    main()
