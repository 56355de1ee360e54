"""The ``triton`` entry point: registers the Triton implementations with their configs, gates and VJPs.

Imports neither triton nor jax-triton: kernels import them when they are first launched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
from ejk_triton import _env, _flash_attention, _paged_attention

#: Between ejk-xla's chunked kernel (0) and its cuDNN one (10): in the heuristics tier the Triton
#: kernels take what cuDNN's gate refuses (soft cap, segment ids, Sq != Sk causal, odd lengths)
#: until H100 measurements say where they beat cuDNN; autotuning compares them everywhere.
PRIORITY = 5


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    fa, pa = _flash_attention, _paged_attention
    vjp = ejk.VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS)
    for backend in _env.backends():
        register("flash_attention", ejk.Platform.TRITON, backend, priority=PRIORITY, name="flash",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
        # Not differentiable (serving-time attention), like ejk-xla's: no VJP.
        register("ragged_paged_attention", ejk.Platform.TRITON, backend, priority=PRIORITY, name="paged",
                 cfg_type=pa.PagedAttentionConfig, config_space=pa.config_space, heuristic=pa.heuristic_config,
                 capability=pa.capability)(pa.ragged_paged_attention)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return _env.platform_status()  # type: ignore[no-any-return]


@ejk.hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
