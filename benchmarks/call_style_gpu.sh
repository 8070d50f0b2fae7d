#!/usr/bin/env bash
# Does a plan's call style reach FlashInfer's keys on a real GPU? Tunes bmm_fp8 once with 0-d
# scales (FlashInfer's example) and once with a (1,) activation scale (vLLM's dynamic per-tensor
# quantisation) into one namespace, then lists the fp8_gemm keys FlashInfer wrote.
#     bash benchmarks/call_style_gpu.sh 0.6.18      (on the GPU host, OUT set; see bench_tune_gpu.sh)
set -u
V=${1:?FlashInfer version}
SITE=/tmp/site-$V
pip install -q --target "$SITE" --no-index --find-links .cache/device-wheels --no-deps \
  "flashinfer-python==$V" apache-tvm-ffi einops ninja tabulate tqdm nvidia-ml-py click filelock \
  platformdirs 2>&1 | grep -v "as the 'root' user" | tail -3
export PYTHONPATH=$PWD:$SITE FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws-$V
cat > /tmp/styles.toml <<'TOML'
tokens = [16]
[[ops]]
op = "bmm_fp8"
n = 2048
k = 4096
[[ops]]
op = "bmm_fp8"
n = 2048
k = 4096
a_scale_shape = [1]
TOML
s=$(date +%s.%N)
python -m fi_cache --store "$OUT/store" --format json warm --engine flashinfer --plan /tmp/styles.toml \
  > "$OUT/warm.json" 2> "$OUT/warm.err"
echo "warm rc=$? wall=$(python -c "print(round($(date +%s.%N)-$s, 2))")s"
tail -3 "$OUT/warm.err"
FILE=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['namespaces'][0]['file'])" "$OUT/warm.json")
python - "$FILE" > "$OUT/keys.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in sorted(k for k in d if "fp8_gemm" in k):
    print(k, d[k])
PY
wc -l < "$OUT/keys.txt"; grep -c "(1,), ()" "$OUT/keys.txt"; grep -c "(), ()" "$OUT/keys.txt"
cp "$FILE" "$OUT/autotune_configs.json"; rm -rf "$OUT/store"
