#!/usr/bin/env bash
# The README's first command: install fi-cache (core only, no torch/GPU) and run it on the example.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
export FI_CACHE_DIR="$PWD/.cache/demo-store"   # keep the demo away from your real store
rm -rf "$FI_CACHE_DIR"
fi=.venv/bin/fi-cache
old=$(ls examples/vllm-cache/flashinfer_autotune_cache/0.6.17/90a/*/autotune_configs.json)

echo "\$ fi-cache ls examples/vllm-cache"
$fi ls examples/vllm-cache
echo
echo "\$ fi-cache verify examples/vllm-cache"
$fi verify examples/vllm-cache
echo
echo "# Would an unfused (deterministic) start on FlashInfer 0.6.17 / vLLM 0.30 survive these caches?"
echo "\$ fi-cache doctor examples/vllm-cache --flashinfer-version 0.6.17 --vllm-version 0.30.0 --finalize unfused"
$fi doctor examples/vllm-cache --flashinfer-version 0.6.17 --vllm-version 0.30.0 --finalize unfused \
  || echo "(doctor exits 1: it found errors, as it should here)"
echo
echo "\$ fi-cache show --op gemm2 <the FlashInfer 0.6.17 cache>   # GEMM2 tactic ids; keys without finalize mode"
$fi show --op gemm2 "$old" | head -n 16
echo
echo "\$ fi-cache env    # this machine, and the namespace each finalize mode gets"
$fi env
echo
echo "# warm and serve, with tests/fake_vllm.py standing in for vLLM (no GPU here; it is NOT vLLM:"
echo "# it writes a real FlashInfer cache file under the dir fi-cache gives it and answers /health)"
rm -rf "$FI_CACHE_DIR"
mkdir -p .cache/demo-bin
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$PWD/.venv/bin/python" "$PWD/tests/fake_vllm.py" > .cache/demo-bin/vllm
chmod +x .cache/demo-bin/vllm
export FI_CACHE_VLLM="$PWD/.cache/demo-bin/vllm"
export FAKE_VLLM_CACHE_SOURCE="$PWD/tests/fixtures/flashinfer/fi-0.6.18-moe-fused.json"
echo "\$ fi-cache warm -- Qwen/Qwen3-30B-A3B                 # fused finalize namespace"
$fi warm -- Qwen/Qwen3-30B-A3B
export FAKE_VLLM_CACHE_SOURCE="$PWD/tests/fixtures/flashinfer/fi-0.6.18-moe-unfused.json"
echo "\$ fi-cache warm --finalize unfused -- Qwen/Qwen3-30B-A3B   # its own namespace: no collision"
$fi warm --finalize unfused -- Qwen/Qwen3-30B-A3B
echo "\$ fi-cache ls"
$fi ls
echo "\$ fi-cache serve --deterministic -- Qwen/Qwen3-30B-A3B   # warm already: execs vLLM at once"
FAKE_VLLM_MODE=exit-now $fi serve --deterministic -- Qwen/Qwen3-30B-A3B
echo
echo "# Tuning without vLLM (warm --engine flashinfer needs a GPU; planning does not)"
echo "\$ fi-cache plan --from-hf-config tests/fixtures/hf/qwen3-30b-a3b.json -o .cache/qwen3.toml"
$fi plan --from-hf-config tests/fixtures/hf/qwen3-30b-a3b.json -o .cache/qwen3.toml
cat .cache/qwen3.toml
echo "\$ fi-cache plan --check examples/plans/h200-gemm.toml   # the plan the H200 benchmark tuned"
$fi plan --check examples/plans/h200-gemm.toml
