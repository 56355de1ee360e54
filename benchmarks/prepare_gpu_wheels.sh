#!/usr/bin/env bash
# Build the ejk wheels and fetch the pure-Python dependencies the offline GPU host lacks into .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
for d in core plugins/ejk_xla plugins/ejk_pallas plugins/ejk_triton plugins/ejk_cute; do
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "./$d"
done
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "platformdirs>=4,<5"
# ejk-triton launches through jax-triton 0.3.1 (the release that pairs with the host's triton 3.6);
# absl-py is its one pure-Python dependency the host may lack.
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "jax-triton==0.3.1" "absl-py>=1.4"
# Test-only dependencies of the GPU test run (tools/gpu_tests.sh): per-test time limits, parallel workers,
# and pydantic (one config-cache case), for the host's Python 3.12.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "pytest-timeout>=2.3,<3" "pytest-xdist>=3.5,<4" "execnet>=2.1,<3" "pydantic>=2,<3" pydantic-core annotated-types \
  typing-inspection
# examples/llm (issue 35): optax and its pure-Python dependencies (the host has jax, numpy, typing_extensions).
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "optax>=0.2.8,<0.3" "chex>=0.1.90" "toolz>=1" "etils>=1.7"
ls -la .whl
# matplotlib for the PNG plots of `ejk bench` (ejk-core[plot]), for the host's Python 3.12, without numpy
# (the host has its own). Kept apart in .whl-plot/ (about 24 MB): gpu_session.sh installs it when present.
rm -rf .whl-plot && mkdir -p .whl-plot
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl-plot \
  "matplotlib>=3.7" contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six
ls -la .whl-plot
