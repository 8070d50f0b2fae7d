#!/usr/bin/env bash
# Issue 44 on one GPU (the device tool): how many entries of a fresh FlashInfer tune are slower
# than FlashInfer's default (`fi-cache bench`), and how many entries two fresh tunes differ in,
# plain and with `warm --engine flashinfer --repeat 3` (`fi-cache diff`), for FlashInfer 0.6.18
# and 0.7.2.post1 on examples/plans/h200-gemm.toml (mm_bf16 cuBLASLt + cuDNN, bmm_fp8 cuBLAS).
# The payload is benchmarks/fi07_h200/payload.py's (built into .fi44/); README.md has the calls.
#   bash run.sh go             install the carried payload, start the pipeline (setsid)
#   bash run.sh poll SECONDS   wait up to SECONDS for DONE, then show where it is
#   bash run.sh collect OUT    results as OUT/verdict-results.tgz
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
V=${B44:-/tmp/b44}
R=$V/results
PY=${PY:-python3}
PLAN=${PLAN:-examples/plans/h200-gemm.toml}
VERSIONS=${VERSIONS:-"0.6.18 0.7.2.post1"}
RUNS=${RUNS:-3}
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
step() { echo "=== $(date +%T) $*"; }

install() {
  local man=$REPO/.fi44/MANIFEST.json want have ver
  want=$($PY -c "import json; print(json.load(open('$man'))['sha256'])") || return 1
  have=$(sha256sum "$REPO/.fi44/payload.tar.xz" | cut -d' ' -f1)
  [ "$have" = "$want" ] || { echo "sha256 mismatch: $have != $want"; return 1; }
  rm -rf $V && mkdir -p $V/payload $R && tar xJf "$REPO/.fi44/payload.tar.xz" -C $V/payload || return 1
  for ver in $VERSIONS; do
    mv $V/payload/flashinfer-$ver $V/site-$ver
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $V/site-$ver \
      $V/payload/wheels/*.whl 2>&1 | grep -v "as the 'root' user" | tail -3
  done
  cp -r "$REPO/.fi44/src" $V/src && cp "$REPO/$PLAN" $V/plan.toml
  echo "payload sha256 ok; fi-cache $(cat $V/src/COMMIT)"
}

venv() { export PYTHONPATH=$V/site-$1:$V/src FLASHINFER_WORKSPACE_BASE=$V/ws-$1; }
fic() { $PY -m fi_cache "$@"; }
# timed NAME ARGS...: fi-cache ARGS, stdout/stderr in $D/NAME.json/.err; a line with rc and wall.
timed() {
  local name=$1; shift; local s e rc
  s=$(date +%s.%N); fic "$@" > "$D/$name.json" 2> "$D/$name.err"; rc=$?
  e=$(date +%s.%N); echo "$name rc=$rc wall_s=$($PY -c "print(round($e-$s, 2))")" | tee -a "$D/timing.txt"
}
file_of() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['namespaces'][0]['file'])" "$1"; }

one_version() {
  local ver=$1 i j kind
  D=$R/$ver; mkdir -p $D/files; venv $ver
  # No separate compile warm: plain-1's check child JIT-builds the kernels (its wall includes it).
  for kind in plain repeat; do
    for i in $(seq $RUNS); do
      local extra=""; [ $kind = repeat ] && extra="--repeat 3"
      step "$ver: $kind tune $i"
      timed $kind-$i --store $V/$kind-$ver-$i --format json warm --engine flashinfer \
        --plan $V/plan.toml $extra
      cp "$(file_of $D/$kind-$i.json)" $D/files/$kind-$i.json
    done
    for i in $(seq $RUNS); do for j in $(seq $RUNS); do [ $i -lt $j ] || continue
      fic --format json diff $D/files/$kind-$i.json $D/files/$kind-$j.json > $D/diff-$kind-$i-$j.json
    done; done
  done
  for kind in plain repeat; do
    local n=$RUNS; [ $kind = repeat ] && n=${BENCH_REPEAT:-$RUNS}  # fewer where time is short
    for i in $(seq $n); do
      step "$ver: bench $kind-$i"
      timed bench-$kind-$i --store $V/$kind-$ver-$i --format json bench \
        "$(file_of $D/$kind-$i.json)" --rounds 5
    done
  done
  if [ -f "$REPO/tests/fixtures/h200/flashinfer-$ver-gemm.json" ]; then
    step "$ver: bench of the hand-run fixture"
    timed bench-fixture --store $V/fixture-$ver --format json bench \
      "$REPO/tests/fixtures/h200/flashinfer-$ver-gemm.json" --plan $V/plan.toml --rounds 5
  fi
}

# short: what fits a few minutes of device time, most telling first (n = 2 per kind, not medians).
short_version() {
  local ver=$1
  D=$R/$ver; mkdir -p $D/files; venv $ver
  for step_ in plain-1 plain-2 bench:plain-1 repeat-1 repeat-2 bench:repeat-1; do
    local kind=${step_#bench:} extra=""
    [ "${kind%-*}" = repeat ] && extra="--repeat 3"
    step "$ver: $step_"
    if [ "$step_" != "$kind" ]; then
      timed bench-$kind --store $V/$kind-$ver --format json bench "$(file_of $D/$kind.json)" --rounds 5
    else
      timed $kind --store $V/$kind-$ver --format json warm --engine flashinfer --plan $V/plan.toml $extra
      cp "$(file_of $D/$kind.json)" $D/files/$kind.json
      case $kind in plain-2|repeat-2) k=${kind%-*}
        fic --format json diff $D/files/$k-1.json $D/files/$k-2.json > $D/diff-$k-1-2.json ;; esac
    fi
  done
}

pipeline() {
  step host
  { nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
    $PY -V; $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > $R/host.txt 2>&1
  cat $R/host.txt
  for ver in $VERSIONS; do if [ -n "${SHORT:-}" ]; then short_version $ver; else one_version $ver; fi; done
  step summary
  PYTHONPATH=$V/src $PY "$HERE/summary.py" $R > $R/summary.md 2>&1
  step done; touch $R/DONE
}

case ${1:-} in
  go) install && (setsid bash "$0" pipeline > $V/pipeline.log 2>&1 < /dev/null &) && sleep 2 && tail -3 $V/pipeline.log ;;
  pipeline) mkdir -p $R; pipeline ;;
  poll) for _ in $(seq "${2:-60}"); do [ -f $R/DONE ] && break; sleep 1; done; tail -25 $V/pipeline.log ;;
  collect) cp $V/pipeline.log $R/ 2>/dev/null; tar czf "$2/verdict-results.tgz" -C $V results && ls -la "$2" ;;
  *) echo "usage: run.sh go|pipeline|poll SECONDS|collect OUT"; exit 2 ;;
esac
