#!/usr/bin/env bash
# The README's first command: install fi-cache (core only, no torch/GPU) and run it on the example,
# then warm and serve on a stand-in H200 host. FI_CACHE_DEMO_PYTHON=PY runs it with PY (fi-cache
# importable there) instead of installing into .venv; FI_CACHE_DEMO_WORK=DIR keeps its scratch there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${FI_CACHE_DEMO_PYTHON:-}
if [ -z "$py" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  echo "demo.sh: installing fi-cache (click, platformdirs) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
  py=$root/.venv/bin/python
fi
work=${FI_CACHE_DEMO_WORK:-$root/.cache/demo}
rm -rf "$work" && mkdir -p "$work"
# Keep the demo away from your real store and caches (doctor and ls look at vLLM's and FlashInfer's).
export FI_CACHE_DIR="$work/store" VLLM_CACHE_ROOT="$work/vllm-root"
export FLASHINFER_AUTOTUNE_CACHE_DIR="$work/flashinfer-root"
unset VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR VLLM_FLASHINFER_MOE_FUSED_FINALIZE FI_CACHE_VLLM FI_CACHE_PYTHON
fic() { "$py" -m fi_cache "$@"; }
old=$(ls examples/vllm-cache/flashinfer_autotune_cache/0.6.17/90a/*/autotune_configs.json)

echo "\$ fi-cache ls examples/vllm-cache"
fic ls examples/vllm-cache
echo
echo "\$ fi-cache verify examples/vllm-cache"
fic verify examples/vllm-cache
echo
echo "# Would an unfused (deterministic) start on FlashInfer 0.6.17 / vLLM 0.30 survive these caches?"
echo "\$ fi-cache doctor examples/vllm-cache --flashinfer-version 0.6.17 --vllm-version 0.30.0 --finalize unfused"
fic doctor examples/vllm-cache --flashinfer-version 0.6.17 --vllm-version 0.30.0 --finalize unfused \
  || echo "(doctor exits 1: it found errors, as it should here)"
echo
echo "\$ fi-cache show --op gemm2 <the FlashInfer 0.6.17 cache>   # GEMM2 tactic ids; keys without finalize mode"
fic show --op gemm2 "$old" | head -n 16
echo

echo "# warm and serve on a stand-in H200 host with FlashInfer 0.6.17, where fused and unfused caches"
echo "# have the SAME keys (no finalize mode in them) and plain vLLM shares one file between them."
echo "# No GPU here, so it is all stand-ins, and they are NOT the real thing:"
echo "#  - nvidia-smi prints an H200; FlashInfer 0.6.17 and a vLLM with PR #54948 (it reads"
echo "#    VLLM_FLASHINFER_MOE_FUSED_FINALIZE) are package records only (dist-info, vllm/envs.py);"
echo "#    FlashInfer's own environment answer is the one it gave on the H200 (cached in the store);"
echo "#  - tests/fake_vllm.py stands in for vllm serve: it answers /health and writes, where fi-cache"
echo "#    points vLLM's cache dir, a real FlashInfer 0.6.17 file tuned on an H200 for the finalize"
echo "#    mode it is started with (tests/fixtures/h200-moe-run/0.6.17: fused, then unfused)."
host=$work/host
mkdir -p "$host/bin" "$host/site/vllm" "$host/site/flashinfer_python-0.6.17.dist-info" \
  "$host/site/vllm-0.30.0+pr54948.dist-info"
printf '#!/bin/sh\necho "0, GPU-00000000-demo, NVIDIA H200, 9.0"\n' > "$host/bin/nvidia-smi"
printf 'Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.17\n' \
  > "$host/site/flashinfer_python-0.6.17.dist-info/METADATA"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0+pr54948\n' \
  > "$host/site/vllm-0.30.0+pr54948.dist-info/METADATA"
echo '# stand-in: a vLLM with PR #54948 declares VLLM_FLASHINFER_MOE_FUSED_FINALIZE here' \
  > "$host/site/vllm/envs.py"
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$py" "$root/tests/fake_vllm.py" > "$host/bin/vllm"
chmod +x "$host/bin/nvidia-smi" "$host/bin/vllm"
export PATH="$host/bin:$PATH" PYTHONPATH="$host/site${PYTHONPATH:+:$PYTHONPATH}"
export FI_CACHE_VLLM="$host/bin/vllm"
run=$root/tests/fixtures/h200-moe-run/0.6.17
"$py" - "$FI_CACHE_DIR" "$run/fused-namespace.json" <<'PY'
import json, sys
from pathlib import Path
from fi_cache import environment
from fi_cache.store.paths import state_dir
# FlashInfer's _collect_metadata() on that H200, where fi-cache caches the answer for this host.
path = state_dir(Path(sys.argv[1])) / f"env-{environment.probe_key(environment.probe())}.json"
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(json.loads(Path(sys.argv[2]).read_text())["_metadata"]))
PY
echo "\$ fi-cache env    # this (stand-in) machine, and the namespace each finalize mode gets"
fic env
echo
echo "\$ fi-cache warm -- Qwen/Qwen3-30B-A3B                     # fused finalize namespace"
FAKE_VLLM_CACHE_SOURCE="$run/fused-namespace.json" fic warm -- Qwen/Qwen3-30B-A3B
echo "\$ fi-cache warm --finalize unfused -- Qwen/Qwen3-30B-A3B  # its own namespace: no collision"
FAKE_VLLM_CACHE_SOURCE="$run/unfused-namespace.json" fic warm --finalize unfused -- Qwen/Qwen3-30B-A3B
echo "\$ fi-cache ls     # two namespaces, one file each: same keys, each with its own GEMM2 tactics"
fic ls
echo "\$ fi-cache serve --deterministic -- Qwen/Qwen3-30B-A3B   # warm already: execs vLLM at once"
FAKE_VLLM_MODE=exit-now fic serve --deterministic -- Qwen/Qwen3-30B-A3B
echo
ns() { fic --format json env | "$py" -c "import json,sys; print(json.load(sys.stdin)['namespaces']['$1'])"; }
fused=$(ns fused) unfused=$(ns unfused)
stale=$unfused/vllm/$(printf 'another model' | sha256sum | cut -c1-64)
mkdir -p "$stale" && cp "$fused"/vllm/*/autotune_configs.json "$stale/"
echo "# Someone copies a fused-tuned 0.6.17 file (another model's dir) into the unfused namespace:"
echo "\$ cp -r <fused namespace>/vllm/<hash> <unfused namespace>/vllm/"
echo "\$ fi-cache doctor --finalize unfused    # names the copied file, not the one the unfused warm wrote"
fic doctor --finalize unfused || echo "(doctor exits 1: it found the stale file)"
echo "\$ fi-cache serve --deterministic -- Qwen/Qwen3-30B-A3B   # refuses before vLLM could die on it"
FAKE_VLLM_MODE=exit-now fic serve --deterministic -- Qwen/Qwen3-30B-A3B \
  || echo "(serve refused: exit $?)"
echo

echo "# Tuning without vLLM (warm --engine flashinfer needs a GPU; planning does not)"
echo "\$ fi-cache plan --from-hf-config tests/fixtures/hf/qwen3-30b-a3b.json -o <work>/qwen3.toml"
fic plan --from-hf-config tests/fixtures/hf/qwen3-30b-a3b.json -o "$work/qwen3.toml"
cat "$work/qwen3.toml"
echo "\$ fi-cache plan --verify examples/plans/h200-gemm.toml   # the plan the H200 benchmark tuned"
fic plan --verify examples/plans/h200-gemm.toml
