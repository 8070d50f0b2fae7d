#!/usr/bin/env bash
# Real `vllm serve` (vLLM 0.26.0, PATCHED with PR #54948's variable: patch_vllm.py) with FlashInfer
# 0.6.17's CUTLASS fused MoE (bf16 TEST BUILD of fused_moe_90: ../moe_h200/trim.py) on one H200,
# in one machine hold (issue 22; README.md beside this file):
#   bash run.sh recv               copy the carried .gpu22/part* and MANIFEST.json to /tmp/v22/parts
#   bash run.sh early              recv + FlashInfer and tvm-ffi out of part1 alone (the tar's first
#                                  members) into /tmp/v22/bsite + build from them: the call carrying
#                                  part1 starts the build; `go` then installs and lets the steps run
#   bash run.sh install            join, check sha256, pip install --target /tmp/v22/site, patch, versions
#   bash run.sh build              the trimmed module (setsid, background); then steps $STEPS ("1 2 3";
#                                  STEPS= : none)
#   bash run.sh go                 recv + install + build (after `early`: no build, the steps
#                                  start once it is done): the call that carries the last part
#   bash run.sh steps [STEPS]      steps "1 2 3" (default) in the background; DONE when over
#   bash run.sh poll SECONDS       wait up to SECONDS for DONE, then show where things are
#   bash run.sh collect OUT        results, logs and cache dirs as OUT/v22-results.tgz (<= 16 MiB)
# Everything that must outlive one command lives under /tmp/v22 (the checkout is re-synced per call).
# Set at `go` (snapshot): STEPS, S3_LEFT (seconds from go's start by which step 3m must be over;
# no start begins that would end later), FI_CACHE_SRC (the fi_cache package to copy; default the
# checkout's).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
V=${V22:-/tmp/v22}
PY=${PY:-python3}
R=$V/results
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_WORKSPACE_BASE=$V/ws
step() { echo "=== $(date +%T) $*"; }

recv() {  # idempotent: a part already there with the same bytes is not copied again
  mkdir -p $V/parts
  local f
  for f in "$REPO"/.gpu22/part* "$REPO"/.gpu22/MANIFEST.json; do
    [ -f "$f" ] || continue
    cmp -s "$f" "$V/parts/$(basename "$f")" || cp "$f" "$V/parts/"
  done
  ls -l $V/parts
}

install() {
  [ -f $V/site/vllm/envs.py ] && { echo "already installed in $V/site"; versions; return 0; }
  local man=$V/parts/MANIFEST.json
  [ -f "$man" ] || { echo "no $man: carry .gpu22/MANIFEST.json with a part"; return 1; }
  local want have
  want=$($PY -c "import json; print(' '.join(p['path'] for p in json.load(open('$man'))['parts']))")
  for p in $want; do [ -f $V/parts/$p ] || { echo "missing part $p (have: $(ls $V/parts))"; return 1; }; done
  (cd $V/parts && cat $want) > $V/payload.tar.xz
  have=$(sha256sum $V/payload.tar.xz | cut -d' ' -f1)
  want=$($PY -c "import json; print(json.load(open('$man'))['sha256'])")
  [ "$have" = "$want" ] || { echo "sha256 mismatch: $have != $want"; return 1; }
  echo "payload sha256 ok ($have)"
  rm -rf $V/wheels && $PY -c "import tarfile; tarfile.open('$V/payload.tar.xz', 'r:xz').extractall('$V', filter='data')"
  rm -f $V/payload.tar.xz  # 480 MB of wheels are enough on disk
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $V/site $V/wheels/*.whl || return 1
  $PY "$HERE/patch_vllm.py" $V/site ${PATCH_ARGS:-} || return 1
  versions
}

versions() {
  nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1; ninja --version
  head -1 $V/site/bin/vllm; command -v $PY
  PYTHONPATH=$V/site $PY -c "import sys, importlib.metadata as md; print(sys.executable, sys.version.split()[0]); print({n: md.version(n) for n in ['vllm', 'flashinfer-python', 'torch', 'transformers', 'triton', 'numpy', 'apache-tvm-ffi', 'nvidia-cudnn-frontend', 'fastapi', 'pydantic', 'openai', 'xgrammar']})"
}

early() {  # part1 alone: its sha256, then the tar's first members (payload.py EARLY), then build
  recv || return 1
  local man=$V/parts/MANIFEST.json want have
  want=$($PY -c "import json; print(json.load(open('$man'))['parts'][0]['sha256'])") || return 1
  have=$(sha256sum $V/parts/part1 | cut -d' ' -f1)
  [ "$have" = "$want" ] || { echo "part1 sha256 mismatch: $have != $want"; return 1; }
  rm -rf $V/early $V/bsite && mkdir -p $V/early
  # tarfile's stream mode reads the xz stream from its start and stops after the wanted members,
  # before the cut at the part's end; each wheel's zip CRCs are then checked
  $PY - "$man" $V/parts/part1 $V/early <<'PYEOF' || return 1
import json, sys, tarfile, zipfile
names = set(json.load(open(sys.argv[1]))["early"])
got = []
with tarfile.open(sys.argv[2], mode="r|xz") as tf:
    for m in tf:
        if m.name in names:
            tf.extract(m, sys.argv[3], filter="data")
            got.append(m.name)
        if len(got) == len(names):
            break
assert sorted(got) == sorted(names), (got, names)
for n in got:
    assert zipfile.ZipFile(f"{sys.argv[3]}/{n}").testzip() is None, n
print("early wheels:", got)
PYEOF
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $V/bsite $V/early/wheels/*.whl || return 1
  touch $V/EARLY  # before the build starts: its background job looks for it when it is over
  BUILD_SITE=$V/bsite build || { rm -f $V/EARLY; return 1; }  # then `go` builds as before
}

build() {  # in the background: the bf16 fused_moe_90, installed as FlashInfer's AOT module
  local bs=${BUILD_SITE:-$V/site}  # early: $V/bsite (the same FlashInfer wheel as $V/site's)
  mkdir -p $V/ws && cp "$REPO/benchmarks/moe_h200/trim.py" $V/trim.py
  $PY $V/trim.py sources $bs/flashinfer $V/ws/trimgen 4 > /dev/null || return 1
  PYTHONPATH=$bs $PY $V/trim.py ninja $V/ws/trimgen > $V/build.json || return 1
  $PY -c "import json; d = json.load(open('$V/build.json')); print({k: d[k] for k in ('n_tu', 'n_tu_full', 'notes', 'aot_target')})"
  snapshot
  rm -f $V/DONE $V/BUILT
  setsid nohup bash $V/bench/run.sh _build_bg > $V/pipeline.log 2>&1 < /dev/null &
  echo "build started at $(date +%T); then steps: $(cat $V/autosteps)"
}

snapshot() {  # the scripts and fi-cache as they are now: the checkout is replaced between calls
  rm -rf $V/bench $V/fi-cache && mkdir -p $V/fi-cache && cp -r "$HERE" $V/bench
  cp -r "${FI_CACHE_SRC:-$REPO/fi_cache}" $V/fi-cache/fi_cache && cp "$REPO/benchmarks/moe_h200/trim.py" $V/bench/
  [ -f "${FI_CACHE_SRC:-/nonexistent}/../COMMIT" ] && cp "$FI_CACHE_SRC/../COMMIT" $V/fi-cache/COMMIT
  echo "${STEPS-1 2 3}" > $V/autosteps
  if [ -n "${S3_LEFT:-}" ]; then echo $(( ${GO_T0:-$(date +%s)} + S3_LEFT )) > $V/s3_end; fi
}

_build_bg() {
  local ninja so aot t0 rc
  ninja=$($PY -c "import json; print(json.load(open('$V/build.json'))['ninja'])")
  so=$($PY -c "import json; print(json.load(open('$V/build.json'))['so'])")
  aot=$($PY -c "import json; print(json.load(open('$V/build.json'))['aot_target'])")
  step "build"; t0=$(date +%s)
  (cd "$(dirname "$ninja")" && ninja -f build.ninja -j16 -k 0) > $V/build.log 2>&1
  rc=$?
  echo "build rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee $V/build_time.txt
  if [ $rc -ne 0 ] || [ ! -f "$so" ]; then step "BUILD FAILED"; touch $V/DONE; return 1; fi
  touch $V/BUILT
  if [ -f $V/EARLY ]; then  # built from $V/bsite while the parts travelled: wait for `go`
    local waited=0
    step "built; waiting for the install (go)"
    while [ ! -f $V/READY ]; do
      sleep 2; waited=$(( waited + 2 ))
      [ $waited -lt 1500 ] || { step "no install after 1500 s"; touch $V/DONE; return 1; }
    done
    aot="$V/site/${aot#"$V/bsite/"}"  # FlashInfer's AOT dir is inside its package
  fi
  mkdir -p "$(dirname "$aot")" && cp "$so" "$aot" && echo "AOT module: $aot"
  local s; s=$(cat $V/autosteps)
  if [ -n "$s" ]; then _steps "$s"; else touch $V/DONE; fi
}

go() {
  GO_T0=$(date +%s)  # S3_LEFT counts from here
  recv && install || return 1
  if [ -f $V/EARLY ]; then  # the build is under way (or over): it runs the steps once READY
    snapshot && touch $V/READY && echo "installed at $(date +%T); steps: $(cat $V/autosteps)"
  else
    build || return 1
  fi
  smoke
}

smoke() {  # while the build runs: vLLM's serve path imports, fi-cache sees the patched vLLM
  step "smoke"
  PYTHONPATH=$V/site $PY -c "import vllm.entrypoints.openai.api_server, vllm.model_executor.models.qwen3_moe, vllm.v1.attention.backends.triton_attn, vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe, flashinfer.fused_moe; print('imports ok')" 2>&1 | tail -3
  (cd $V && PYTHONPATH=$V/site:$V/fi-cache $PY -m fi_cache --store $V/store env 2>&1 | tail -12)
}

steps() {
  [ -f $V/BUILT ] || { echo "no module built yet ($V/BUILT)"; return 1; }
  snapshot; rm -f $V/DONE
  setsid nohup bash $V/bench/run.sh _steps "${1:-1 2 3}" >> $V/pipeline.log 2>&1 < /dev/null &
  echo "steps started at $(date +%T)"
}

# --- the steps (run from the snapshot in $V/bench) ---------------------------------------------
MODEL=$V/model
VLLM=$V/site/bin/vllm
BASE=("$MODEL" --load-format dummy --enforce-eager --attention-backend TRITON_ATTN
  --moe-backend flashinfer_cutlass --enable-flashinfer-autotune --max-num-batched-tokens 512
  --max-num-seqs 16 --gpu-memory-utilization 0.5)
A=(--max-model-len 1024)  # config A; B and C change only the length: a new vLLM hash, same MoE shapes
B=(--max-model-len 2048)
C=(--max-model-len 768)

venv() {  # the environment of every run (offline, no FlashInfer sampler JIT, our site first)
  export PYTHONPATH=$V/site:$V/fi-cache PATH=$V/site/bin:$PATH HF_HUB_OFFLINE=1
  export TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_FLASHINFER_SAMPLER=0
  unset VLLM_FLASHINFER_MOE_FUSED_FINALIZE VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR
}

serve1() {  # serve1 NAME PORT [ENV=V...] -- ARGS...: plain vLLM until /health, one completion
  local name=$1 port=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" $PY $V/bench/vserve.py $R "$name" --health "$port" --request "$MODEL" \
    --timeout 600 -- $VLLM serve "$@" --port "$port"
}

fc() { $PY -m fi_cache --store $V/store "$@"; }

cache_of() { $PY -c "import json; f = json.load(open('$R/$1.json'))['cache_files']; print(f[0] if f else '')"; }

step1() {  # plain vLLM: fused start tunes and saves; unfused start on the same cache root
  local root=$V/plain hf hu
  step "1a plain vLLM, fused (default), cold"
  serve1 1a-plain-fused-cold 8022 VLLM_CACHE_ROOT=$root -- "${BASE[@]}" "${A[@]}"
  step "1b plain vLLM, unfused (VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0), same VLLM_CACHE_ROOT"
  serve1 1b-plain-unfused 8022 VLLM_CACHE_ROOT=$root VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 -- "${BASE[@]}" "${A[@]}"
  cp -r $root $R/plain-after-1b
  hf=$(cache_of 1a-plain-fused-cold); hu=$(cache_of 1b-plain-unfused)
  echo "fused file: $hf"; echo "unfused file: $hu"
  if [ -n "$hu" ] && [ "$hf" != "$hu" ] && [ -f "$hf" ]; then
    # The registered variable is hashed (0.26 compile_factors): another hash dir, no collision.
    # 1c: the fused file where the unfused start reads (a shared/copied dir; vLLM 0.30+'s layout).
    step "1c unfused start reading the fused file (copied over the unfused hash dir's file)"
    mkdir -p "$(dirname "$hu")" && cp "$hf" "$hu"
    serve1 1c-plain-unfused-on-fused-file 8022 VLLM_CACHE_ROOT=$root VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 -- "${BASE[@]}" "${A[@]}"
    cp -r $root $R/plain-after-1c
  fi
}

death_log() {  # the step-1 log that has the gemm2 error
  grep -l "Invalid gemm2 profile id" $R/1c-*.log $R/1b-*.log 2>/dev/null | head -1
}

step2() {  # fi-cache: each mode in its own namespace; doctor on step 1's log and on the arguments
  step "2a fi-cache warm (fused)"
  env VLLM_CACHE_ROOT=$V/fc-root $PY $V/bench/vserve.py $R 2a-fc-warm-fused --timeout 600 -- \
    $PY -m fi_cache --store $V/store warm --vllm $VLLM -- "${BASE[@]}" "${A[@]}"
  step "2b fi-cache serve --deterministic (warms unfused when cold, then serves) + a completion"
  env VLLM_CACHE_ROOT=$V/fc-root $PY $V/bench/vserve.py $R 2b-fc-serve-deterministic --health 8023 \
    --request "$MODEL" --timeout 900 -- $PY -m fi_cache --store $V/store serve --deterministic \
    --vllm $VLLM -- "${BASE[@]}" "${A[@]}" --port 8023
  local dl; dl=$(death_log)
  step "2c fi-cache doctor --log ${dl:-NONE}"
  if [ -n "$dl" ]; then
    fc doctor --log "$dl" > $R/2c-doctor-log.txt 2>&1; echo "exit_code=$?" >> $R/2c-doctor-log.txt
    fc --format json doctor --log "$dl" > $R/2c-doctor-log.json 2> $R/2c-doctor-log.err
  fi
  step "2d fi-cache doctor -- ARGS (as step 1 ran: fused, unfused) and the store"
  env VLLM_CACHE_ROOT=$V/plain $PY -m fi_cache --store $V/store --format json doctor -- $VLLM serve \
    "${BASE[@]}" "${A[@]}" > $R/2d-doctor-args-fused.json 2> $R/2d-doctor-args-fused.err
  env VLLM_CACHE_ROOT=$V/plain VLLM_FLASHINFER_MOE_FUSED_FINALIZE=0 $PY -m fi_cache --store $V/store \
    --format json doctor -- $VLLM serve "${BASE[@]}" "${A[@]}" \
    > $R/2d-doctor-args-unfused.json 2> $R/2d-doctor-args-unfused.err
  # The same two with a fresh store each: fi-cache caches vLLM's answer under a key without the
  # finalize variable (predict.py cache_key), which 0.26 hashes into the dir name.
  local m
  for m in 1 0; do
    env VLLM_CACHE_ROOT=$V/plain VLLM_FLASHINFER_MOE_FUSED_FINALIZE=$m $PY -m fi_cache --store $V/store-doctor-$m \
      --format json doctor -- $VLLM serve "${BASE[@]}" "${A[@]}" \
      > $R/2d-doctor-args-fresh-finalize$m.json 2> $R/2d-doctor-args-fresh-finalize$m.err
  done
  fc --format json ls > $R/2d-ls.json 2> $R/2d-ls.err
  fc doctor > $R/2d-doctor-store.txt 2>&1; echo "exit_code=$?" >> $R/2d-doctor-store.txt
  fc verify > $R/2d-verify.txt 2>&1; echo "exit_code=$?" >> $R/2d-verify.txt
  $PY $V/bench/vserve.py compare $R > $R/2d-predicted-vs-written.json
  cat $R/2d-predicted-vs-written.json
}

step3() {  # start-up times: cold (1a, 2a), config change without and with seeding, unchanged file
  step "3a plain vLLM restart on the unchanged file (config A)"
  serve1 3a-plain-fused-same-file 8022 VLLM_CACHE_ROOT=$V/plain -- "${BASE[@]}" "${A[@]}"
  step "3b plain vLLM after a config change (B: new hash, no seeding)"
  serve1 3b-plain-fused-config-b 8022 VLLM_CACHE_ROOT=$V/plain -- "${BASE[@]}" "${B[@]}"
  step "3c fi-cache warm --no-seed, config B"
  env VLLM_CACHE_ROOT=$V/fc-root $PY $V/bench/vserve.py $R 3c-fc-warm-config-b-noseed --timeout 600 -- \
    $PY -m fi_cache --store $V/store warm --no-seed --vllm $VLLM -- "${BASE[@]}" "${B[@]}"
  step "3d fi-cache warm, config C (seeded from A and B)"
  env VLLM_CACHE_ROOT=$V/fc-root $PY $V/bench/vserve.py $R 3d-fc-warm-config-c-seeded --timeout 600 -- \
    $PY -m fi_cache --store $V/store warm --vllm $VLLM -- "${BASE[@]}" "${C[@]}"
  step "3e fi-cache warm --again, config A (unchanged file)"
  env VLLM_CACHE_ROOT=$V/fc-root $PY $V/bench/vserve.py $R 3e-fc-warm-config-a-again --timeout 600 -- \
    $PY -m fi_cache --store $V/store warm --again --vllm $VLLM -- "${BASE[@]}" "${A[@]}"
}

# Step 3m: 3 runs each, medians (vserve.py stats). One namespace's first file (a cold `fi-cache
# warm`, A), copied for plain vLLM; then, round by round, the goal's pair first: plain vLLM
# restarted on the unchanged file (A) and a seeded `fi-cache warm` of a new config (a new
# --max-model-len each round: a new vLLM hash); after all three rounds of those, as time allows,
# plain vLLM after a config change (no seeding: a new length, an empty hash dir) and a cold plain
# start (a fresh VLLM_CACHE_ROOT, no autotune dir). No start begins unless its estimate (the last
# run of its kind + 10 s, else S3_EST) fits before $V/s3_end.
S3_L=(640 704 832)     # seeded: config changes, each a new hash
S3_N=(1280 1536 1792)  # no seeding: config changes, each a new hash
declare -A S3_EST=([cold-warm]=150 [same-file]=60 [seeded]=70 [noseed]=95 [cold]=115)

s3_left() { echo $(( $(cat $V/s3_end 2>/dev/null || echo 0) - $(date +%s) )); }

s3_fits() {  # s3_fits KIND NAME: is there time for one more start of KIND?
  local est=${S3_EST[$1]} left; left=$(s3_left)
  [ -f $R/est-$1 ] && est=$(( $(cat $R/est-$1) + 10 ))
  if [ "$left" -lt "$est" ]; then
    echo "$2: not started, ${left} s left before the deadline < ${est} s estimated" | tee -a $R/not-run.txt
    return 1
  fi
}

s3_plain() {  # s3_plain KIND NAME [ENV=V...] -- ARGS: plain vLLM to /health (no completion)
  local kind=$1 name=$2 t; shift 2
  s3_fits "$kind" "$name" || return 1
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  t=$(s3_left); [ "$t" -gt 300 ] && t=300
  step "3m $name (plain vLLM; ${envs[*]}; ${*: -2})"
  env "${envs[@]}" $PY $V/bench/vserve.py $R "$name" --health 8022 --timeout "$t" -- \
    $VLLM serve "$@" --port 8022
  $PY -c "import json; print(int(json.load(open('$R/$name.json'))['wall_s']))" > $R/est-$kind
}

s3_warm() {  # s3_warm KIND NAME [WARM OPTIONS] -- ARGS: fi-cache warm, /health watched on its port
  local kind=$1 name=$2 t; shift 2
  s3_fits "$kind" "$name" || return 1
  local opts=(); while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift
  t=$(s3_left); [ "$t" -gt 300 ] && t=300
  step "3m $name (fi-cache warm ${opts[*]}; ${*: -2})"
  $PY $V/bench/vserve.py $R "$name" --watch-health 8024 --launch-marker "fi-cache: starting " \
    --healthy-marker "fi-cache: healthy: " --timeout "$t" -- $PY -m fi_cache --store $V/store warm --port 8024 --timeout "$t" "${opts[@]}" \
    --vllm $VLLM -- "$@"
  $PY -c "import json; print(int(json.load(open('$R/$name.json'))['wall_s']))" > $R/est-$kind
}

s3_first() {  # the namespace's first warm (A, cold), its file copied for plain vLLM as pdir
  export VLLM_CACHE_ROOT=$V/vroot  # the same for every start but the cold ones
  rm -f $R/not-run.txt; echo "deadline in $(s3_left) s" | tee $R/deadline.txt
  s3_warm cold-warm 0-fc-warm-a-cold -- "${BASE[@]}" "${A[@]}" || return 1
  local f; f=$(find $V/store -path '*/vllm/*' -name autotune_configs.json | head -1)
  [ -n "$f" ] || { echo "no file from the cold warm"; return 1; }
  rm -rf $V/pdir && cp -r "${f%%/vllm/*}/vllm" $V/pdir  # plain vLLM's copy: the same file, unchanged
  echo "namespace file: $f" | tee $R/3m-files.txt
}

s3_start() {  # s3_start KIND ROUND: one start of KIND in that round (step 3m and 3i alike)
  local r=$2 w=
  # round 1 only, every kind alike: nvidia-smi twice a second costs the start it watches
  [ "$r" = 1 ] && { gpu_watch $R/r$r-$1-gpu.txt & w=$!; }
  case $1 in
    same-file) s3_plain same-file r$r-same-file VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=$V/pdir -- "${BASE[@]}" "${A[@]}" ;;
    seeded) s3_warm seeded r$r-seeded -- "${BASE[@]}" --max-model-len "${S3_SEEDED[r-1]}" ;;
    noseed) s3_plain noseed r$r-noseed VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR=$V/pdir -- "${BASE[@]}" --max-model-len "${S3_N[r-1]}" ;;
    cold) s3_plain cold r$r-cold VLLM_CACHE_ROOT=$V/cold$r -- "${BASE[@]}" "${A[@]}" ;;
  esac
  [ -n "$w" ] && { kill $w 2>/dev/null; wait $w 2>/dev/null; }
  return 0
}

s3_end() {  # the files as they ended, and the medians
  find $V/pdir $V/store -name 'autotune_configs.json' -printf '%p %s\n' >> $R/3m-files.txt 2>/dev/null
  cp -r $V/pdir $R/pdir-final 2>/dev/null
  $PY $V/bench/vserve.py stats $R > $R/step3m.md; cat $R/step3m.md
}

step3m() {
  S3_SEEDED=("${S3_L[@]}"); s3_first || return 1
  local r k
  for r in 1 2 3; do for k in same-file seeded; do s3_start $k $r; done; done
  for r in 1 2 3; do for k in noseed cold; do s3_start $k $r; done; done
  s3_end
}

# Step 3i: the four kinds interleaved, round by round (same-file, seeded, no seeding, cold), so
# the session's drift falls on all alike; 3 rounds as the deadline allows. The seeded warm now
# starts vLLM at once and places the seed while vLLM loads (lifecycle/seeding.py): its
# `seed_placed_s` against FlashInfer's `loaded` moment says whether the seed was in time;
# `r1-KIND-gpu.txt` samples the GPU's compute processes and fi-cache's prediction children (does
# the prediction, running beside vLLM, hold any GPU memory?), in round 1 for every kind alike.
S3I_L=(576 608 672)  # seeded: new lengths, each a new hash (no seeding: S3_N, as in 3m)

gpu_watch() {  # gpu_watch FILE: every 0.5 s until killed
  while :; do
    echo "$(date +%s.%N) apps=[$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>&1 | tr '\n' ';')] predict=[$(pgrep -f predict_child.py | tr '\n' ' ')]"
    sleep 0.5
  done > "$1"
}

step3i() {
  S3_SEEDED=("${S3I_L[@]}"); s3_first || return 1
  local r k
  for r in 1 2 3; do for k in same-file seeded noseed cold; do s3_start $k $r; done; done
  s3_end
}

_steps() {
  # out of the checkout: `python -m fi_cache` puts the working dir first on sys.path, and the
  # checkout's fi_cache is not the snapshot's ($V/fi-cache, FI_CACHE_SRC)
  cd $V || return 1
  mkdir -p $R && venv
  step "setup: model, environment"
  $PY $V/bench/tiny_model.py $MODEL
  versions > $R/versions.txt 2>&1
  fc --format json env > $R/env.json 2> $R/env.err
  for s in $1; do "step$s"; $PY $V/bench/vserve.py summary $R > $R/summary.md; touch $V/STEP$s; done
  cp -r $V/plain $R/plain-final 2>/dev/null; cp -r $V/store $R/store 2>/dev/null
  cp $V/build_time.txt $V/build.json $R/ 2>/dev/null
  cat $R/summary.md
  step "steps done"; touch $V/DONE
}

poll() {
  local end=$(( $(date +%s) + ${1:-240} ))
  while [ "$(date +%s)" -lt $end ] && [ ! -f $V/DONE ]; do sleep 5; done
  date +%T; echo "load $(cat /proc/loadavg)"; ls $V | tr '\n' ' '; echo
  echo "build: $(grep -c '^\[' $V/build.log 2>/dev/null) lines; $(cat $V/build_time.txt 2>/dev/null)"
  grep -m3 -A3 " error" $V/build.log 2>/dev/null | cut -c1-300
  tail -30 $V/pipeline.log 2>/dev/null | cut -c1-300
}

collect() {  # one .tgz, under the 16 MiB a returned file may have
  mkdir -p "$1"
  cp $V/pipeline.log $V/build.log "$R/" 2>/dev/null
  tar czf "$1/v22-results.tgz" -C $V results
  local size; size=$(stat -c %s "$1/v22-results.tgz")
  if [ "$size" -gt 16000000 ]; then  # keep logs and JSON, drop the bulkiest copies
    tar czf "$1/v22-results.tgz" -C $V --exclude='results/plain-after-*' results
  fi
  ls -l "$1"; cat $R/summary.md 2>/dev/null
}

"$@"
