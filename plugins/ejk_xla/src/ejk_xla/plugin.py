"""The ``xla`` entry point: registers the XLA implementations with their configs and gates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ejk
from ejk_xla import _cudnn_attention, _flash_attention, _grouped_matmul, _matmul, _paged_attention

#: Preference of cuDNN attention in the heuristics tier: above the chunked kernel (which it
#: beats 4–9× on an H100, benchmarks/results/attention_gpu_h100.md) wherever its gate allows.
CUDNN_PRIORITY = 10

#: The other platforms of the ejk family, for the "what to install" hint of a missing platform.
SIBLING_DISTRIBUTIONS = {"pallas": "ejk-pallas", "triton": "ejk-triton", "cute": "ejk-cute"}


@ejk.hookimpl
def ejk_register_kernels(register: Callable[..., Callable[[Any], Any]]) -> None:
    portable = (ejk.Platform.XLA, ejk.Backend.ANY)
    register("flash_attention", *portable, name="chunked", cfg_type=_flash_attention.FlashAttentionConfig,
             config_space=_flash_attention.config_space, heuristic=_flash_attention.heuristic_config,
             )(_flash_attention.flash_attention)
    # Registered for the lse variant itself: the chunked kernel differentiates through its own custom_vjp
    # (no ejk.VJP, and its lse is blocked internally), so the core cannot derive the variant from it.
    register("flash_attention_lse", *portable, name="chunked", cfg_type=_flash_attention.FlashAttentionConfig,
             config_space=_flash_attention.config_space, heuristic=_flash_attention.heuristic_config,
             )(_flash_attention.flash_attention_lse)
    register("flash_attention", ejk.Platform.XLA, ejk.Backend.GPU, priority=CUDNN_PRIORITY, name="cudnn",
             capability=_cudnn_attention.capability)(_cudnn_attention.cudnn_attention)
    register("matmul", *portable, name="dot", cfg_type=_matmul.MatmulConfig,
             config_space=_matmul.config_space, heuristic=_matmul.heuristic_config,
             vjp=ejk.VJP(fwd=_matmul.forward_with_residuals, bwd=_matmul.backward,
                         residuals=_matmul.RESIDUALS))(_matmul.matmul)
    register("grouped_matmul", *portable, name="tiled", cfg_type=_grouped_matmul.GroupedMatmulConfig,
             config_space=_grouped_matmul.config_space,
             heuristic=_grouped_matmul.heuristic_config)(_grouped_matmul.grouped_matmul)
    register("ragged_paged_attention", *portable, name="paged", cfg_type=_paged_attention.PagedAttentionConfig,
             config_space=_paged_attention.config_space,
             heuristic=_paged_attention.heuristic_config)(_paged_attention.ragged_paged_attention)


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    import jax

    return ejk.PlatformStatus(platform="xla", available=True, versions={"jax": jax.__version__})


@ejk.hookimpl
def ejk_platform_distributions() -> dict[str, str]:
    return SIBLING_DISTRIBUTIONS
