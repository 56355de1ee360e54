"""The ``pallas`` entry point: registers the Pallas implementations with their configs, gates and VJPs.

Imports no Pallas module: kernels import ``jax.experimental.pallas`` when they are first traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
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
    _paged_attention,
    _paged_attention_tpu,
)

#: Below ejk-triton's flash kernel (5, faster on the H100: fwd 0.77-0.87x cuDNN against 0.64-0.71x) and
#: the Mosaic GPU kernel on Hopper (9); above ejk-xla's chunked kernel (0).
PRIORITY = 3
#: Below ejk-xla (0): the Mosaic TPU kernel is untested on TPU hardware, so ``platform="auto"``
#: keeps choosing XLA there; ``platform="pallas"`` (or autotuning) reaches it.
TPU_PRIORITY = -1
#: grouped_matmul: below ejk-triton's kernel for the same op (5), above ejk-xla (0).
OPS_PRIORITY = 3
#: grouped_matmul's Mosaic GPU kernel (Hopper): above the Triton-lowered one (3), below ejk-triton's (5). H100,
#: 2026-11-26, 64 experts, k 2048, n 1536, 32k tokens, forward: 0.391-0.404 against 0.417 ms with equal groups,
#: 0.414 against 0.481 skewed (forward+backward 1.46 against 1.54 / 1.59 against 1.71 ms); autotuning compares them.
MOSAIC_GMM_PRIORITY = 4
#: ragged_paged_attention: above ejk-triton's (5). H100, 2026-11-23, one run: 924-2876 GB/s against
#: ejk-triton's 390-2330 GB/s on every measured shape (batch 8/16/64, context 2k-16k, 32/8 heads).
PAGED_PRIORITY = 6
#: matmul: below ejk-triton's gemm (-5) and ejk-xla's cuBLAS dot (0); autotuning compares them.
MATMUL_PRIORITY = -6
#: matmul's Mosaic GPU kernel (Hopper): below ejk-xla's cuBLAS dot (0), above ejk-triton's gemm (-5) and the
#: Triton-lowered kernel (-6). H100, 2026-11-26: 0.98x a @ b at 8192^3, 4096^3 and 8192x2048x8192 (ejk-triton
#: 0.85-0.89x); autotuning compares them.
MOSAIC_MATMUL_PRIORITY = -4
#: flash_attention's Mosaic GPU kernel (Hopper only: elsewhere its gate refuses and the Triton-lowered
#: kernel takes the call): below ejk-xla's cuDNN attention (10), above ejk-cute's forward (8, which pairs
#: with ejk-triton's slower backward) and ejk-triton (5). H100, 2026-11-26, heuristic configs, against
#: cuDNN: forward 1.01-1.15x, forward+backward with its own backward 0.91-1.03x
#: (``pallas_mosaic_attention_h100_20261126b.md``); ejk-cute's forward 1.02-1.11x, ejk-triton's 0.77-0.80x.
MOSAIC_GPU_PRIORITY = 9


#: The flash backwards take the lse cotangent too: ejk.flash_attention_lse comes with them.
LSE = ("lse",)


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    fa = _flash_attention
    vjp = ejk.VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS, extra_cotangents=LSE)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=PRIORITY, name="triton_lowered",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
    mg = _flash_attention_mgpu
    mg_vjp = ejk.VJP(fwd=mg.forward_with_residuals, bwd=mg.backward, residuals=mg.RESIDUALS, extra_cotangents=LSE)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=MOSAIC_GPU_PRIORITY, name="mosaic",
                 cfg_type=mg.MosaicFlashAttentionConfig, config_space=mg.config_space,
                 heuristic=mg.heuristic_config, capability=mg.capability, vjp=mg_vjp)(mg.forward)
    tpu = _flash_attention_tpu
    tpu_vjp = ejk.VJP(fwd=tpu.forward_with_residuals, bwd=tpu.backward, residuals=tpu.RESIDUALS, extra_cotangents=LSE)
    for backend in ("tpu", "cpu") if _env.interpret_mode() else ("tpu",):
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=TPU_PRIORITY, name="mosaic_tpu",
                 cfg_type=tpu.TpuFlashAttentionConfig, config_space=tpu.config_space, heuristic=tpu.heuristic_config,
                 capability=tpu.capability, vjp=tpu_vjp)(tpu.forward)
    _register_ops(register)


def _register_ops(register: Callable[..., Callable[[Any], Any]]) -> None:
    """ragged_paged_attention (not differentiable), matmul and grouped_matmul (custom VJPs), GPU and TPU."""
    pa, mm, gmm, mgmm = _paged_attention, _matmul, _grouped_matmul, _grouped_matmul_mgpu
    mm_vjp = ejk.VJP(fwd=mm.forward_with_residuals, bwd=mm.backward, residuals=mm.RESIDUALS)
    gmm_vjp = ejk.VJP(fwd=gmm.forward_with_residuals, bwd=gmm.backward, residuals=gmm.RESIDUALS)
    for backend in _env.backends():
        register("ragged_paged_attention", ejk.Platform.PALLAS, backend, priority=PAGED_PRIORITY,
                 name="triton_lowered", cfg_type=pa.PagedAttentionConfig, config_space=pa.config_space,
                 heuristic=pa.heuristic_config, capability=pa.capability)(pa.ragged_paged_attention)
        register("matmul", ejk.Platform.PALLAS, backend, priority=MATMUL_PRIORITY, name="triton_lowered",
                 cfg_type=mm.MatmulConfig, config_space=mm.config_space, heuristic=mm.heuristic_config,
                 capability=mm.capability, vjp=mm_vjp)(mm.forward)
        mmm = _matmul_mgpu
        register("matmul", ejk.Platform.PALLAS, backend, priority=MOSAIC_MATMUL_PRIORITY, name="mosaic",
                 cfg_type=mmm.MosaicMatmulConfig, config_space=mmm.config_space, heuristic=mmm.heuristic_config,
                 capability=mmm.capability,
                 vjp=ejk.VJP(fwd=mmm.forward_with_residuals, bwd=mmm.backward, residuals=mm.RESIDUALS))(mmm.forward)
        register("grouped_matmul", ejk.Platform.PALLAS, backend, priority=OPS_PRIORITY, name="triton_lowered",
                 cfg_type=gmm.GroupedMatmulConfig, config_space=gmm.config_space, heuristic=gmm.heuristic_config,
                 capability=gmm.capability, vjp=gmm_vjp)(gmm.forward)
        register("grouped_matmul", ejk.Platform.PALLAS, backend, priority=MOSAIC_GMM_PRIORITY, name="mosaic",
                 cfg_type=mgmm.MosaicGroupedMatmulConfig, config_space=mgmm.config_space,
                 heuristic=mgmm.heuristic_config, capability=mgmm.capability,
                 vjp=ejk.VJP(fwd=mgmm.forward_with_residuals, bwd=mgmm.backward, residuals=gmm.RESIDUALS))(mgmm.forward)

    tm, tpa = _matmul_tpu, _paged_attention_tpu
    tmm_vjp = ejk.VJP(fwd=tm.matmul_forward_with_residuals, bwd=tm.matmul_backward_, residuals=mm.RESIDUALS)
    tgmm_vjp = ejk.VJP(fwd=tm.grouped_forward_with_residuals, bwd=tm.grouped_backward, residuals=gmm.RESIDUALS)
    # On the CPU (interpret mode) the TPU kernels rank below the GPU ones: the TPU interpreter is the slower.
    for backend, prio in (("tpu", TPU_PRIORITY), ("cpu", MATMUL_PRIORITY - 1)):
        if backend == "cpu" and not _env.interpret_mode():
            continue
        register("matmul", ejk.Platform.PALLAS, backend, priority=prio, name="mosaic_tpu",
                 cfg_type=tm.TpuMatmulConfig, config_space=tm.matmul_config_space, heuristic=tm.heuristic_config,
                 capability=tm.matmul_capability, vjp=tmm_vjp)(tm.matmul_forward_)
        register("ragged_paged_attention", ejk.Platform.PALLAS, backend, priority=TPU_PRIORITY, name="mosaic_tpu",
                 cfg_type=tpa.TpuPagedAttentionConfig, config_space=tpa.config_space, heuristic=tpa.heuristic_config,
                 capability=tpa.capability)(tpa.ragged_paged_attention)
        register("grouped_matmul", ejk.Platform.PALLAS, backend, priority=prio, name="mosaic_tpu",
                 cfg_type=tm.TpuMatmulConfig, config_space=tm.grouped_config_space, heuristic=tm.heuristic_config,
                 capability=tm.grouped_capability, vjp=tgmm_vjp)(tm.grouped_forward)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return _env.platform_status()  # type: ignore[no-any-return]
