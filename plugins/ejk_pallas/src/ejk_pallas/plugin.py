"""The ``pallas`` entry point: registers the Pallas implementations with their configs, gates and VJPs.

Imports no Pallas module: kernels import ``jax.experimental.pallas`` when they are first traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
from ejk_pallas import _env, _flash_attention, _flash_attention_tpu

#: Same tier as ejk-triton's kernel (5): between ejk-xla's chunked kernel (0) and its cuDNN one (10),
#: until H100 measurements say where the Pallas kernel wins; autotuning compares them everywhere.
PRIORITY = 4
#: Below ejk-xla (0): the Mosaic TPU kernel is untested on TPU hardware, so ``platform="auto"``
#: keeps choosing XLA there; ``platform="pallas"`` (or autotuning) reaches it.
TPU_PRIORITY = -1


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    fa = _flash_attention
    vjp = ejk.VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=PRIORITY, name="triton_lowered",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
    tpu = _flash_attention_tpu
    tpu_vjp = ejk.VJP(fwd=tpu.forward_with_residuals, bwd=tpu.backward, residuals=tpu.RESIDUALS)
    for backend in ("tpu", "cpu") if _env.interpret_mode() else ("tpu",):
        register("flash_attention", ejk.Platform.PALLAS, backend, priority=TPU_PRIORITY, name="mosaic_tpu",
                 cfg_type=tpu.TpuFlashAttentionConfig, config_space=tpu.config_space, heuristic=tpu.heuristic_config,
                 capability=tpu.capability, vjp=tpu_vjp)(tpu.forward)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return _env.platform_status()  # type: ignore[no-any-return]

