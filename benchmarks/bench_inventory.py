#!/usr/bin/env python3
"""Benchmark fi-cache's read-only paths against their performance goals.

    .venv/bin/python benchmarks/bench_inventory.py            # full run (under 3 minutes)
    .venv/bin/python benchmarks/bench_inventory.py --quick    # 3 runs each, for a smoke test
    .venv/bin/python benchmarks/bench_inventory.py --profile  # also cProfile the in-process runs

Measured, each as median / min / max of 7 runs (--quick: 3) after one warm-up run; a
measurement whose warm-up and runs have taken more than --budget seconds (default 20) stops
early at 3 runs, so a slow code path does not stretch the script past about 3 minutes:

1. `fi-cache --format json ls ROOT` over a vLLM cache root of 400 hash dirs x 300 entries
   (goal < 1 s), as a subprocess (wall time, interpreter start-up included) and in-process.
2. `fi-cache verify FILE` of one 100,000-entry file (goal <= 3x a bare `json.load` of it):
   bare `json.load`, the in-process verify path (`inventory.read` + `v1.defects`), and the
   command as a subprocess.
3. `fi-cache --help` cold start (goal: median < 0.3 s), plus `python -X importtime` of
   `fi_cache.cli` to check that torch, flashinfer and vllm are never imported.

Everything is written under a tempfile.TemporaryDirectory and removed afterwards. Only the
standard library and the installed fi_cache package are used. Cache files are generated from
the real FlashInfer files in tests/fixtures/ (their key/value patterns and `_metadata`) with
the token dimension M varied, `_generation` from `fi_cache.model.v1.compute_generation` and
the text from `fi_cache.model.v1.dumps`, i.e. byte-for-byte FlashInfer 0.6.18's layout.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
MOE_FIXTURE = FIXTURES / "flashinfer" / "fi-0.6.18-moe-fused.json"
GEMM_FIXTURE = FIXTURES / "h200" / "flashinfer-0.6.18-gemm.json"

LS_DIRS = 400
PROFILE_DIRS = 100
LS_ENTRIES = 300
VERIFY_ENTRIES = 100_000
MOE_SHARE = 1 / 3
FORBIDDEN_IMPORTS = ("torch", "flashinfer", "vllm")

GOAL_LS_S = 1.0
GOAL_VERIFY_RATIO = 3.0
GOAL_HELP_S = 0.3


def _fi_cache_cmd() -> list[str]:
    """The installed console script next to this interpreter, else `python -m fi_cache`."""
    script = Path(sys.executable).with_name("fi-cache")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fi_cache"]


# --- generating cache files ---------------------------------------------------------------------

# `('op', 'runner', ((` then the first profile shape: `M, K)` or `B, M, K)` (fp8 GEMM: batch 1).
_FIRST_SHAPE = re.compile(r"^(\('[^']*', '[^']*', \(\()(\d+(?:, \d+)*)(\))")
# cuBLASLt GEMM keys repeat M as the first extra: `..., (M, N, K, torch.bfloat16))`.
_EXTRAS_M = re.compile(r", \((\d+)(, [^()]*)\)\)$")


def _template(key: str) -> tuple[str, str] | None:
    """(prefix with `{M}` for the token dim, suffix) of a key, or None if it has no profile."""
    m = _FIRST_SHAPE.match(key)
    if m is None:
        return None
    dims = m.group(2).split(", ")
    token_index = 1 if len(dims) == 3 else 0  # (M, K) or (B, M, K)
    old_m = dims[token_index]
    dims[token_index] = "{M}"
    rest = _escape(key[m.end(3) :])
    e = _EXTRAS_M.search(rest)
    if e is not None and e.group(1) == old_m:
        rest = rest[: e.start()] + ", ({M}" + e.group(2) + "))"
    return _escape(m.group(1)) + ", ".join(dims) + ")", rest


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class EntryFactory:
    """Unique realistic keys from the fixtures' patterns: about MOE_SHARE MoE keys, the rest
    GEMM keys; each key pattern gets its own run of token dims M = 1, 2, 3, ...
    Values are drawn (seeded) from the values the fixture has for that pattern."""

    def __init__(self) -> None:
        from fi_cache.model import v1

        moe = v1.loads(MOE_FIXTURE.read_bytes())
        gemm = v1.loads(GEMM_FIXTURE.read_bytes())
        self.metadata: dict[str, Any] = dict(gemm.metadata or {})
        self.moe = self._patterns(moe.entries)
        self.gemm = self._patterns(gemm.entries)
        if not self.moe or not self.gemm:
            raise SystemExit("bench: no key patterns found in the fixtures")

    @staticmethod
    def _patterns(entries: dict[str, list[Any]]) -> list[tuple[str, list[list[Any]]]]:
        """(key format string, observed values) per distinct key pattern."""
        out: dict[str, list[list[Any]]] = {}
        for key, value in entries.items():
            t = _template(key)
            if t is not None:
                out.setdefault(t[0] + t[1], []).append(value)
        return sorted(out.items())

    def entries(self, n: int, seed: int) -> dict[str, list[Any]]:
        rng = random.Random(seed)
        n_moe = round(n * MOE_SHARE)
        out: dict[str, list[Any]] = {}
        for patterns, count in ((self.moe, n_moe), (self.gemm, n - n_moe)):
            # Each pattern as often as the fixture has it (GEMM: the `(33554432,)` workspace
            # variants occur once per 12 of the others), with its own M = 1, 2, 3, ...
            cycle = [i for i, (_, values) in enumerate(patterns) for _ in values]
            next_m = [1] * len(patterns)
            for i in range(count):
                p = cycle[i % len(cycle)]
                fmt, values = patterns[p]
                out[fmt.format(M=next_m[p])] = json.loads(json.dumps(rng.choice(values)))
                next_m[p] += 1
        if len(out) != n:
            raise SystemExit(f"bench: generated {len(out)} unique keys, wanted {n}")
        return out

    def file_text(self, n: int, seed: int) -> str:
        from fi_cache.model import v1

        cf = v1.CacheFile(self.metadata, self.entries(n, seed))
        generation = v1.compute_generation(cf)
        cf = v1.CacheFile(cf.metadata, cf.entries, None, generation)
        text = v1.dumps(cf)
        return text


def _write_private(path: Path, text: str) -> None:
    """Like FlashInfer: mode 0600, no trailing newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def check_generator(factory: EntryFactory) -> None:
    """fi_cache's dumps must reproduce the real FlashInfer files byte for byte, and the
    generated keys must parse and carry a valid `_generation`."""
    from fi_cache.model import v1

    for fixture in (MOE_FIXTURE, GEMM_FIXTURE):
        raw = fixture.read_text(encoding="utf-8")
        if v1.dumps(v1.loads(raw)) != raw:
            raise SystemExit(f"bench: v1.dumps does not reproduce {fixture} byte for byte")
    sample = v1.loads(factory.file_text(LS_ENTRIES, seed=1))
    problems = list(v1.defects(sample))
    if problems:
        raise SystemExit(f"bench: generated file has defects: {problems[:3]}")
    if sample.finalize() != "fused":
        raise SystemExit(f"bench: generated file's finalize is {sample.finalize()!r}")


def build_vllm_root(root: Path, factory: EntryFactory, dirs: int, entries: int) -> Path:
    """`root/0.6.18/90a/<64-hex>/autotune_configs.json` x dirs; returns the version's parent."""
    base = root / "vllm" / "flashinfer_autotune_cache"
    rng = random.Random(2024)
    hashes = set()
    while len(hashes) < dirs:
        hashes.add(f"{rng.getrandbits(256):064x}")
    for i, h in enumerate(sorted(hashes)):
        _write_private(
            base / "0.6.18" / "90a" / h / "autotune_configs.json",
            factory.file_text(entries, seed=i),
        )
    return base


# --- timing --------------------------------------------------------------------------------------


class Stats:
    def __init__(self, name: str, times: list[float]) -> None:
        self.name = name
        self.times = times
        self.median = statistics.median(times)
        self.min = min(times)
        self.max = max(times)

    def line(self) -> str:
        return (
            f"  {self.name:<44} median {self.median:8.3f} s   min {self.min:8.3f} s   "
            f"max {self.max:8.3f} s   (n={len(self.times)})"
        )


# Per-measurement time budget (seconds, warm-up included): a slow path stops after MIN_RUNS
# runs once its budget is spent, so the whole script stays near 3 minutes however slow it is.
BUDGET_S = 20.0
MIN_RUNS = 3


def measure(name: str, fn: Callable[[], Any], runs: int, warmup: int = 1) -> Stats:
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < runs:
        if len(times) >= MIN_RUNS and time.perf_counter() - start > BUDGET_S:
            break
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    stats = Stats(name, times)
    print(stats.line(), flush=True)
    return stats


def run_quiet(cmd: list[str], expect_rc: int = 0) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(cmd, capture_output=True, check=False)
    if proc.returncode != expect_rc:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        raise SystemExit(f"bench: {' '.join(cmd)} exited {proc.returncode}")
    return proc


def cli_in_process(argv: list[str]) -> str:
    """Run fi_cache.cli.main in this process; return its stdout, fail on a non-zero exit."""
    from fi_cache import cli

    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    if code not in (0, None):
        raise SystemExit(f"bench: fi-cache {' '.join(argv)} exited {code}: {err.getvalue()}")
    return out.getvalue()


def breakdown(title: str, stages: list[tuple[str, Callable[[], Any]]]) -> None:
    """Time each stage of a code path once, without profiler overhead. The stages call
    fi_cache internals, which may be renamed: a stage that fails is reported, not fatal."""
    print(f"\n--- stages of {title} (one run each, no profiler) ---")
    for name, fn in stages:
        try:
            t0 = time.perf_counter()
            fn()
            print(f"  {time.perf_counter() - t0:8.3f} s  {name}", flush=True)
        except Exception as exc:  # a diagnostic, never fatal
            print(f"       n/a  {name} ({type(exc).__name__}: {exc})")


def profile(name: str, fn: Callable[[], Any], top: int = 10) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(order).print_stats(top)
        lines = buf.getvalue().splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        print(f"\n--- cProfile of {name}, top {top} by {order} ---")
        print("\n".join(ln for ln in lines[start:] if ln.strip()), flush=True)


# --- the three benchmarks ------------------------------------------------------------------------


def bench_ls(tmp: Path, factory: EntryFactory, runs: int, do_profile: bool) -> list[Stats]:
    print(f"\n[1] ls over {LS_DIRS} vLLM hash dirs x {LS_ENTRIES} entries", flush=True)
    t0 = time.perf_counter()
    root = build_vllm_root(tmp, factory, LS_DIRS, LS_ENTRIES)
    size = sum(p.stat().st_size for p in root.rglob("*.json"))
    print(f"  built {root} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    store = tmp / "empty-store"
    store.mkdir()
    argv = ["--store", str(store), "--format", "json", "ls", str(root)]

    # Sanity: every file is found, in the vLLM layout, with the right entry count.
    doc = json.loads(run_quiet([*_fi_cache_cmd(), *argv]).stdout)
    caches = doc["caches"]
    if len(caches) != LS_DIRS or doc["problems"]:
        raise SystemExit(f"bench: ls found {len(caches)} caches, problems {doc['problems'][:3]}")
    if {(c["layout"], c["entries"], c["arch"], c["finalize"]) for c in caches} != {
        ("vllm", LS_ENTRIES, "90a", "fused")
    }:
        raise SystemExit(f"bench: unexpected ls rows, e.g. {caches[0]}")

    def subprocess_ls() -> None:
        run_quiet([*_fi_cache_cmd(), *argv])

    results = [
        measure("ls: subprocess (fi-cache ... ls ROOT)", subprocess_ls, runs),
        measure("ls: in-process cli.main (incl. JSON out)", lambda: cli_in_process(argv), runs),
    ]
    if do_profile:
        # What `ls` does per cache (scan = discover + read, then one summary row each), over
        # PROFILE_DIRS of the hash dirs: cProfile slows this code down about 3.5x.
        from fi_cache.caches.inventory import scan
        from fi_cache.cli.ls import summary

        dirs = sorted((root / "0.6.18" / "90a").iterdir())[:PROFILE_DIRS]

        def scan_and_summaries() -> None:
            inv = scan(dirs)
            assert len([summary(c, store) for c in inv.caches]) == len(dirs)

        title = f"in-process ls (scan + summary) of {len(dirs)} of the {LS_DIRS} dirs"
        profile(title, scan_and_summaries)

        from fi_cache.caches import inventory
        from fi_cache.caches.discover import discover

        found = [f for d in dirs for f in discover(d)[0]]
        caches = [inventory.read(f) for f in found]
        breakdown(
            f"ls over {len(dirs)} dirs",
            [
                ("discover", lambda: [discover(d) for d in dirs]),
                ("inventory.read (all files)", lambda: [inventory.read(f) for f in found]),
                ("CacheFile.finalize (all files)", lambda: [c.finalize() for c in caches]),
                ("CacheFile.ops (all files)", lambda: [c.file.ops() for c in caches]),
                (
                    "summary (all files, includes finalize + ops)",
                    lambda: [summary(c, store) for c in caches],
                ),
            ],
        )
    return results


def bench_verify(tmp: Path, factory: EntryFactory, runs: int, do_profile: bool) -> list[Stats]:
    print(f"\n[2] verify of one {VERIFY_ENTRIES:,}-entry file", flush=True)
    from fi_cache.caches import inventory
    from fi_cache.caches.discover import discover
    from fi_cache.model import v1

    t0 = time.perf_counter()
    path = tmp / "big" / "autotune_configs.json"
    _write_private(path, factory.file_text(VERIFY_ENTRIES, seed=7))
    print(
        f"  built {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    found_list, problems = discover(path)
    assert len(found_list) == 1 and not problems, (found_list, problems)
    found = found_list[0]

    def bare_json() -> None:
        with open(path, encoding="utf-8") as f:
            json.load(f)

    def verify_path() -> None:
        cache = inventory.read(found)
        defects = [*cache.read_defects, *v1.defects(cache.file)]
        assert len(cache.file.entries) == VERIFY_ENTRIES and not defects, defects[:3]

    cmd = [*_fi_cache_cmd(), "verify", str(path)]
    out = run_quiet(cmd).stdout.decode()
    if f"({VERIFY_ENTRIES} entries, _generation ok)" not in out:
        raise SystemExit(f"bench: unexpected verify output: {out!r}")
    results = [
        measure("verify: bare json.load", bare_json, runs),
        measure("verify: in-process read + defects", verify_path, runs),
        measure("verify: subprocess (fi-cache verify FILE)", lambda: run_quiet(cmd), runs),
    ]
    if do_profile:
        profile("in-process verify (read + defects)", verify_path)
        from fi_cache.model import keys as keymod

        cf = inventory.read(found).file
        raw_keys = list(cf.entries)
        breakdown(
            f"verify of {VERIFY_ENTRIES:,} entries",
            [
                ("inventory.read (bytes, json.loads, CacheFile)", lambda: inventory.read(found)),
                ("keys.find_unparsable (all keys)", lambda: keymod.find_unparsable(raw_keys)),
                (
                    "v1.value_problem (every value)",
                    lambda: [v1.value_problem(v) for v in cf.entries.values()],
                ),
                ("v1.compute_generation", lambda: v1.compute_generation(cf)),
                ("list(v1.defects) (all of the above but read)", lambda: list(v1.defects(cf))),
            ],
        )
    return results


def import_times() -> tuple[set[str], list[tuple[int, int, str]]]:
    """Top-level packages imported by `import fi_cache.cli`, and (self us, cumulative us, name)."""
    proc = run_quiet([sys.executable, "-X", "importtime", "-c", "import fi_cache.cli"])
    rows = []
    for line in proc.stderr.decode().splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), m.group(4)))
    return {name.split(".")[0] for _, _, name in rows}, rows


def bench_help(runs: int) -> list[Stats]:
    print("\n[3] fi-cache --help cold start", flush=True)
    cmd = [*_fi_cache_cmd(), "--help"]
    stats = measure("--help: subprocess", lambda: run_quiet(cmd), runs)
    bare = measure(
        "(reference) python -c pass", lambda: run_quiet([sys.executable, "-c", "pass"]), runs
    )
    packages, rows = import_times()
    bad = sorted(p for p in packages if p in FORBIDDEN_IMPORTS)
    assert not bad, f"import fi_cache.cli imports {bad}"
    print(
        f"  import fi_cache.cli: {len(rows)} modules; none of "
        f"{', '.join(FORBIDDEN_IMPORTS)} imported (checked)"
    )
    total = max(cum for _, cum, _ in rows) if rows else 0
    print(f"  top 5 slowest imports by self time (fi_cache.cli cumulative {total / 1e3:.1f} ms):")
    for self_us, cum_us, name in sorted(rows, reverse=True)[:5]:
        print(f"    {self_us / 1e3:7.2f} ms self  {cum_us / 1e3:7.2f} ms cumulative  {name}")
    return [stats, bare]


# --- main ----------------------------------------------------------------------------------------


def _fmt_ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


def table(ls: list[Stats], verify: list[Stats], help_: list[Stats]) -> str:
    bare, inproc, sub = verify
    ratio = inproc.median / bare.median
    ratio_sub = sub.median / bare.median
    verdict = {True: "met", False: "**missed**"}
    rows = [
        (
            "ls 400 dirs x 300 entries, subprocess",
            ls[0],
            f"< {GOAL_LS_S:.0f} s",
            verdict[ls[0].median < GOAL_LS_S],
        ),
        (
            "ls, in-process `cli.main` (JSON out)",
            ls[1],
            f"< {GOAL_LS_S:.0f} s",
            verdict[ls[1].median < GOAL_LS_S],
        ),
        ("verify 100k: bare `json.load` (a)", bare, "reference", ""),
        (
            "verify 100k: in-process `read` + `defects` (b)",
            inproc,
            f"(b)/(a) <= {GOAL_VERIFY_RATIO:.0f}",
            f"(b)/(a) = {ratio:.2f}x, {verdict[ratio <= GOAL_VERIFY_RATIO]}",
        ),
        (
            "verify 100k: subprocess `fi-cache verify` (c)",
            sub,
            "(info)",
            f"(c)/(a) = {ratio_sub:.2f}x",
        ),
        (
            "`fi-cache --help`, subprocess",
            help_[0],
            f"median < {GOAL_HELP_S} s",
            verdict[help_[0].median < GOAL_HELP_S],
        ),
        ("(reference) `python -c pass`", help_[1], "", ""),
    ]
    out = [
        "| benchmark | runs | median | min | max | goal | result |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, s, goal, result in rows:
        cells = [name, str(len(s.times)), _fmt_ms(s.median), _fmt_ms(s.min), _fmt_ms(s.max)]
        out.append("| " + " | ".join([*cells, goal, result]) + " |")
    return "\n".join(out)


def main() -> int:
    global BUDGET_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 runs per measurement instead of 7")
    ap.add_argument("--runs", type=int, default=None, help="runs per measurement (after warm-up)")
    ap.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"seconds per measurement after which it stops at {MIN_RUNS} runs "
        f"(default {BUDGET_S:.0f})",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also print a cProfile of the in-process ls and verify runs",
    )
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    BUDGET_S = args.budget

    import fi_cache

    print(f"fi-cache {fi_cache.__version__} from {Path(fi_cache.__file__).parent}")
    print(
        f"python {platform.python_version()} ({sys.executable}), {platform.machine()}, "
        f"nproc {os.cpu_count()}, {runs} runs + 1 warm-up each "
        f"(at least {MIN_RUNS} once {BUDGET_S:.0f} s are spent)"
    )
    t_start = time.perf_counter()
    factory = EntryFactory()
    check_generator(factory)
    with tempfile.TemporaryDirectory(prefix="fi-cache-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ls = bench_ls(tmp, factory, runs, args.profile)
        shutil.rmtree(tmp / "vllm")
        verify = bench_verify(tmp, factory, runs, args.profile)
    help_ = bench_help(runs)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s\n")
    print(table(ls, verify, help_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
