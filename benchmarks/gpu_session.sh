#!/usr/bin/env bash
# One GPU-host session: install the ejk wheels carried in .whl/ (no registry there), then run the
# GPU tests, the XLA plugin's suite on the GPU, and the GPU benchmarks. Results go to $OUT.
# Prepare here first:  bash benchmarks/prepare_gpu_wheels.sh
set -uo pipefail
OUT=${OUT:-/tmp/ejk-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
if compgen -G ".whl-plot/*.whl" >/dev/null; then  # matplotlib for the plots of `ejk bench` (optional)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-plot/*.whl
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 EJK_CACHE_DIR=/tmp/ejk-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import jax, ejk; print('jax', jax.__version__, 'ejk', ejk.__version__, jax.devices())" | tee -a "$OUT/device.txt"
python3 -m ejk.cli plugins | tee "$OUT/plugins.txt"
stage=${1:-all}  # all | tests | bench | core | attention | moe | triton | triton-mm | triton-overhead | paged | paged-probe | pallas | pallas-ops | pallas-mosaic | pallas-mosaic-bwd | pallas-gmm | cute | ring | timeline (several: run once per stage)
# bench: `ejk bench` with its default presets (the committed results, benchmarks/results/bench_h100/);
# attention / moe (not in all): `ejk bench` on those presets with every implementation's best config too.
# paged (not in all; triton runs its GPU tests too): the Triton paged attention's GPU tests and decode benchmark.
if [[ $stage == all || $stage == tests ]]; then
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
  timeout 300 python3 -m pytest -q -x -p no:cacheprovider plugins/ejk_xla/tests/test_flash_attention.py \
    plugins/ejk_xla/tests/test_ops.py 2>&1 | tee "$OUT/xla_suite_on_gpu.log" | tail -8
fi
if [[ $stage == all || $stage == bench ]]; then
  timeout 540 python3 -m ejk.cli bench --out "$OUT/bench_h100" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
if [[ $stage == all || $stage == core ]]; then
  timeout 120 python3 benchmarks/bench_core.py --out "$OUT/core_gpu.md" 2>&1 | tail -20
fi
if [[ $stage == attention ]]; then
  timeout 590 python3 -m ejk.cli bench attention --best-config --out "$OUT/bench_attention" 2>&1 \
    | tee "$OUT/bench_attention.log" | tail -40
fi
if [[ $stage == moe ]]; then
  timeout 590 python3 -m ejk.cli bench decode moe --best-config --out "$OUT/bench_moe_decode" 2>&1 \
    | tee "$OUT/bench_moe_decode.log" | tail -40
fi
if [[ $stage == all || $stage == triton ]]; then
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/ejk_triton/tests 2>&1 \
    | tee "$OUT/triton_gpu_tests.log" | tail -15
  timeout 590 python3 benchmarks/bench_triton_attention.py 2>&1 | tee "$OUT/bench_triton_attention.log" | tail -30
fi
if [[ $stage == all || $stage == triton-mm ]]; then
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/ejk_triton/tests/test_matmul.py \
    plugins/ejk_triton/tests/test_grouped_matmul.py 2>&1 | tee "$OUT/triton_mm_gpu_tests.log" | tail -15
  timeout 590 python3 benchmarks/bench_triton_moe.py 2>&1 | tee "$OUT/bench_triton_moe.log" | tail -30
fi
if [[ $stage == triton-overhead ]]; then  # a jitted ejk.matmul(platform="triton") against a bare triton_call (about 1 minute)
  timeout 240 python3 benchmarks/bench_triton_overhead.py 2>&1 | tee "$OUT/bench_triton_overhead.log" | grep -E '^\||rror'
fi
if [[ $stage == paged ]]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/ejk_triton/tests/test_paged_attention.py 2>&1 \
    | tee "$OUT/triton_paged_gpu_tests.log" | tail -15
  timeout 590 python3 benchmarks/bench_triton_paged.py 2>&1 | tee "$OUT/bench_triton_paged.log" | tail -30
fi
if [[ $stage == paged-probe ]]; then  # paged decode, ejk-triton against ejk-pallas: per call and per execution, heuristics, ncu (about 4 minutes)
  (cd benchmarks && timeout 150 python3 probe_dispatch.py 8,2048 8,8192 2>&1 | grep -E '^B=|Error' | tee "$OUT/paged_dispatch.txt")
  for platform in triton pallas; do
    (cd benchmarks && timeout 150 python3 probe_paged_configs.py 8,2048 16,2048 8,8192 4,8192 32,2048 64,1024 \
      --platform $platform --no-extras --keys 64 --splits 4 --stages 3 --top 2 2>&1 | grep -E '^ |^[a-z]+ B=' \
      | tee "$OUT/paged_probe_$platform.txt")
    (cd benchmarks && timeout 90 ncu --clock-control none -k regex:paged --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight python3 probe_paged_configs.py 8,2048 --platform $platform --profile heuristic \
      > "$OUT/paged_ncu_$platform.txt" 2>&1; grep -E 'profiled|Duration|DRAM Throughput' "$OUT/paged_ncu_$platform.txt")
  done
fi
if [[ $stage == timeline ]]; then  # GPU timelines of back-to-back grouped matmuls and matmuls, device vs wall time (about 1 minute)
  (cd benchmarks && timeout 200 python3 probe_timeline.py grouped-equal grouped-skewed grouped-pallas-skewed matmul einsum \
    2>&1 | tee "$OUT/timeline.txt" | grep -E '^==|per call|rror')
fi
if [[ $stage == pallas-ops ]]; then  # ejk-pallas's paged attention, matmuls (both kernels), grouped matmul: GPU tests, benchmark
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/ejk_pallas/tests/test_ops.py \
    plugins/ejk_pallas/tests/test_matmul_mgpu.py 2>&1 | tee "$OUT/pallas_ops_gpu_tests.log" | tail -15
  timeout 210 python3 benchmarks/bench_pallas_ops.py 2>&1 | tee "$OUT/bench_pallas_ops.log" | tail -40
fi
if [[ $stage == all || $stage == pallas ]]; then
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider plugins/ejk_pallas/tests 2>&1 \
    | tee "$OUT/pallas_gpu_tests.log" | tail -15
  timeout 590 python3 benchmarks/bench_pallas_attention.py --impl triton_lowered 2>&1 \
    | tee "$OUT/bench_pallas_attention.log" | tail -30
fi
if [[ $stage == pallas-mosaic ]]; then  # ejk-pallas's Mosaic GPU flash attention forward (Hopper), about 5 minutes
  timeout 170 python3 -m pytest -q -x -p no:cacheprovider plugins/ejk_pallas/tests/test_flash_attention_mgpu.py \
    -k "not for_cuda" 2>&1 | tee "$OUT/pallas_mosaic_gpu_tests.log" | tail -20
  EJK_BENCH_TRACEBACK=1 timeout 130 python3 benchmarks/bench_pallas_attention.py --impl mosaic --d64 --mode fwd \
    --out "$OUT/pallas_mosaic_fwd.md" 2>&1 | tee "$OUT/bench_pallas_mosaic_fwd.log" | grep -E '^\||diff|rror' | tail -30
  EJK_BENCH_TRACEBACK=1 timeout 100 python3 benchmarks/bench_pallas_attention.py --impl mosaic --mode fwd+bwd \
    --no-mha --out "$OUT/pallas_mosaic_fwdbwd.md" 2>&1 | tee "$OUT/bench_pallas_mosaic_fwdbwd.log" \
    | grep -E '^\||rror' | tail -20
fi
if [[ $stage == pallas-gmm ]]; then  # the Mosaic GPU grouped matmul (Hopper): its GPU tests, then grouped_matmul timed (both kernels)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu plugins/ejk_pallas/tests/test_grouped_matmul_mgpu.py \
    2>&1 | tee "$OUT/pallas_gmm_gpu_tests.log" | tail -20
  EJK_BENCH_TRACEBACK=1 timeout 240 python3 benchmarks/bench_pallas_ops.py --sections grouped --configs 6 \
    --out "$OUT/pallas_gmm.md" 2>&1 | tee "$OUT/bench_pallas_gmm.log" | grep -E '^\||rror' | tail -30
fi
if [[ $stage == pallas-mosaic-bwd ]]; then  # the Mosaic GPU backward (Hopper): its 14 GPU tests (4 minutes), then both backwards timed (2)
  timeout 330 python3 -m pytest -q -p no:cacheprovider plugins/ejk_pallas/tests/test_flash_attention_mgpu.py \
    -k "gpu_mosaic_backward" 2>&1 | tee "$OUT/pallas_mosaic_bwd_gpu_tests.log" | tail -20
  EJK_BENCH_TRACEBACK=1 timeout 110 python3 benchmarks/bench_pallas_attention.py --impl mosaic --mode fwd+bwd \
    --mosaic-backward both --no-mha --no-attention-mgpu --out "$OUT/pallas_mosaic_bwd.md" 2>&1 \
    | tee "$OUT/bench_pallas_mosaic_bwd.log" | grep -E '^\||diff|rror' | tail -20
fi
if [[ $stage == pallas-mosaic-sweep ]]; then  # every Mosaic GPU config, forward (best and heuristic named)
  EJK_BENCH_TRACEBACK=1 timeout 590 python3 benchmarks/bench_pallas_attention.py --impl mosaic --d64 --mode fwd \
    --mosaic-configs all --no-mha --no-attention-mgpu --out "$OUT/pallas_mosaic_sweep.md" 2>&1 \
    | tee "$OUT/bench_pallas_mosaic_sweep.log" | grep -E '^\||rror' | tail -30
fi
if [[ $stage == cute ]]; then  # ejk-cute on Hopper (CuTe DSL installed first: ../shared/gpu/README.md), about 9 minutes
  export PYTHONPATH=$HOME/cute-site/nvidia_cutlass_dsl/dsl_packages:$HOME/cute-site:$PYTHONPATH
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  # One process per test with its own limit: a hang (pipeline / barrier deadlock) or a slow compile is named.
  bash benchmarks/gpu_tests_one_by_one.sh "$OUT/cute_gpu_tests.md" 90 330 plugins/ejk_cute/tests
  timeout 60 python3 benchmarks/bench_cute_matmul.py 2>&1 | tee "$OUT/bench_cute_matmul.log" | tail -16
  timeout 60 python3 benchmarks/bench_cute_attention.py --configs heuristic 2>&1 | tee "$OUT/bench_cute_attention.log" | tail -16
  OUT=$OUT timeout 80 python3 benchmarks/bench_cute_grouped.py 2>&1 | tee "$OUT/bench_cute_grouped.log" | tail -20
fi
if [[ $stage == ring ]]; then  # ring attention on 1 vs 2 GPUs (kind nvidia-h200-x2), about 6 minutes
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
  nvidia-smi topo -m 2>&1 | tee "$OUT/topology.txt"
  OUT=$OUT timeout 590 python3 benchmarks/bench_ring_attention.py ${RING_ARGS:-} 2>&1 | tee "$OUT/bench_ring.log" \
    | grep -E '^\||rror' | tail -60
fi
