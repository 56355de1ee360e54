#!/usr/bin/env bash
# Pack a Triton for fla's lines on the GPU host, small enough for one device call (64 MiB at most).
#
# fla 0.6.0 refuses its gated chunk backward (gated delta rule, GLA, simple GLA) on Hopper with Triton >= 3.4
# and < 3.7.1 (fla issue #640); the host has Triton 3.6, which ejk-triton's jax-triton 0.3.1 needs. This
# fetches the Triton wheel for the host's Python, drops what fla's kernels do not use (the profiler and its
# CUPTI libraries, the Blackwell ptxas, instrumentation, FileCheck), strips libtriton and writes
# .fla-triton/triton.tar.xz (about 48 MiB for 3.7.1).
#
# Usage (here):  bash benchmarks/pack_triton_for_fla.sh [VERSION (3.7.1)] [PYTHON (312)]
# On the host:   FLA_SHAPES="gla:32768x4096x32x128;ssd:32768x32768x32x128" bash benchmarks/gpu_session.sh fla
#                (carry .whl, .basel with fla's wheels, and .fla-triton). By hand: unpack it to a folder put
#                first in PYTHONPATH, give Triton a cache folder of its own (TRITON_CACHE_DIR), and run
#                `ejk bench ... --impl none --baseline fla`: fla's lines only, ejk's in another process.
set -euo pipefail
version=${1:-3.7.1}
python=${2:-312}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
    --platform manylinux_2_27_x86_64 -d "$work" "triton==$version"
mkdir "$work/tree"
python3 -m zipfile -e "$work"/triton-*.whl "$work/tree"
cd "$work/tree"
rm -rf triton/backends/nvidia/lib/cupti triton/_C/libproton.so triton/backends/nvidia/bin/ptxas-blackwell \
    triton/instrumentation triton/FileCheck
strip --strip-unneeded triton/_C/libtriton.so
chmod +x triton/backends/nvidia/bin/*
mkdir -p "$root/.fla-triton"
tar cf - triton triton-*.dist-info | xz -9 -T0 > "$root/.fla-triton/triton.tar.xz"
ls -l "$root/.fla-triton/triton.tar.xz"
