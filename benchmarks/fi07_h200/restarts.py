"""Which buckets FlashInfer profiles again when restarted on its own unchanged cache, and why
(issue 22 item 4), for the v1 file (`autotune(True, cache=FILE)`) and 0.7.x's v2 store
(`autotune_v2(mode="tune", cache_root=DIR)`).

    python restarts.py child --plan P --format v1|v2 --cache PATH --out R.json [--replay]
                             [--tokens 1,3,100] [--policy cuda_graph,cold]
    python restarts.py bench --plan P --out DIR [--formats v1,v2] [--runs 3] [--policy-run]
    python restarts.py summary DIR...

A child is one engine start in a fresh process: the plan's calls (fi-cache's own op adapters,
fi_cache/engines/flashinfer/ops.py, as its tuning child makes them) under FlashInfer's autotuner.
It wraps three AutoTuner methods to see what FlashInfer does, without changing it:
- choose_one: remembers the caller's op, runners, tuning config and real inputs;
- _prepare_input_tensors: FlashInfer calls it only for a profile it is about to measure (a miss in
  choose_one's per-bucket search_cache); the child records the key that lookup used (the caller's
  inputs give get_cache_key_extras) and the key the winner is stored under (the profile's
  synthesized tensors give them), and whether each was already in the cache on disk;
- search_cache outside tuning mode (a replay): hit or miss per call, with the key looked up.
`bench` runs, per run and format: cold (empty cache), restart (the same cache, unchanged), and in
run 1 a second restart and a replay at token counts that are not buckets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
V1_NAME = "autotune_configs_dp0_rank0.json"  # vLLM's rank file name: the path a v1 start reads
# Buckets and not: FlashInfer rounds 3, 100 and 1000 up to the buckets 4, 128 and 1024.
REPLAY_TOKENS = [1, 3, 16, 100, 128, 1000, 1024]
# What vLLM's kernel_warmup passes to autotune_v2, per vLLM's test of _flashinfer_autotune_context
# (MeasurementPolicy(execution_mode="cuda_graph", cold_l2=True); its release was not checked here).
VLLM_POLICY = "cuda_graph,cold"


def on_disk(fmt: str, cache: str) -> dict[str, Any]:
    """key -> value as the cache is on disk now (v1: [runner, tactic(, policy)]; v2: the entry)."""
    path = Path(cache)
    if fmt == "v1":
        if not path.is_file():
            return {}
        data = json.loads(path.read_text())
        return {k: v for k, v in data.items() if not k.startswith("_")}
    out: dict[str, Any] = {}
    for entry in sorted(path.glob("v2/*/entries/*.json")):
        try:
            data = json.loads(entry.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("key"), str):
            out[data["key"]] = data
    return out


def choice(fmt: str, value: Any) -> list[Any]:
    """(runner, tactic) of a value, whatever the format."""
    return [value["runner"], value["tactic"]] if fmt == "v2" else list(value[:2])


class Recorder:
    """Wraps the tuner's methods (instance attributes: FlashInfer's class is untouched)."""

    def __init__(self, tuner: Any, before: dict[str, Any]) -> None:
        self.tuner, self.before, self.call = tuner, before, 0
        self.profiled: list[dict[str, Any]] = []
        self.lookups: list[dict[str, Any]] = []
        self.stored_here: set[str] = set()
        self.ctx: dict[str, Any] = {}
        choose, prepare, search = tuner.choose_one, tuner._prepare_input_tensors, tuner.search_cache

        def choose_one(
            custom_op: str, runners: Any, tuning_config: Any, inputs: Any, **kw: Any
        ) -> Any:
            self.ctx = {
                "op": custom_op,
                "runners": list(runners),
                "cfg": tuning_config,
                "inputs": inputs,
            }
            try:
                return choose(custom_op, runners, tuning_config, inputs, **kw)
            finally:
                self.ctx = {}

        def prepare_input_tensors(profile: Any, inputs: Any) -> Any:
            tensors = prepare(profile, inputs)
            if self.ctx:
                self._profiled(profile, tensors)
            return tensors

        def search_cache(
            custom_op: str,
            runners: Any,
            input_shapes: Any,
            tuning_config: Any,
            inputs: Any = None,
            **kw: Any,
        ) -> Any:
            out = search(custom_op, runners, input_shapes, tuning_config, inputs=inputs, **kw)
            if not tuner.is_tuning_mode and inputs is not None:
                r = runners[0]
                key = self._key(custom_op, r, input_shapes, tuning_config, inputs)
                self.lookups.append(
                    {
                        "i": self.call,
                        "op": custom_op,
                        "runner": type(r).__name__,
                        "m": _m(input_shapes, tuning_config),
                        "hit": bool(out[0]),
                        "key": key,
                        "key_in_file": key in self.before,
                    }
                )
            return out

        tuner.choose_one = choose_one
        tuner._prepare_input_tensors = prepare_input_tensors
        tuner.search_cache = search_cache

    def _key(self, op: str, runner: Any, shapes: Any, cfg: Any, tensors: Any) -> str:
        from flashinfer.autotuner import AutoTuner

        extras = runner.get_cache_key_extras(tensors)
        return str(AutoTuner._get_cache_key(op, runner, shapes, cfg, extras).file_key)

    def _profiled(self, profile: Any, tensors: Any) -> None:
        op, cfg, inputs = self.ctx["op"], self.ctx["cfg"], self.ctx["inputs"]
        shapes = profile.get_opt_shapes()
        for r in self.ctx["runners"]:
            lookup = self._key(op, r, shapes, cfg, inputs)  # choose_one's search_cache(inputs=)
            stored = self._key(op, r, shapes, cfg, tensors)  # where the winner is written
            item: dict[str, Any] = {
                "i": self.call,
                "op": op,
                "runner": type(r).__name__,
                "bucket": _m(shapes, cfg),
                "lookup_key": lookup,
                "stored_key": stored,
                "lookup_in_file": lookup in self.before,
                "stored_in_file": stored in self.before,
                "stored_earlier": stored in self.stored_here,
                "reason": _reason(lookup, stored, self.before, self.stored_here),
            }
            if lookup in self.before:  # profiled although its key was on disk: say what was there
                item["file_value"] = self.before[lookup]
                policy = getattr(type(self.tuner), "_profiling_policy", None)
                item["policy_now"] = list(policy(cfg)) if callable(policy) else None
                item["validates"] = hasattr(r, "validate_tactic")
            self.stored_here.add(stored)
            self.profiled.append(item)


def _reason(lookup: str, stored: str, before: dict[str, Any], here: set[str]) -> str:
    if stored not in before and stored not in here:
        return "new key"
    if lookup != stored:
        return "looked up under another key than the one stored"
    return "key on disk, profiled anyway"


def _m(shapes: Any, cfg: Any) -> int | None:
    """The tuned (token) dimension of these shapes, as FlashInfer's first dynamic spec names it."""
    try:
        spec = cfg.dynamic_tensor_specs[0]
        return int(shapes[spec.input_idx[0]][spec.dim_idx[0]])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def _context(opts: argparse.Namespace) -> Any:
    import flashinfer

    if opts.format == "v1":
        return flashinfer.autotune(not opts.replay, cache=opts.cache)
    from flashinfer.autotune_cache import MeasurementPolicy, autotune_v2

    policy = None
    if opts.policy:
        mode, l2 = opts.policy.split(",")
        policy = MeasurementPolicy(execution_mode=mode, cold_l2=l2 == "cold")
    mode = "replay" if opts.replay else "tune"
    return autotune_v2(mode=mode, cache_root=opts.cache, measurement_policy=policy)


def child(opts: argparse.Namespace) -> None:
    import flashinfer
    import torch
    from flashinfer.autotuner import AutoTuner
    from flashinfer.autotuner import autotuner as fi_at

    from fi_cache.engines.flashinfer import ops
    from fi_cache.engines.flashinfer import plan as plans

    job = plans.loads(Path(opts.plan).read_text(), opts.plan).for_mode("fused")
    if opts.tokens:
        tokens = tuple(int(t) for t in opts.tokens.split(","))
        job = tuple(dataclasses.replace(op, tokens=tokens) for op in job)  # type: ignore[misc]
    before = on_disk(opts.format, opts.cache)
    rec = Recorder(AutoTuner.get(), before)
    device = torch.device("cuda")
    calls = []
    started = time.perf_counter()
    with _context(opts):
        for i, call in enumerate(
            (c for op in job for c in ops.ADAPTERS[op.op].calls(op, device, "fused")), 1
        ):
            rec.call = i
            t0 = time.perf_counter()
            call.run()
            torch.cuda.synchronize()
            calls.append(
                {
                    "i": i,
                    "op": call.op.op,
                    "backend": call.backend,
                    "tokens": call.tokens,
                    "seconds": round(time.perf_counter() - t0, 4),
                }
            )
    seconds = time.perf_counter() - started  # leaving the context saved the v1 file
    after = on_disk(opts.format, opts.cache)
    changed = sorted(
        k
        for k in before.keys() & after.keys()
        if choice(opts.format, before[k]) != choice(opts.format, after[k])
    )
    result = {
        "flashinfer": flashinfer.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "metadata": fi_at._collect_metadata(),
        "format": opts.format,
        "replay": opts.replay,
        "policy": opts.policy,
        "seconds": round(seconds, 3),
        "calls": calls,
        "profiled": rec.profiled,
        "lookups": rec.lookups,
        "keys_before": len(before),
        "keys_after": len(after),
        "new_keys": sorted(after.keys() - before.keys()),
        "changed": changed,
        "changed_values": {
            k: [choice(opts.format, before[k]), choice(opts.format, after[k])] for k in changed
        },
    }
    Path(opts.out).write_text(json.dumps(result, indent=1, default=str) + "\n")


# --- bench: fresh processes, as engine starts -----------------------------------------------


def start(
    plan: str, fmt: str, cache: Path, out: Path, name: str, extra: list[str]
) -> dict[str, Any]:
    base = "v2" if fmt.startswith("v2") else "v1"
    res = out / "starts" / f"{name}.json"
    cmd = [
        sys.executable,
        str(HERE),
        "child",
        "--plan",
        plan,
        "--format",
        base,
        "--cache",
        str(cache),
        "--out",
        str(res),
        *extra,
    ]
    t0 = time.perf_counter()
    with open(out / "logs" / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = round(time.perf_counter() - t0, 2)
    if rc != 0 or not res.is_file():
        print(f"{name}: rc={rc} (log {out / 'logs' / (name + '.log')})", flush=True)
        return {"name": name, "rc": rc, "wall": wall}
    data = json.loads(res.read_text())
    prof = data["profiled"]
    brief = {
        "name": name,
        "rc": rc,
        "wall": wall,
        "seconds": data["seconds"],
        "buckets": len(prof),
        "calls_tuned": len({p["i"] for p in prof}),
        "calls": len(data["calls"]),
        "keys_before": data["keys_before"],
        "keys_after": data["keys_after"],
        "new_keys": len(data["new_keys"]),
        "changed": len(data["changed"]),
        "reasons": dict(Counter(p["reason"] for p in prof)),
    }
    if data["lookups"]:
        brief["hits"] = sum(x["hit"] for x in data["lookups"])
        brief["lookups"] = len(data["lookups"])
    print(json.dumps(brief), flush=True)
    return brief


def bench(opts: argparse.Namespace) -> None:
    out = Path(opts.out)
    for d in ("logs", "starts", "files"):
        (out / d).mkdir(parents=True, exist_ok=True)
    formats = opts.formats.split(",")
    runs: list[dict[str, Any]] = []
    for i in range(1, opts.runs + 1):
        run: dict[str, Any] = {}
        plan = [(f, None) for f in formats]
        if opts.policy_run and i == 1:
            plan.append(("v2-vllm-policy", VLLM_POLICY))
        for fmt, policy in plan:
            work = out / "work" / f"run{i}-{fmt}"
            work.mkdir(parents=True, exist_ok=True)
            cache = work / (V1_NAME if fmt == "v1" else "root")
            extra = ["--policy", policy] if policy else []
            kinds = ["cold", "restart"] + (["restart2"] if i == 1 else [])
            run[fmt] = {}
            for kind in kinds:
                run[fmt][kind] = start(opts.plan, fmt, cache, out, f"run{i}-{fmt}-{kind}", extra)
                if i == 1 and kind in ("cold", "restart"):  # the files as FlashInfer left them
                    dest = out / "files" / f"{fmt}-{kind}"
                    copy = shutil.copytree if cache.is_dir() else shutil.copy2
                    if cache.exists():
                        dest.mkdir(exist_ok=True)
                        copy(cache, dest / cache.name)  # type: ignore[operator]
            if i == 1:
                replay = ["--replay", "--tokens", ",".join(map(str, REPLAY_TOKENS)), *extra]
                run[fmt]["replay"] = start(
                    opts.plan, fmt, cache, out, f"run{i}-{fmt}-replay", replay
                )
        runs.append(run)
        # after every run: a pipeline stopped later still leaves the runs it finished
        (out / "bench.json").write_text(json.dumps({"plan": opts.plan, "runs": runs}, indent=1))


# --- summary: markdown from bench.json and the starts' records ----------------------------------


def _med(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"


def _cells(starts: list[dict[str, Any]], field: str) -> str:
    return ", ".join(str(s.get(field)) for s in starts)


def summary(dirs: list[str]) -> str:
    lines: list[str] = []
    for d in map(Path, dirs):
        data = json.loads((d / "bench.json").read_text())
        starts = {p.stem: json.loads(p.read_text()) for p in sorted((d / "starts").glob("*.json"))}
        some = next(iter(starts.values()), {})
        lines += [
            f"## FlashInfer {some.get('flashinfer')} ({d.name})",
            "",
            f"torch {some.get('torch')}, {some.get('gpu')}, metadata "
            f"`{json.dumps(some.get('metadata'))}`",
            "",
            "| format | start | tuning time, median (min-max) | calls tuned | buckets "
            "profiled | entries before -> after | values changed |",
            "| --- | --- | ---: | --- | --- | --- | --- |",
        ]
        fmts = list(dict.fromkeys(f for r in data["runs"] for f in r))
        for fmt in fmts:
            for kind in ("cold", "restart", "restart2"):
                got = [r[fmt][kind] for r in data["runs"] if kind in r.get(fmt, {})]
                ok = [g for g in got if g.get("rc") == 0]
                if not got:
                    continue
                entries = ", ".join(f"{g['keys_before']}->{g['keys_after']}" for g in ok)
                fails = f" ({len(got) - len(ok)} failed)" if len(ok) < len(got) else ""
                lines.append(
                    f"| {fmt} | {kind}{fails} | {_med([g['seconds'] for g in ok])} | "
                    f"{_cells(ok, 'calls_tuned')} | {_cells(ok, 'buckets')} | {entries} | "
                    f"{_cells(ok, 'changed')} |"
                )
        lines.append("")
        for name, s in starts.items():
            if not name.endswith("-restart") or not s["profiled"]:
                continue
            lines += [
                f"### {name}: what was profiled again",
                "",
                "| call | op, runner | buckets profiled | why |",
                "| --- | --- | --- | --- |",
            ]
            by_call: dict[tuple[int, str, str], list[dict[str, Any]]] = defaultdict(list)
            for p in s["profiled"]:
                by_call[(p["i"], p["op"], p["runner"])].append(p)
            calls = {c["i"]: c for c in s["calls"]}
            for (i, op, runner), ps in sorted(by_call.items()):
                why = "; ".join(f"{n}x {r}" for r, n in Counter(p["reason"] for p in ps).items())
                tokens = calls.get(i, {}).get("tokens")
                buckets = ", ".join(str(p["bucket"]) for p in ps)
                lines.append(f"| {i} (M={tokens}) | {op}, {runner} | {buckets} | {why} |")
            ex = next((p for p in s["profiled"] if p["lookup_key"] != p["stored_key"]), None)
            if ex:
                lines += [
                    "",
                    f"e.g. bucket {ex['bucket']} of call {ex['i']}:",
                    f"- looked up: `{ex['lookup_key']}`",
                    f"- stored:    `{ex['stored_key']}`",
                ]
            lines.append("")
        for name, s in starts.items():
            if not name.endswith("-replay"):
                continue
            lines += [
                f"### {name}: lookups outside tuning (M not always a bucket)",
                "",
                "| M | runner | hit |",
                "| ---: | --- | --- |",
            ]
            lines += [f"| {x['m']} | {x['runner']} | {x['hit']} |" for x in s["lookups"]]
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("--plan", required=True)
    c.add_argument("--format", choices=("v1", "v2"), required=True)
    c.add_argument("--cache", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--replay", action="store_true")
    c.add_argument("--tokens", default="")
    c.add_argument("--policy", default="")
    b = sub.add_parser("bench")
    b.add_argument("--plan", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--formats", default="v1")
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--policy-run", action="store_true")
    s = sub.add_parser("summary")
    s.add_argument("dirs", nargs="+")
    opts = parser.parse_args()
    if opts.cmd == "child":
        child(opts)
    elif opts.cmd == "bench":
        bench(opts)
    else:
        print(summary(opts.dirs))


if __name__ == "__main__":
    main()
