"""ejk-xla: reference-quality and memory-efficient XLA kernels for every ejk operation.

Written with ``jax.numpy`` and ``lax``, they run on CPU, GPU and TPU, and are the default
every other platform is checked against. Registered as ``Platform.XLA`` / ``Backend.ANY``
through the ``xla`` entry point of the ``ejk`` group.
"""

from __future__ import annotations

from ejk_xla._flash_attention import FlashAttentionConfig, flash_attention
from ejk_xla._gla import GlaConfig, gla
from ejk_xla._grouped_matmul import GroupedMatmulConfig, grouped_matmul
from ejk_xla._matmul import MatmulConfig, matmul
from ejk_xla._paged_attention import PagedAttentionConfig, ragged_paged_attention
from ejk_xla._ssd import SsdConfig, ssd

__all__ = [
    "FlashAttentionConfig",
    "GlaConfig",
    "GroupedMatmulConfig",
    "MatmulConfig",
    "PagedAttentionConfig",
    "SsdConfig",
    "flash_attention",
    "gla",
    "grouped_matmul",
    "matmul",
    "ragged_paged_attention",
    "ssd",
]
