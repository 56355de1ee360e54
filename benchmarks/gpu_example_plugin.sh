#!/usr/bin/env bash
# The example third-party plugin on the GPU host, installed apart from the other stages' site (its
# team policy changes which matmul runs for skinny shapes). Prepare here first:
#   bash benchmarks/prepare_gpu_wheels.sh
#   python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl ./examples/ejk-example-plugin
set -uo pipefail
OUT=${OUT:-/tmp/ejk-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-example .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site-example PYTHONUNBUFFERED=1 EJK_CACHE_DIR=/tmp/ejk-cache-example
python3 -m ejk plugins | tee "$OUT/example_plugins.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider examples/ejk-example-plugin/tests 2>&1 \
  | tee "$OUT/example_plugin_tests_gpu.log" | tail -15
timeout 500 python3 benchmarks/bench_example_plugin.py 2>&1 | tee "$OUT/bench_example_plugin.log" | tail -40
