"""FlashInfer's CUTLASS fused MoE on one GPU (bf16, Qwen3-30B-A3B's MoE shapes): tactic counts, the
cache collision between finalize modes, the price of determinism and the determinism check.

Each subcommand runs in a fresh process (FlashInfer's autotuner keeps every file it loaded in
memory, and on FlashInfer <= 0.6.17 its MoE keys cannot tell the two finalize modes apart):

  counts OUT                      tactic lists per finalize mode (GEMM1, GEMM2, occupancy)
  tune MODE CACHE OUT             autotune(True, cache=CACHE) around MODE calls (fused|unfused)
  replay MODE CACHE OUT           autotune(False, cache=CACHE): one MODE call per bucket, every
                                  exception caught; which tactic each GEMM ran, and hits/misses
  call MODE CACHE TOKENS          one MODE call under CACHE, exception NOT caught (a server
                                  start-up dies the same way): the process exit code tells
  time MODE CACHE OUT             per bucket, the MoE layer time under CACHE (CUDA graph replay,
                                  CUDA events; median of REPEATS)
  determinism MODE CACHE OUT      per bucket, REPS identical calls under CACHE: bitwise equal?
  report DIR                      the tables (markdown) from DIR's JSON results; exit 1 when the
                                  unfused namespace's tactics are not bitwise stable

On the H200 this ran with a bf16-only TEST BUILD of FlashInfer's own fused_moe_90 module (trim.py):
the same kernels and tactic lists as the stock module.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

H, INTER, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B: hidden, moe_intermediate, experts, top_k
TUNE_MAX = 1024
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024]  # FlashInfer's, up to TUNE_MAX
DECODE_MIX = [1, 2, 4, 8, 16, 32, 64, 128]  # one decode step at each batch size, equal weight
REPEATS, ITERS, REPS = 7, 20, 20


def log(*a: object) -> None:
    print("[moe_bench]", *a, file=sys.stderr, flush=True)


def _torch() -> Any:
    import torch

    return torch


def weights(seed: int = 1234) -> tuple[Any, Any]:
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    w1 = (torch.randn(E, 2 * INTER, H, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(E, H, INTER, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    return w1, w2


def tokens(t: int, seed: int = 0) -> tuple[Any, Any, Any]:
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed + t)
    x = (torch.randn(t, H, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
    probs = torch.softmax(torch.randn(t, E, generator=g, device="cuda"), dim=-1)
    vals, sel = torch.topk(probs, K, dim=-1)
    return x, sel.to(torch.int32), (vals / vals.sum(-1, keepdim=True)).float()


def moe(x: Any, sel: Any, scales: Any, w1: Any, w2: Any, mode: str, out: Any = None) -> Any:
    from flashinfer.fused_moe import cutlass_fused_moe

    kw = {"output": out} if out is not None else {}
    res = cutlass_fused_moe(
        x,
        sel,
        scales,
        w1,
        w2,
        _torch().bfloat16,
        [],
        tune_max_num_tokens=TUNE_MAX,
        use_fused_finalize=mode == "fused",
        **kw,
    )
    return res[0] if isinstance(res, (list, tuple)) else res


def _runner(mode: str) -> Any:
    """FlashInfer's compiled runner, built with the flags its MoERunner passes (0.6.18+: 9)."""
    import flashinfer
    from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module
    from packaging.version import Version

    spec = gen_cutlass_fused_moe_sm90_module()
    log(f"fused_moe_90 is_aot={spec.is_aot}")
    mod = spec.build_and_load()
    bf16 = _torch().bfloat16
    flags = [False, False, False, False, mode == "fused"]
    if Version(flashinfer.__version__) >= Version("0.6.18"):
        flags.append(False)  # use_wfp4afp8_humming
    return mod.init(bf16, bf16, bf16, *flags)


# --- what ran: FlashInfer's choose_one, recorded -------------------------------------------------

CHOICES: list[dict[str, Any]] = []


def record_choices() -> None:
    """Record, per GEMM call, whether the cache had it and which tactic FlashInfer chose."""
    from flashinfer.autotuner import AutoTuner

    search, choose = AutoTuner.search_cache, AutoTuner.choose_one
    last: dict[str, Any] = {}

    def search_cache(self: Any, *a: Any, **k: Any) -> Any:
        res = search(self, *a, **k)
        last["hit"] = bool(res[0])
        return res

    def choose_one(self: Any, op: str, runners: Any, config: Any, inputs: Any, **k: Any) -> Any:
        last.clear()
        runner, tactic = choose(self, op, runners, config, inputs, **k)
        CHOICES.append(
            {
                "op": op.split("::")[-1],
                "tokens": int(inputs[0].shape[0]),
                "hit": last.get("hit"),
                "tactic": tactic if isinstance(tactic, int) else str(tactic),
            }
        )
        return runner, tactic

    AutoTuner.search_cache, AutoTuner.choose_one = search_cache, choose_one


def dump(path: str, doc: dict[str, Any]) -> None:
    import flashinfer

    doc = {"flashinfer": flashinfer.__version__, "gpu": _torch().cuda.get_device_name(), **doc}
    Path(path).write_text(json.dumps(doc, indent=1, default=str))


# --- subcommands --------------------------------------------------------------------------------


def counts(out: str) -> None:
    res = {}
    for mode in ("fused", "unfused"):
        r = _runner(mode)
        g1, g2 = int(r.get_gemm1_tactic_count()), int(r.get_gemm2_tactic_count())
        occ = [int(r.get_tactic_occupancy(t)) for t in range(g1 + g2)]
        res[mode] = {"gemm1": g1, "gemm2": g2, "gemm2_ids": [g1, g1 + g2], "occupancy": occ}
        log(f"{mode}: gemm1 {g1}, gemm2 {g2} (ids {g1}..{g1 + g2 - 1})")
    dump(out, {"counts": res})


def tune(mode: str, cache: str, out: str) -> None:
    import flashinfer

    record_choices()
    w1, w2 = weights()
    calls = []
    t0 = time.time()
    with flashinfer.autotune(True, cache=cache):
        for t in [1024, 1, 16, 128]:  # the first call tunes every bucket up to TUNE_MAX
            x, sel, sc = tokens(t)
            start = time.time()
            moe(x, sel, sc, w1, w2, mode)
            _torch().cuda.synchronize()
            calls.append({"tokens": t, "seconds": round(time.time() - start, 3)})
    log(f"tuned {mode} in {time.time() - t0:.1f}s into {cache}")
    dump(
        out,
        {"mode": mode, "seconds": round(time.time() - t0, 2), "calls": calls, "choices": CHOICES},
    )


@contextlib.contextmanager
def replaying(cache: str) -> Iterator[tuple[Any, Any]]:
    """The layer's weights, inside autotune(False, cache=CACHE), every tactic choice recorded."""
    import flashinfer

    record_choices()
    w1, w2 = weights()
    with flashinfer.autotune(False, cache=cache):
        yield w1, w2


def replay(mode: str, cache: str, out: str) -> None:
    rows = []
    with replaying(cache) as (w1, w2):
        for t in BUCKETS:
            x, sel, sc = tokens(t)
            before = len(CHOICES)
            row: dict[str, Any] = {"tokens": t}
            try:
                moe(x, sel, sc, w1, w2, mode)
                _torch().cuda.synchronize()
                row["ok"] = True
            except Exception as exc:
                row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[-300:]}")
                traceback.print_exc()
            row["choices"] = CHOICES[before:]
            rows.append(row)
            log(f"{mode} T={t}: {'ran' if row['ok'] else row['error'][:120]}; {row['choices']}")
    dump(out, {"mode": mode, "cache": cache, "buckets": rows})


def call(mode: str, cache: str, t: str) -> None:
    import flashinfer

    w1, w2 = weights()
    x, sel, sc = tokens(int(t))
    with flashinfer.autotune(False, cache=cache):
        moe(x, sel, sc, w1, w2, mode)
    _torch().cuda.synchronize()
    log(f"one {mode} call at T={t} under {cache}: returned normally")


def _graph(fn: Any) -> Any:
    """fn captured in a CUDA graph (as vLLM runs decode), or None where capture fails."""
    torch = _torch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:
        log(f"graph capture failed ({type(exc).__name__}: {exc}); timing eager calls")
        return None
    return graph


def _median_ms(run: Any) -> tuple[float, list[float]]:
    torch = _torch()
    samples = []
    for _ in range(REPEATS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(ITERS):
            run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / ITERS)
    return statistics.median(samples), samples


def time_mode(mode: str, cache: str, out: str) -> None:
    torch = _torch()
    rows = []
    with replaying(cache) as (w1, w2):
        for t in BUCKETS:
            x, sel, sc = tokens(t)
            buf = torch.empty(t, H, dtype=torch.bfloat16, device="cuda")
            before = len(CHOICES)
            moe(x, sel, sc, w1, w2, mode, buf)  # the tactic lookup happens here, outside timing
            chosen = CHOICES[before:]
            call = functools.partial(moe, x, sel, sc, w1, w2, mode, buf)
            graph = _graph(call)
            med, samples = _median_ms(graph.replay if graph is not None else call)
            eager, _ = _median_ms(call)
            rows.append(
                {
                    "tokens": t,
                    "ms": med,
                    "samples_ms": samples,
                    "eager_ms": eager,
                    "graph": graph is not None,
                    "choices": chosen,
                }
            )
            log(
                f"{mode} T={t}: {med * 1000:.1f} us (graph={graph is not None}), eager "
                f"{eager * 1000:.1f} us; {chosen}"
            )
    dump(out, {"mode": mode, "cache": cache, "repeats": REPEATS, "iters": ITERS, "buckets": rows})


def determinism(mode: str, cache: str, out: str) -> None:
    torch = _torch()
    rows = []
    with replaying(cache) as (w1, w2):
        for t in BUCKETS:
            x, sel, sc = tokens(t, seed=7)
            before = len(CHOICES)
            outs = [moe(x, sel, sc, w1, w2, mode).clone() for _ in range(REPS)]
            torch.cuda.synchronize()
            ref = outs[0]
            equal = sum(bool(torch.equal(o, ref)) for o in outs[1:])
            diff = max(float((o.float() - ref.float()).abs().max()) for o in outs[1:])
            distinct = len({o.view(torch.int16).cpu().numpy().tobytes() for o in outs})
            rows.append(
                {
                    "tokens": t,
                    "reps": REPS,
                    "bitwise_identical": equal == REPS - 1,
                    "distinct_outputs": distinct,
                    "max_abs_diff": diff,
                    "choices": CHOICES[before : before + 2],
                }
            )
            log(f"{mode} T={t}: {distinct} distinct outputs in {REPS} runs, max diff {diff:g}")
    dump(out, {"mode": mode, "cache": cache, "buckets": rows})


# --- report -------------------------------------------------------------------------------------


def _load(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / name
    return json.loads(path.read_text()) if path.is_file() else None


def _gemm2(row: dict[str, Any]) -> str:
    tactics = [c["tactic"] for c in row.get("choices", []) if c["op"] == "gemm2"]
    return str(tactics[0]) if tactics else "-"


def report(directory: str) -> int:
    """Markdown tables from the JSON results in `directory`; exit 1 if the unfused namespace's
    tactics were not bitwise stable (the evidence behind `serve --deterministic`)."""
    d = Path(directory)
    code = 0
    tf, tu = _load(d, "time-fused.json"), _load(d, "time-unfused.json")
    if tf and tu:
        print(
            f"FlashInfer {tf['flashinfer']} on {tf['gpu']}: MoE layer time per call, median of "
            f"{tf['repeats']} x {tf['iters']} CUDA-graph replays (CUDA events)\n"
        )
        print("| tokens | fused (us) | gemm2 id | unfused (us) | gemm2 id | unfused/fused |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for a, b in zip(tf["buckets"], tu["buckets"], strict=True):
            print(
                f"| {a['tokens']} | {a['ms'] * 1e3:.1f} | {_gemm2(a)} | {b['ms'] * 1e3:.1f} | "
                f"{_gemm2(b)} | {b['ms'] / a['ms']:.3f} |"
            )
        mix_f = sum(a["ms"] for a in tf["buckets"] if a["tokens"] in DECODE_MIX)
        mix_u = sum(b["ms"] for b in tu["buckets"] if b["tokens"] in DECODE_MIX)
        print(
            f"\ndecode-like mix (one step each at {DECODE_MIX} tokens): fused "
            f"{mix_f * 1e3:.1f} us, unfused {mix_u * 1e3:.1f} us: unfused costs "
            f"{100 * (mix_u / mix_f - 1):+.1f} %\n"
        )
    for mode in ("unfused", "fused"):
        det = _load(d, f"determinism-{mode}.json")
        if not det:
            continue
        stable = [r["tokens"] for r in det["buckets"] if r["bitwise_identical"]]
        unstable = [r["tokens"] for r in det["buckets"] if not r["bitwise_identical"]]
        reps = det["buckets"][0]["reps"]
        print(
            f"determinism, {mode} namespace's tactics, {reps} identical calls per bucket: "
            f"bitwise identical at {len(stable)} of {len(det['buckets'])} buckets"
            + (f"; differing at {unstable}" if unstable else "")
        )
        if mode == "unfused" and unstable:
            code = 1
    return code


COMMANDS = {
    "counts": counts,
    "tune": tune,
    "replay": replay,
    "call": call,
    "time": time_mode,
    "determinism": determinism,
    "report": report,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)  # the subcommands and their arguments, exit 1
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "report":
        sys.exit(report(*args))
    log(f"{cmd} {args} pid={os.getpid()}")
    COMMANDS[cmd](*args)
