#!/usr/bin/env bash
# One GPU-host session (run from the repository root on the GPU host, inside one device call):
# install the wheels carried in .whl/ (the host has no registry), then run one or more stages.
# Prepare here first:  bash benchmarks/prepare_gpu_wheels.sh   (CuTe DSL: ../shared/gpu/README.md)
#
#   bash benchmarks/gpu_session.sh STAGE...
#
# Stages:
#   tests      every GPU-marked test of every distribution (tools/gpu_tests.sh: per-test limits, one call)
#   bench      `ejk bench` with its default presets (attention, decode, moe, matmul), device timeline
#   PRESET     any other name: that preset of `ejk bench` (attention, decode, mla, moe, matmul, gdr, lce, ...),
#              with every implementation's best config too (gdr, gla, ssd: fla's lines when its wheels are in
#              .basel/)
#   torch      the fused linear cross-entropy baselines on torch (Liger, Cut Cross-Entropy:
#              benchmarks/torch_baselines.py)
# Baseline wheels users compare with (flash-linear-attention + fla-core + einops, liger-kernel, cut-cross-entropy)
# travel in .basel/ when present, installed without dependencies (the host has torch and triton).
#   ring       ring attention on 1 vs 2 GPUs (a 2-GPU kind; NVLink multicast off)
#   training   issue 30's attention shapes, fwd and fwd+bwd, every forward paired with every backward, torch SDPA
#              baselines where torch imports; writes the measured rankings (fwd and fwd+bwd) as a config pack
#              ($OUT/bench_training/rankings_pack.json) to merge into core/src/ejk/config/shipped_packs/
#   overhead   eager overhead of every op's public call over jax.jit of the same call (tiny shapes)
#   eager      that overhead split: ejk's Python alone, the remembered jitted function called directly
#              (benchmarks/bench_eager_split.py)
#   fla        fla's lines alone (gated delta rule, GLA, SSD; FLA_MODE, default fwd+bwd; FLA_SHAPES, default the
#              presets), in a process of their own on the Triton that benchmarks/pack_triton_for_fla.sh packed
#              into .fla-triton/ (fla's backward needs Triton >= 3.7.1 on Hopper; ejk's lines keep the host's).
#              fla autotunes each new shape for about 140 s: name two or three shapes per call.
# Results go to $OUT. EJK_BENCH_CLOCK (default device) is the clock of the `bench` and preset stages: `busy` for
# calls shorter than a jitted call's dispatch (decode-shaped matmuls, small norms), see docs/benchmarking.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ejk-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
if compgen -G ".whl-plot/*.whl" >/dev/null; then  # matplotlib for the plots of `ejk bench` (optional)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-plot/*.whl
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 EJK_CACHE_DIR=/tmp/ejk-cache
if compgen -G ".basel/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/basel .basel/*.whl && \
    export PYTHONPATH=$PYTHONPATH:/tmp/basel
fi
if [[ -d $HOME/cute-site ]]; then
  export PYTHONPATH=$HOME/cute-site/nvidia_cutlass_dsl/dsl_packages:$HOME/cute-site:$PYTHONPATH
fi
python3 -m ejk.cli plugins > "$OUT/plugins.txt" 2>&1
status=0
clock=${EJK_BENCH_CLOCK:-device}
for stage in "${@:-tests}"; do
  case $stage in
    tests) OUT=$OUT bash tools/gpu_tests.sh || status=1 ;;
    bench) timeout 560 python3 -m ejk.cli bench --clock "$clock" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -40 ;;
    torch)
      timeout 560 python3 benchmarks/torch_baselines.py --out "$OUT/torch_baselines.jsonl" \
        2>&1 | tee "$OUT/torch_baselines.log" | tail -40 ;;
    ring)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
      nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
      OUT=$OUT timeout 560 python3 benchmarks/bench_ring_attention.py ${RING_ARGS:-} 2>&1 | tee "$OUT/bench_ring.log" \
        | grep -E '^\||rror' | tail -60 ;;
    training)
      shapes="attention:4x4096x16x128;attention:4x4096x16x128:causal;attention:2x8192x16x128"
      shapes+=";attention:2x8192x16x128:causal;attention:4x4096x32x64:causal;attention:4x4096x32x128:causal,kv=8"
      shapes+=";attention:1x16384x16x128:causal;attention:4x4096x16x256:causal"
      timeout 560 python3 -m ejk.cli bench --shapes "$shapes" --mode all --backward pallas --backward triton \
        --backward cute --clock device --out "$OUT/bench_training" \
        --write-pack "$OUT/bench_training/rankings_pack.json" 2>&1 | tee "$OUT/bench_training.log" | tail -60 ;;
    overhead)
      timeout 560 python3 -m ejk.cli bench --overhead --impl auto --mode fwd --shapes \
        "attention:1x128x4x64:causal;matmul:16x64x64;moe:4x64x64x256;decode:2x256" --out "$OUT/bench_overhead" \
        2>&1 | tee "$OUT/bench_overhead.log" | tail -40 ;;
    eager)
      OUT=$OUT timeout 560 python3 benchmarks/bench_eager_split.py 2>&1 | tee "$OUT/eager_split.log" | tail -20 ;;
    fla)
      (
        if [[ -f .fla-triton/triton.tar.xz ]]; then
          mkdir -p /tmp/fla-triton && tar xJf .fla-triton/triton.tar.xz -C /tmp/fla-triton
          export PYTHONPATH=/tmp/fla-triton:$PYTHONPATH TRITON_CACHE_DIR=/tmp/fla-triton-cache
        fi
        timeout 560 python3 -m ejk.cli bench gdr gla ssd ${FLA_SHAPES:+--shapes "$FLA_SHAPES"} \
          --mode "${FLA_MODE:-fwd+bwd}" --impl none --baseline fla --clock device --out "$OUT/bench_fla" 2>&1 \
          | tee "$OUT/bench_fla.log" | tail -40
      ) ;;
    *)
      timeout 560 python3 -m ejk.cli bench "$stage" --best-config --clock "$clock" --out "$OUT/bench_$stage" 2>&1 \
        | tee "$OUT/bench_$stage.log" | tail -40 ;;
  esac
done
exit $status
