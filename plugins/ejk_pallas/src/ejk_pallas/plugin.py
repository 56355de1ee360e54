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
    _matmul,
    _matmul_tpu,
    _paged_attention,
    _paged_attention_tpu,
)

#: Same tier as ejk-triton's kernel (5): between ejk-xla's chunked kernel (0) and its cuDNN one (10),
#: until H100 measurements say where the Pallas kernel wins; autotuning compares them everywhere.
PRIORITY = 4
#: Below ejk-xla (0): the Mosaic TPU kernel is untested on TPU hardware, so ``platform="auto"``
#: keeps choosing XLA there; ``platform="pallas"`` (or autotuning) reaches it.
TPU_PRIORITY = -1
#: ragged_paged_attention / grouped_matmul: below ejk-triton's kernels for the same ops (5), above ejk-xla (0).
OPS_PRIORITY = 3
#: matmul: below ejk-triton's gemm (-5) and ejk-xla's cuBLAS dot (0); autotuning compares them.
MATMUL_PRIORITY = -6
#: Below the Triton-lowered kernel until H100 measurements rank it: the Mosaic GPU forward (Hopper
#: only, its gate says so elsewhere) is reached through its config type, autotuning or this order.
MOSAIC_GPU_PRIORITY = 3


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    fa = _flash_attention
    vjp = ejk.VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=PRIORITY, name="triton_lowered",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
    mg = _flash_attention_mgpu
    mg_vjp = ejk.VJP(fwd=mg.forward_with_residuals, bwd=mg.backward, residuals=mg.RESIDUALS)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=MOSAIC_GPU_PRIORITY, name="mosaic",
                 cfg_type=mg.MosaicFlashAttentionConfig, config_space=mg.config_space,
                 heuristic=mg.heuristic_config, capability=mg.capability, vjp=mg_vjp)(mg.forward)
    tpu = _flash_attention_tpu
    tpu_vjp = ejk.VJP(fwd=tpu.forward_with_residuals, bwd=tpu.backward, residuals=tpu.RESIDUALS)
    for backend in ("tpu", "cpu") if _env.interpret_mode() else ("tpu",):
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=TPU_PRIORITY, name="mosaic_tpu",
                 cfg_type=tpu.TpuFlashAttentionConfig, config_space=tpu.config_space, heuristic=tpu.heuristic_config,
                 capability=tpu.capability, vjp=tpu_vjp)(tpu.forward)
    _register_ops(register)


def _register_ops(register: Callable[..., Callable[[Any], Any]]) -> None:
    """ragged_paged_attention (not differentiable), matmul and grouped_matmul (custom VJPs), GPU and TPU."""
    pa, mm, gmm = _paged_attention, _matmul, _grouped_matmul
    mm_vjp = ejk.VJP(fwd=mm.forward_with_residuals, bwd=mm.backward, residuals=mm.RESIDUALS)
    gmm_vjp = ejk.VJP(fwd=gmm.forward_with_residuals, bwd=gmm.backward, residuals=gmm.RESIDUALS)
    for backend in _env.backends():
        register("ragged_paged_attention", ejk.Platform.PALLAS, backend, priority=OPS_PRIORITY,
                 name="triton_lowered", cfg_type=pa.PagedAttentionConfig, config_space=pa.config_space,
                 heuristic=pa.heuristic_config, capability=pa.capability)(pa.ragged_paged_attention)
        register("matmul", ejk.Platform.PALLAS, backend, priority=MATMUL_PRIORITY, name="triton_lowered",
                 cfg_type=mm.MatmulConfig, config_space=mm.config_space, heuristic=mm.heuristic_config,
                 capability=mm.capability, vjp=mm_vjp)(mm.forward)
        register("grouped_matmul", ejk.Platform.PALLAS, backend, priority=OPS_PRIORITY, name="triton_lowered",
                 cfg_type=gmm.GroupedMatmulConfig, config_space=gmm.config_space, heuristic=gmm.heuristic_config,
                 capability=gmm.capability, vjp=gmm_vjp)(gmm.forward)

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
