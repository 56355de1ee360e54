"""ejk-triton: Triton kernels for ejk, launched from JAX with jax-triton (NVIDIA GPUs).

Today: ``flash_attention`` forward and backward (FlashAttention-2 style kernels; GQA, causal,
sliding windows, soft cap, segment ids, bias), ``matmul`` (``jnp.matmul`` shapes),
``grouped_matmul`` (mixture of experts, one persistent launch over all groups), each with its
backward, ``flash_attention_varlen`` (packed variable-length sequences, forward and backward; also
``flash_attention`` calls with segment ids), ``ragged_paged_attention`` (decode with split-K and chunked
prefill over a paged KV cache, one kernel), ``mla_paged_attention`` (DeepSeek-style latent attention decode,
split-KV) and ``gated_delta_rule`` (chunked WY form, forward and backward), and ``gla`` and ``ssd`` (chunked
linear recurrences: one forward kernel, one backward kernel), and ``rms_norm`` (one read of each operand
per pass, a persistent backward). Triton and jax-triton are imported
lazily, when a kernel is first launched, so this package imports (and reports its status) without them.

``EJK_TRITON_INTERPRET=1`` runs the same kernels through Triton's interpreter on the CPU
(a test / debug mode: only ``platform="triton"`` reaches it, never ``platform="auto"``).
"""

from __future__ import annotations

from ejk_triton._env import INTERPRET_ENV
from ejk_triton._flash_attention import FlashAttentionConfig
from ejk_triton._gated_delta_rule import GatedDeltaRuleConfig
from ejk_triton._grouped_matmul import GroupedMatmulConfig
from ejk_triton._linear_attention import LinearAttentionConfig
from ejk_triton._matmul import MatmulConfig
from ejk_triton._mla_attention import MlaAttentionConfig
from ejk_triton._paged_attention import PagedAttentionConfig
from ejk_triton._rms_norm import RmsNormConfig
from ejk_triton._varlen_attention import VarlenAttentionConfig

__all__ = [
    "INTERPRET_ENV",
    "FlashAttentionConfig",
    "GatedDeltaRuleConfig",
    "GroupedMatmulConfig",
    "LinearAttentionConfig",
    "MatmulConfig",
    "MlaAttentionConfig",
    "PagedAttentionConfig",
    "RmsNormConfig",
    "VarlenAttentionConfig",
]
