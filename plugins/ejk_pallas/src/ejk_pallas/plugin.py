"""The ``pallas`` entry point: registers the Pallas implementations with their configs, gates and VJPs.

Imports no Pallas module: kernels import ``jax.experimental.pallas`` when they are first traced.
"""

from __future__ import annotations

from ejk.plugin import VJP, Platform, PlatformStatus, RegisterKernels, Tier, hookimpl
from ejk_pallas import (
    _env,
    _flash_attention,
    _flash_attention_mgpu,
    _flash_attention_tpu,
    _grouped_matmul,
    _grouped_matmul_mgpu,
    _matmul,
    _matmul_mgpu,
    _matmul_tpu,
    _mla_attention_mgpu,
    _paged_attention,
    _paged_attention_tpu,
    _varlen_attention_mgpu,
)

# The GPU kernels are in the FAST tier, the Mosaic TPU ones UNTESTED (never run on TPU hardware: ``platform="auto"``
# keeps ejk-xla there; ``platform="pallas"`` or autotuning reaches them). The priorities below are tie-breaks inside
# the FAST tier where no ranking pack covers the device; measured orders are the rankings of ejk-core's packs
# (docs/RANKINGS.md).

#: flash_attention, Triton-lowered: after ejk-triton's kernel.
PRIORITY = 3
#: flash_attention, Mosaic GPU (Hopper only): first among the attention kernels.
MOSAIC_GPU_PRIORITY = 9
#: grouped_matmul, Triton-lowered: last among the grouped kernels.
OPS_PRIORITY = 3
#: grouped_matmul, Mosaic GPU (Hopper only): after ejk-triton's and ejk-cute's kernels.
MOSAIC_GMM_PRIORITY = 4
#: ragged_paged_attention, Triton-lowered: before ejk-triton's kernel.
PAGED_PRIORITY = 6
#: matmul, Triton-lowered: last among the GEMM kernels.
MATMUL_PRIORITY = -6
#: matmul, Mosaic GPU (Hopper only): first among the GEMM kernels.
MOSAIC_MATMUL_PRIORITY = -4
#: mla_paged_attention, Mosaic GPU (Hopper only): after ejk-triton's kernel by priority; the H100 pack ranks it first
#: from 64 query rows a sequence (benchmarks/results/mla_decode_h100.md).
MOSAIC_MLA_PRIORITY = 2


#: The flash backwards take the lse cotangent too: ejk.flash_attention_lse comes with them.
LSE = ("lse",)


@hookimpl
def ejk_register_kernels(register: RegisterKernels) -> None:
    fa = _flash_attention
    vjp = VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS, extra_cotangents=LSE)
    for backend in _env.backends():
        register("flash_attention", Platform.PALLAS, backend, priority=PRIORITY, name="triton_lowered",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
    mg = _flash_attention_mgpu
    mg_vjp = VJP(fwd=mg.forward_with_residuals, bwd=mg.backward, residuals=mg.RESIDUALS, extra_cotangents=LSE)
    for backend in _env.backends():
        register("flash_attention", Platform.PALLAS, backend, priority=MOSAIC_GPU_PRIORITY, name="mosaic",
                 cfg_type=mg.MosaicFlashAttentionConfig, config_space=mg.config_space,
                 heuristic=mg.heuristic_config, capability=mg.dense_capability, vjp=mg_vjp)(mg.forward)
        # Segment ids and packed sequences (segments with per-row offsets) on the same kernels, registered apart
        # so that rankings order segment-id calls on their own measurements.
        register("flash_attention", Platform.PALLAS, backend, name="mosaic_segments",
                 cfg_type=mg.MosaicFlashAttentionConfig, config_space=mg.config_space,
                 heuristic=mg.segments_heuristic_config, capability=mg.segments_capability, vjp=mg_vjp)(mg.forward)
        va = _varlen_attention_mgpu
        register("flash_attention_varlen", Platform.PALLAS, backend, name="mosaic",
                 cfg_type=mg.MosaicFlashAttentionConfig, config_space=va.config_space,
                 heuristic=va.heuristic_config, capability=va.capability)(va.flash_attention_varlen)
    tpu = _flash_attention_tpu
    tpu_vjp = VJP(fwd=tpu.forward_with_residuals, bwd=tpu.backward, residuals=tpu.RESIDUALS, extra_cotangents=LSE)
    for backend in _tpu_backends():
        register("flash_attention", Platform.PALLAS, backend, tier=Tier.UNTESTED, name="mosaic_tpu",
                 cfg_type=tpu.TpuFlashAttentionConfig, config_space=tpu.config_space, heuristic=tpu.heuristic_config,
                 capability=tpu.capability, vjp=tpu_vjp)(tpu.forward)
    _register_ops(register)


def _tpu_backends() -> tuple[str, ...]:
    """Where the Mosaic TPU kernels are registered: the TPU, and the CPU in interpret mode."""
    return ("tpu", "cpu") if _env.interpret_mode() else ("tpu",)


def _register_ops(register: RegisterKernels) -> None:
    """ragged_paged_attention (not differentiable), matmul and grouped_matmul (custom VJPs), GPU and TPU."""
    pa, mm, gmm, mgmm = _paged_attention, _matmul, _grouped_matmul, _grouped_matmul_mgpu
    for backend in _env.backends():
        register("ragged_paged_attention", Platform.PALLAS, backend, priority=PAGED_PRIORITY,
                 name="triton_lowered", cfg_type=pa.PagedAttentionConfig, config_space=pa.config_space,
                 heuristic=pa.heuristic_config, capability=pa.capability)(pa.ragged_paged_attention)
        register("matmul", Platform.PALLAS, backend, priority=MATMUL_PRIORITY, name="triton_lowered",
                 cfg_type=mm.MatmulConfig, config_space=mm.config_space, heuristic=mm.heuristic_config,
                 capability=mm.capability, vjp=mm.vjp)(mm.forward)
        mmm = _matmul_mgpu
        register("matmul", Platform.PALLAS, backend, priority=MOSAIC_MATMUL_PRIORITY, name="mosaic",
                 cfg_type=mmm.MosaicMatmulConfig, config_space=mmm.config_space, heuristic=mmm.heuristic_config,
                 capability=mmm.capability, vjp=mmm.vjp)(mmm.forward)
        register("grouped_matmul", Platform.PALLAS, backend, priority=OPS_PRIORITY, name="triton_lowered",
                 cfg_type=gmm.GroupedMatmulConfig, config_space=gmm.config_space, heuristic=gmm.heuristic_config,
                 capability=gmm.capability, vjp=gmm.vjp)(gmm.forward)
        mla = _mla_attention_mgpu
        register("mla_paged_attention", Platform.PALLAS, backend, priority=MOSAIC_MLA_PRIORITY, name="mosaic",
                 cfg_type=mla.MosaicMlaConfig, config_space=mla.config_space, heuristic=mla.heuristic_config,
                 capability=mla.capability)(mla.mla_paged_attention)
        register("grouped_matmul", Platform.PALLAS, backend, priority=MOSAIC_GMM_PRIORITY, name="mosaic",
                 cfg_type=mgmm.MosaicGroupedMatmulConfig, config_space=mgmm.config_space,
                 heuristic=mgmm.heuristic_config, capability=mgmm.capability, vjp=mgmm.vjp)(mgmm.forward)

    tm, tpa = _matmul_tpu, _paged_attention_tpu
    for backend in _tpu_backends():
        register("matmul", Platform.PALLAS, backend, tier=Tier.UNTESTED, name="mosaic_tpu",
                 cfg_type=tm.TpuMatmulConfig, config_space=tm.matmul_config_space, heuristic=tm.heuristic_config,
                 capability=tm.matmul_capability, vjp=tm.matmul_vjp)(tm.matmul_forward_)
        register("ragged_paged_attention", Platform.PALLAS, backend, tier=Tier.UNTESTED, name="mosaic_tpu",
                 cfg_type=tpa.TpuPagedAttentionConfig, config_space=tpa.config_space, heuristic=tpa.heuristic_config,
                 capability=tpa.capability)(tpa.ragged_paged_attention)
        register("grouped_matmul", Platform.PALLAS, backend, tier=Tier.UNTESTED, name="mosaic_tpu",
                 cfg_type=tm.TpuMatmulConfig, config_space=tm.grouped_config_space, heuristic=tm.heuristic_config,
                 capability=tm.grouped_capability, vjp=tm.grouped_vjp)(tm.grouped_forward)


@hookimpl
def ejk_platform_status() -> PlatformStatus:
    return _env.platform_status()
