#!/usr/bin/env bash
# warm --engine flashinfer on a real GPU: cold tune time, warm replay time, entries, and
# verify/doctor on the result, for one FlashInfer version. Run from the project root on the GPU
# host (the `device` tool) with OUT set to a results dir:
#     bash benchmarks/bench_tune_gpu.sh 0.6.18
# Needs .cache/device-wheels/ (flashinfer-python VERSION and its light deps: the GPU host has no
# network). Results are quoted in docs/benchmarks.md; the files become tests/fixtures/h200-tuned/.
set -u
V=${1:?FlashInfer version}
RUNS=${RUNS:-3}
PLAN=examples/plans/h200-gemm.toml
SITE=/tmp/site-$V
pip install -q --target "$SITE" --no-index --find-links .cache/device-wheels --no-deps \
  "flashinfer-python==$V" apache-tvm-ffi einops ninja tabulate tqdm nvidia-ml-py click filelock \
  platformdirs nvidia-cudnn-frontend 2>&1 | grep -v "as the 'root' user" | tail -3
export PYTHONPATH=$PWD:$SITE FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws-$V   # JIT builds, one per version
R=$OUT/$V; mkdir -p "$R"
{ python -V; python -c "import torch; print('torch', torch.__version__, torch.version.cuda)";
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader; } \
  > "$R/host.txt" 2>&1
# timed NAME ARGS...: `fi-cache ARGS` with stdout/stderr in $R/NAME.json/.err; prints rc and wall.
timed() {
  local name=$1; shift; local s e rc
  s=$(date +%s.%N); python -m fi_cache "$@" > "$R/$name.json" 2> "$R/$name.err"; rc=$?
  e=$(date +%s.%N); echo "$name rc=$rc wall=$(python -c "print(round($e-$s, 2))")s"
}
fic() { python -m fi_cache "$@"; }

# 0. compile: the first run JIT-builds FlashInfer's GEMM modules (not counted as tuning).
timed compile --store /tmp/compile-$V --format json warm --engine flashinfer --plan $PLAN
tail -2 "$R/compile.err"
# 1. cold tunes into fresh stores, kernels compiled.
for i in $(seq "$RUNS"); do
  timed "cold-$i" --store "$R/store-$i" --format json warm --engine flashinfer --plan $PLAN
done
# 2. warm replays of store-1's file: the same calls under autotune(False, cache=FILE).
FILE=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['namespaces'][0]['file'])" "$R/cold-1.json")
for i in $(seq "$RUNS"); do python benchmarks/replay_plan.py $PLAN "$FILE" >> "$R/replay.jsonl" 2>>"$R/replay.err"; done
# 3. a second warm of the same namespace (FlashInfer loads, tunes nothing new, saves nothing).
timed rewarm --store "$R/store-1" --format json warm --engine flashinfer --plan $PLAN
# 4. what fi-cache says about the result.
fic --store "$R/store-1" verify "$R/store-1" > "$R/verify.txt" 2>&1; echo "verify rc=$?"
fic --store "$R/store-1" doctor > "$R/doctor.txt" 2>&1; echo "doctor rc=$?"
fic --store "$R/store-1" --format json ls > "$R/ls.json" 2>&1
# 5. refusals on real hardware: no visible GPU; a backend the H200 cannot run.
CUDA_VISIBLE_DEVICES= fic --store /tmp/nogpu warm --engine flashinfer --plan $PLAN \
  > /dev/null 2> "$R/nogpu.err"; echo "no-gpu rc=$? $(tail -1 "$R/nogpu.err")"
printf '[[ops]]\nop = "mm_bf16"\nn = 2048\nk = 4096\nbackends = ["cutlass"]\n' > /tmp/sm100.toml
fic --store /tmp/sm100 warm --engine flashinfer --plan /tmp/sm100.toml \
  > /dev/null 2> "$R/sm100.err"; echo "sm100-only rc=$? $(tail -1 "$R/sm100.err")"
cp -r "$R/store-1/namespaces" "$R/tuned-namespaces"
rm -rf "$R"/store-*
tar czf "$OUT/tune-$V.tgz" -C "$OUT" "$V" && rm -rf "$R"  # one file back, however many runs
