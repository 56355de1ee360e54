"""The public operations and how they are dispatched."""

from __future__ import annotations

from ejk.ops._attention import FlashAttentionKernel, flash_attention
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, set_default_executor, use_executor
from ejk.ops._matmul import GroupedMatmulKernel, MatmulKernel, grouped_matmul, matmul
from ejk.ops._paged import RaggedPagedAttentionKernel, ragged_paged_attention

__all__ = [
    "FlashAttentionKernel",
    "GroupedMatmulKernel",
    "ImplChoice",
    "MatmulKernel",
    "OpKernel",
    "RaggedPagedAttentionKernel",
    "flash_attention",
    "get_default_executor",
    "grouped_matmul",
    "matmul",
    "ragged_paged_attention",
    "set_default_executor",
    "use_executor",
]
