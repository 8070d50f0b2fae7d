#!/usr/bin/env bash
# The README's first command: install fi-cache (core only, no torch/GPU) and run it on the example.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
export FI_CACHE_DIR="$PWD/.cache/demo-store"   # keep the demo away from your real store
fi=.venv/bin/fi-cache
old=$(ls examples/vllm-cache/flashinfer_autotune_cache/0.6.17/90a/*/autotune_configs.json)

echo "\$ fi-cache ls examples/vllm-cache"
$fi ls examples/vllm-cache
echo
echo "\$ fi-cache verify examples/vllm-cache"
$fi verify examples/vllm-cache
echo
echo "\$ fi-cache show --op gemm2 <the FlashInfer 0.6.17 cache>   # GEMM2 tactic ids; keys without finalize mode"
$fi show --op gemm2 "$old" | head -n 16
echo
echo "\$ fi-cache env    # this machine, and the namespace each finalize mode gets"
$fi env
