#!/usr/bin/env bash
# Build the ejk wheels and fetch the pure-Python dependencies the offline GPU host lacks into .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
for d in core plugins/ejk_xla plugins/ejk_pallas plugins/ejk_triton plugins/ejk_cute; do
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "./$d"
done
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "platformdirs>=4,<5"
ls -la .whl
