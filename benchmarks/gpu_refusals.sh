#!/usr/bin/env bash
# warm --engine flashinfer refusals and a final end-to-end check on a GPU host (the `device` tool),
# FlashInfer 0.6.18. Run from the project root with OUT set. Results: docs/benchmarks.md.
set -u
SITE=/tmp/site-nofe
pip install -q --target $SITE --no-index --find-links .cache/device-wheels --no-deps \
  flashinfer-python==0.6.18 apache-tvm-ffi einops ninja tabulate tqdm nvidia-ml-py click filelock \
  platformdirs 2>&1 | grep -v "as the 'root' user" | tail -3
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
PLAN=examples/plans/h200-gemm.toml
# 1. without cuDNN's Python frontend: the cudnn backend must be refused before any tuning (exit 2)
s=$(date +%s)
PYTHONPATH=$PWD:$SITE python -m fi_cache --store /tmp/st-nofe warm --engine flashinfer --plan $PLAN \
  > /dev/null 2> $OUT/nofe.err; echo "no-frontend rc=$? after $(( $(date +%s) - s ))s"
grep -c "^\[tune" $OUT/nofe.err | sed 's/^/tuning lines: /'; tail -1 $OUT/nofe.err
ls /tmp/st-nofe/namespaces 2>/dev/null && echo "a namespace was made" || echo "no namespace made"
# 2. with it: the final code end to end, then doctor and verify
pip install -q --target $SITE --no-index --find-links .cache/device-wheels --no-deps \
  nvidia-cudnn-frontend 2>&1 | grep -v "as the 'root' user" | tail -3
s=$(date +%s)
PYTHONPATH=$PWD:$SITE python -m fi_cache --store /tmp/st warm --engine flashinfer --plan $PLAN \
  > $OUT/final.txt 2> $OUT/final.err; echo "final rc=$? after $(( $(date +%s) - s ))s"
cat $OUT/final.txt; grep -v "^\[tune" $OUT/final.err | tail -5
PYTHONPATH=$PWD:$SITE python -m fi_cache --store /tmp/st verify /tmp/st; echo "verify rc=$?"
PYTHONPATH=$PWD:$SITE python -m fi_cache --store /tmp/st doctor | tail -2; echo "doctor rc=$?"
