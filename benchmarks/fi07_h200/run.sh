#!/usr/bin/env bash
# FlashInfer 0.7.2.post1 (vLLM 0.33's pin) and 0.6.18 on one H200, driven directly (vLLM 0.32/0.33
# need torch 2.13; the machine has 2.11): the v2 store written on the GPU and read by fi-cache, and
# which buckets a restart on the unchanged cache profiles again, and why (issue 22 item 4).
# README.md beside this file has the calls. On the GPU machine, from the repo root:
#   bash run.sh go             install the carried payload (.fi07/), start the pipeline (setsid)
#   bash run.sh poll SECONDS   wait up to SECONDS for DONE, then show where it is
#   bash run.sh collect OUT    results as OUT/fi07-results.tgz
# Everything that must outlive one command lives under /tmp/fi07 (the checkout is re-sent per call).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
V=${FI07:-/tmp/fi07}
R=$V/results
PY=${PY:-python3}
PLAN=${PLAN:-examples/plans/h200-gemm.toml}
VERSIONS="0.7.2.post1 0.6.18"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
step() { echo "=== $(date +%T) $*"; }

install() {
  local man=$REPO/.fi07/MANIFEST.json want have ver
  want=$($PY -c "import json; print(json.load(open('$man'))['sha256'])") || return 1
  have=$(sha256sum "$REPO/.fi07/payload.tar.xz" | cut -d' ' -f1)
  [ "$have" = "$want" ] || { echo "sha256 mismatch: $have != $want"; return 1; }
  rm -rf $V && mkdir -p $V/payload $R && tar xJf "$REPO/.fi07/payload.tar.xz" -C $V/payload || return 1
  for ver in $VERSIONS; do  # one site per FlashInfer: the unpacked wheel plus the three deps
    mv $V/payload/flashinfer-$ver $V/site-$ver
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $V/site-$ver \
      $V/payload/wheels/*.whl 2>&1 | grep -v "as the 'root' user" | tail -3
  done
  # fi-cache as committed (.fi07/src, git archive of HEAD): the checkout may hold others' edits.
  cp -r "$REPO/.fi07/src" $V/src && cp -r "$HERE" $V/bench && cp "$REPO/$PLAN" $V/plan.toml
  echo "payload sha256 ok; fi-cache $(cat $V/src/COMMIT)"
}

venv() {  # venv VERSION: the environment of one FlashInfer version
  export PYTHONPATH=$V/site-$1:$V/src FLASHINFER_WORKSPACE_BASE=$V/ws-$1
}

host() {
  nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1; command -v $PY; $PY -V
  for ver in $VERSIONS; do
    (venv $ver; $PY -c "import flashinfer, torch, cudnn, tvm_ffi; from flashinfer.autotuner import autotuner as a; print(flashinfer.__version__, torch.__version__, torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__, 'tvm-ffi', tvm_ffi.__version__); print(a._collect_metadata())")
  done
}

pipeline() {
  local ver t0 pids=""
  step "host"; host > $R/host.txt 2>&1; cat $R/host.txt
  step "warm-up (JIT builds of both versions, side by side; not measured)"
  t0=$(date +%s)
  for ver in $VERSIONS; do
    (venv $ver; $PY $V/bench/restarts.py child --plan $V/plan.toml --format v1 \
      --cache $V/warmup-$ver/warmup.json --out $R/warmup-$ver.json > $R/warmup-$ver.log 2>&1
     echo "warm-up $ver rc=$? wall_s=$(( $(date +%s) - t0 ))") &
    pids="$pids $!"
  done
  wait $pids
  step "0.7.2.post1: v1 file and v2 store, 3 runs (+1 with vLLM's v2 policy)"
  (venv 0.7.2.post1; $PY $V/bench/restarts.py bench --plan $V/plan.toml --out $R/0.7.2.post1 \
    --formats v1,v2 --runs 3 --policy-run)
  step "0.6.18: v1 file, 3 runs"
  (venv 0.6.18; $PY $V/bench/restarts.py bench --plan $V/plan.toml --out $R/0.6.18 --formats v1 --runs 3)
  step "fi-cache ls / verify / doctor on the files FlashInfer wrote"
  ficache 0.7.2.post1 v2 $R/0.7.2.post1/files/v2-restart/root
  ficache 0.7.2.post1 v2-vllm-policy $R/0.7.2.post1/files/v2-vllm-policy-restart/root
  ficache 0.7.2.post1 v1 $R/0.7.2.post1/files/v1-restart/autotune_configs_dp0_rank0.json
  ficache 0.6.18 v1 $R/0.6.18/files/v1-restart/autotune_configs_dp0_rank0.json
  step "summary"
  $PY $V/bench/restarts.py summary $R/0.7.2.post1 $R/0.6.18 > $R/summary.md 2>&1
  cat $R/summary.md | head -60
  step "done"; touch $V/DONE
}

ficache() {  # ficache VERSION NAME PATH: fi-cache's readers, in that FlashInfer's environment
  local ver=$1 name=$2 path=$3 out=$R/fi-cache/$1-$2 cmd
  mkdir -p $out
  for cmd in "ls --no-store" "ls -l --no-store" "verify" "doctor"; do
    (venv $ver; cd $V; $PY -m fi_cache --store $V/store-$ver $cmd "$path" \
      > "$out/${cmd// /_}.txt" 2>&1; echo "exit_code=$?" >> "$out/${cmd// /_}.txt")
    (venv $ver; cd $V; $PY -m fi_cache --store $V/store-$ver --format json $cmd "$path" \
      > "$out/${cmd// /_}.json" 2> "$out/${cmd// /_}.err")
  done
  tail -n +1 "$out"/*.txt | cut -c1-200 | head -40
}

go() {
  install || return 1
  rm -f $V/DONE
  setsid nohup bash $V/bench/run.sh pipeline > $V/pipeline.log 2>&1 < /dev/null &
  echo "pipeline started at $(date +%T)"
}

poll() {
  local end=$(( $(date +%s) + ${1:-240} ))
  while [ "$(date +%s)" -lt $end ] && [ ! -f $V/DONE ]; do sleep 5; done
  date +%T; [ -f $V/DONE ] && echo DONE
  tail -40 $V/pipeline.log | cut -c1-400
}

collect() {
  mkdir -p "$1" && cp $V/pipeline.log $R/ 2>/dev/null
  tar czf "$1/fi07-results.tgz" -C $V results && ls -l "$1"
}

"$@"
