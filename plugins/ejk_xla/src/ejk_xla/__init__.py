"""ejk-xla: reference-quality and memory-efficient XLA kernels for every ejk operation.

Written with ``jax.numpy`` and ``lax``, they run on CPU, GPU and TPU, and are the default
every other platform is checked against. Registered as ``Platform.XLA`` / ``Backend.ANY``
through the ``xla`` entry point of the ``ejk`` group.
"""

from __future__ import annotations

from ejk_xla._flash_attention import FlashAttentionConfig, flash_attention
from ejk_xla._gated_delta_rule import GatedDeltaRuleConfig, gated_delta_rule
from ejk_xla._gla import GlaConfig, gla
from ejk_xla._grouped_matmul import GroupedMatmulConfig, grouped_matmul
from ejk_xla._linear_cross_entropy import LinearCrossEntropyConfig
from ejk_xla._matmul import MatmulConfig, matmul
from ejk_xla._mla_attention import MlaAttentionConfig, mla_paged_attention
from ejk_xla._paged_attention import PagedAttentionConfig, ragged_paged_attention
from ejk_xla._rms_norm import RmsNormConfig
from ejk_xla._ssd import SsdConfig, ssd
from ejk_xla._varlen_attention import VarlenAttentionConfig, flash_attention_varlen

__all__ = [
    "FlashAttentionConfig",
    "GatedDeltaRuleConfig",
    "GlaConfig",
    "GroupedMatmulConfig",
    "LinearCrossEntropyConfig",
    "MatmulConfig",
    "MlaAttentionConfig",
    "PagedAttentionConfig",
    "RmsNormConfig",
    "SsdConfig",
    "VarlenAttentionConfig",
    "flash_attention",
    "flash_attention_varlen",
    "gated_delta_rule",
    "gla",
    "grouped_matmul",
    "matmul",
    "mla_paged_attention",
    "ragged_paged_attention",
    "ssd",
]
