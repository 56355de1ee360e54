"""The public operations and how they are dispatched."""

from __future__ import annotations

from ejk.ops import _attention, _matmul, _paged
from ejk.ops._attention import FlashAttentionKernel, flash_attention
from ejk.ops._base import (
    Candidate,
    ImplChoice,
    OpKernel,
    get_default_executor,
    set_default_executor,
    use_executor,
)
from ejk.ops._explain import Explanation, ImplementationReport, explain
from ejk.ops._matmul import GroupedMatmulKernel, MatmulKernel, grouped_matmul, matmul
from ejk.ops._paged import RaggedPagedAttentionKernel, ragged_paged_attention

#: The kernel behind each public operation, by name.
OPS: dict[str, OpKernel] = {
    kernel.op_id: kernel for kernel in (_attention.KERNEL, _matmul.MATMUL, _matmul.GROUPED, _paged.KERNEL)
}

__all__ = [
    "OPS",
    "Candidate",
    "Explanation",
    "FlashAttentionKernel",
    "GroupedMatmulKernel",
    "ImplChoice",
    "ImplementationReport",
    "MatmulKernel",
    "OpKernel",
    "RaggedPagedAttentionKernel",
    "explain",
    "flash_attention",
    "get_default_executor",
    "grouped_matmul",
    "matmul",
    "ragged_paged_attention",
    "set_default_executor",
    "use_executor",
]
