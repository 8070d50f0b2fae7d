#!/usr/bin/env bash
# Compare fi-cache env (cheap probe) with FlashInfer's own _collect_metadata() on a GPU host.
# Needs .cache/device-wheels/ with flashinfer-python and its light deps (no network on the GPU box);
# results and timings are in docs/benchmarks.md. Run from the project root with OUT set to a results dir.
set -u
python -V; pip list 2>/dev/null | grep -iE "^(torch|flashinfer|apache|nvidia-cu|nvidia-cudnn)" 
pip install -q --target /tmp/site --no-index --find-links .cache/device-wheels --no-deps flashinfer-python==0.6.17 apache-tvm-ffi einops ninja tabulate tqdm nvidia-ml-py click filelock platformdirs 2>&1 | tail -3
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader | tee $OUT/nvidia-smi.txt
for i in 1 2 3; do /usr/bin/time -f "cheap %e s %M KB" python -m fi_cache --store $OUT/store --format json env --no-exact > $OUT/env-cheap.json; done 2>&1
/usr/bin/time -f "exact(first) %e s %M KB" python -m fi_cache --store $OUT/store --format json env --exact > $OUT/env-exact.json 2>$OUT/exact.err; cat $OUT/exact.err | tail -3
for i in 1 2 3; do /usr/bin/time -f "default(cached) %e s %M KB" python -m fi_cache --store $OUT/store --format json env > $OUT/env-cached.json; done 2>&1
python -c "import json, flashinfer.autotuner.autotuner as a; print(json.dumps(a._collect_metadata()))" > $OUT/fi-meta.json 2>$OUT/fi-meta.err; tail -2 $OUT/fi-meta.err
python - <<'PY'
import json, os
o=os.environ["OUT"]
cheap=json.load(open(f"{o}/env-cheap.json"))["metadata"]; exact=json.load(open(f"{o}/env-exact.json"))["metadata"]; fi=json.load(open(f"{o}/fi-meta.json"))
print("flashinfer:", fi)
print("cheap:", cheap)
print("exact:", exact)
print("cheap==flashinfer on fields FlashInfer reports:", {k:(cheap.get(k), v) for k,v in fi.items() if cheap.get(k)!=v})
print("arch:", json.load(open(f"{o}/env-cheap.json"))["arch"], json.load(open(f"{o}/env-cheap.json"))["sources"])
PY
python -m fi_cache --store $OUT/store env 2>&1 | tail -12
