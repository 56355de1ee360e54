#!/usr/bin/env bash
# Every GPU-marked test of every distribution, in one command, on a machine with an NVIDIA GPU.
#
#   bash tools/gpu_tests.sh [PYTEST_ARGS...]
#
# On the offline GPU host, first install what it lacks: `bash benchmarks/prepare_gpu_wheels.sh` here fills
# .whl/ (ejk's wheels, jax-triton, the test-only plugins pytest-timeout / pytest-xdist and pydantic); this
# script installs .whl/*.whl into $EJK_GPU_SITE when the folder is present. ejk-cute's tests run when the
# CuTe DSL is importable (see ../shared/gpu/README.md) and skip with the reason otherwise.
#
# Each test has its own time limit (EJK_GPU_TEST_TIMEOUT seconds, default 240): a test that hangs or compiles
# for minutes ends the run with its name and every thread's stack. Tests run in EJK_GPU_TEST_WORKERS processes
# (default 4) sharing the GPU: compiles are CPU-bound, so the workers overlap them. EJK_GPU_TEST_PATHS (default: every
# distribution's tests) splits the suite over several device calls when it outgrows one. Reports go to $OUT
# (default /tmp/ejk-gpu-tests): gpu_tests.log, gpu_tests.xml (JUnit) and the slowest tests' durations.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ejk-gpu-tests}; mkdir -p "$OUT"
site=${EJK_GPU_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
cute_site=$HOME/cute-site
if [[ -d $cute_site ]]; then
  export PYTHONPATH="$cute_site/nvidia_cutlass_dsl/dsl_packages:$cute_site:$PYTHONPATH"
fi
# Several processes share one GPU: none may take most of its memory up front. XLA's own autotuning of its
# GEMM fusions runs candidate kernels on the GPU at every compile; tests check values, not speed: off.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0"
export EJK_CACHE_DIR=${EJK_CACHE_DIR:-$(mktemp -d)}
workers=${EJK_GPU_TEST_WORKERS:-4}
limit=${EJK_GPU_TEST_TIMEOUT:-240}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import jax, ejk; print('jax', jax.__version__, 'ejk', ejk.__version__, jax.devices())"
  python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  python3 -c "import cutlass; print('cutlass-dsl', cutlass.__version__)" 2>&1 | tail -1
} | tee "$OUT/device.txt"
parallel=(); [[ $workers != 0 ]] && parallel=(-n "$workers")
python3 -m pytest -m gpu -p no:cacheprovider -p no:benchmark -v --tb=short -rfEs "${parallel[@]}" \
  --timeout="$limit" --timeout-method=thread --durations=30 --junitxml="$OUT/gpu_tests.xml" \
  ${EJK_GPU_TEST_PATHS:-core/tests tests plugins/ejk_xla/tests plugins/ejk_pallas/tests plugins/ejk_triton/tests \
  plugins/ejk_cute/tests} "$@" 2>&1 | tee "$OUT/gpu_tests.log"
exit "${PIPESTATUS[0]}"
