#!/usr/bin/env bash
# The MoE benchmark on one H200, in one machine hold (see docs/benchmarks.md):
#   bash run.sh start [VERSIONS]   install the wheels, write the trimmed sources and ninja files, then
#                                  run `pipeline` in its own session (it outlives this command)
#   bash run.sh poll SECONDS       wait up to SECONDS for the pipeline, then show where it is
#   bash run.sh collect OUT        copy each version's results (a .tgz) and the log into OUT
# Wheels: WHEELS/common/*.whl plus WHEELS/<version>/*.whl (FlashInfer, for Python 3.12); see
# docs/benchmarks.md for the pip download line and the device calls.
# Everything that must outlive one command lives under /tmp (the checkout is re-synced per call).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WHEELS=${WHEELS:-$HERE/wheels}  # ignored by git; carried to the GPU machine
B=/tmp/moe-bench
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} PYTHONUNBUFFERED=1
step() { echo "=== $(date +%T) $*"; }
site() { echo "/tmp/site-$1"; }
ws() { echo "/tmp/moews-$1"; }

start() {
  local versions=${1:-"0.6.17 0.6.18"}
  mkdir -p $B && rm -rf $B/bench $B/fi-cache && cp -r "$HERE" $B/bench
  mkdir -p $B/fi-cache && cp -r "$REPO/fi_cache" "$REPO/examples" $B/fi-cache/
  echo "$versions" > $B/versions
  nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1; ninja --version
  for v in $versions; do
    if [ ! -f "$(site $v)/flashinfer/__init__.py" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$(site $v)" "$WHEELS"/common/*.whl "$WHEELS/$v"/*.whl || return 1
    fi
    mkdir -p "$(ws $v)"
    python3 $B/bench/trim.py sources "$(site $v)/flashinfer" "$(ws $v)/trimgen" 4 > /dev/null || return 1
    FLASHINFER_WORKSPACE_BASE=$(ws $v) PYTHONPATH=$(site $v) \
      python3 $B/bench/trim.py ninja "$(ws $v)/trimgen" > "$(ws $v)/build.json" || return 1
    python3 -c "import json; d = json.load(open('$(ws $v)/build.json')); print('$v', {k: d[k] for k in ('n_tu', 'n_tu_full', 'notes')})"
  done
  rm -f $B/DONE
  setsid nohup bash $B/bench/run.sh pipeline > $B/pipeline.log 2>&1 < /dev/null &
  echo "pipeline started at $(date +%T)"
}

build() {  # build VERSION JOBS: the trimmed module, installed where FlashInfer loads AOT modules
  local v=$1 j=$2 bj ninja so aot
  bj=$(ws $v)/build.json
  ninja=$(python3 -c "import json; print(json.load(open('$bj'))['ninja'])")
  so=$(python3 -c "import json; print(json.load(open('$bj'))['so'])")
  aot=$(python3 -c "import json; print(json.load(open('$bj'))['aot_target'])")
  local t0; t0=$(date +%s)
  (cd "$(dirname "$ninja")" && ninja -f build.ninja -j"$j" -k 0) > "$(ws $v)/build.log" 2>&1
  local rc=$?
  echo "$v build rc=$rc wall_s=$(( $(date +%s) - t0 )) jobs=$j" | tee "$(ws $v)/build_time.txt"
  [ $rc -eq 0 ] && [ -f "$so" ] || return 1
  mkdir -p "$(dirname "$aot")" && cp "$so" "$aot"
}

experiments() {  # experiments VERSION: everything but the build, results in $B/results/VERSION
  local v=$1 R=$B/results/$1 ST=$B/store-$1 S=$B/bench/moe_bench.py
  mkdir -p "$R" && cp "$(ws $v)/build_time.txt" "$(ws $v)/build.json" "$R/" 2>/dev/null
  export PYTHONPATH=$(site $v):$B/fi-cache FLASHINFER_WORKSPACE_BASE=$(ws $v)
  local fc="python3 -m fi_cache --store $ST"
  cd "$R" || return 1
  step "$v counts"; timeout 300 python3 $S counts counts.json > counts.log 2>&1
  step "$v fi-cache warm --engine flashinfer, both modes"
  rm -rf "$ST"
  (cd $B/fi-cache && timeout 900 $fc warm --engine flashinfer --plan examples/plans/qwen3-30b-a3b-moe.toml) > warm.txt 2>&1
  echo "exit_code=$?" >> warm.txt; tail -6 warm.txt
  $fc --format json ls > ls.json 2> ls.err
  local fused unfused
  fused=$(python3 -c "import json; print([c['path'] for c in json.load(open('ls.json'))['caches'] if '/fused-' in c['path']][0])")
  unfused=$(python3 -c "import json; print([c['path'] for c in json.load(open('ls.json'))['caches'] if '/unfused-' in c['path']][0])")
  cp "$fused" fused-namespace.json; cp "$unfused" unfused-namespace.json
  step "$v unfused run under the fused namespace's file (caught per bucket, then one uncaught call)"
  FLASHINFER_LOGGING_LEVEL=DEBUG timeout 300 python3 $S replay unfused "$fused" replay-unfused-under-fused.json > replay-unfused-under-fused.log 2>&1
  timeout 300 python3 $S call unfused "$fused" 1 > call-unfused-under-fused.log 2>&1
  echo "exit_code=$?" >> call-unfused-under-fused.log; tail -2 call-unfused-under-fused.log
  step "$v the price of determinism: each mode under its own namespace's file"
  timeout 300 python3 $S time fused "$fused" time-fused.json > time-fused.log 2>&1
  timeout 300 python3 $S time unfused "$unfused" time-unfused.json > time-unfused.log 2>&1
  step "$v determinism check"
  timeout 300 python3 $S determinism unfused "$unfused" determinism-unfused.json > determinism-unfused.log 2>&1
  timeout 300 python3 $S determinism fused "$fused" determinism-fused.json > determinism-fused.log 2>&1
  if [ "$v" != "0.6.17" ]; then
    step "$v both modes in one file: unfused tuned into a copy of the fused file, then replayed"
    cp "$fused" both-modes.json
    timeout 300 python3 $S tune unfused both-modes.json tune-unfused-into-fused.json > tune-both.log 2>&1
    timeout 300 python3 $S replay unfused both-modes.json replay-both-unfused.json > replay-both-unfused.log 2>&1
    timeout 300 python3 $S replay fused both-modes.json replay-both-fused.json > replay-both-fused.log 2>&1
  fi
  step "$v doctor"
  $fc --format json doctor "$R/fused-namespace.json" --finalize unfused > doctor-fused-as-unfused.json 2> doctor-fused-as-unfused.err
  echo "exit_code=$?" >> doctor-fused-as-unfused.err
  $fc doctor --log "$R/replay-unfused-under-fused.log" > doctor-log-replay.txt 2>&1
  $fc doctor --log "$R/call-unfused-under-fused.log" > doctor-log-call.txt 2>&1
  $fc doctor > doctor-store.txt 2>&1; echo "exit_code=$?" >> doctor-store.txt
  python3 $S report "$R" > report.md 2> report.err; echo "exit_code=$?" >> report.err
  cat report.md
  (cd "$ST" && tar czf "$R/store.tgz" .) 2>/dev/null
  cd $B || return 1
}

pipeline() {
  local versions; versions=$(cat $B/versions)
  set -- $versions
  step "build $1"; build "$1" 16 || { step "BUILD FAILED $1"; touch $B/DONE; return 1; }
  local next=${2:-} pid=
  if [ -n "$next" ]; then step "build $next in the background"; build "$next" 14 & pid=$!; fi
  experiments "$1"
  if [ -n "$next" ]; then
    wait $pid || { step "BUILD FAILED $next"; touch $B/DONE; return 1; }
    experiments "$next"
  fi
  step "pipeline done"; touch $B/DONE
}

poll() {
  local end=$(( $(date +%s) + ${1:-240} ))
  while [ "$(date +%s)" -lt $end ] && [ ! -f $B/DONE ]; do sleep 5; done
  date +%T; echo "load $(cat /proc/loadavg)"
  for v in $(cat $B/versions); do
    echo "$v: $(grep -c '^\[' "$(ws $v)/build.log" 2>/dev/null) build lines; $(cat "$(ws $v)/build_time.txt" 2>/dev/null)"
    grep -m3 -A3 " error" "$(ws $v)/build.log" 2>/dev/null | cut -c1-300
  done
  tail -40 $B/pipeline.log | cut -c1-300
}

collect() {
  mkdir -p "$1"
  for v in $(cat $B/versions); do
    [ -d $B/results/$v ] && tar czf "$1/results-$v.tgz" -C $B/results "$v"
  done
  cp $B/pipeline.log "$1/"
}

"$@"
