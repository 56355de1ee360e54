"""The public operations and how they are dispatched, and the residual tags of their custom VJPs
(:data:`FLASH_RESIDUALS`, :data:`FLASH_LSE_RESIDUALS`, :data:`MATMUL_RESIDUALS`,
:data:`GROUPED_MATMUL_RESIDUALS`; see docs/KERNEL_CONTRACT.md)."""

from __future__ import annotations

from ejk._operand_vjp import GROUPED_MATMUL_RESIDUALS, MATMUL_RESIDUALS
from ejk.ops._attention import FlashAttentionKernel, flash_attention
from ejk.ops._attention_lse import FlashAttentionLseKernel, flash_attention_lse
from ejk.ops._base import (
    Candidate,
    ImplChoice,
    OpKernel,
    get_default_executor,
    run_op,
    set_default_executor,
    use_executor,
)
from ejk.ops._definition import OPS, OpDefinition, define_op, get_op
from ejk.ops._explain import Explanation, ImplementationReport, explain
from ejk.ops._generic import AlgorithmKernel, run
from ejk.ops._matmul import GroupedMatmulKernel, MatmulKernel, grouped_matmul, matmul
from ejk.ops._paged import RaggedPagedAttentionKernel, paged_merge_splits, paged_owned_rows, ragged_paged_attention
from ejk.ops._residuals import (
    FLASH_LSE_RESIDUALS,
    FLASH_RESIDUALS,
    natural_lse,
    with_natural_lse,
    without_residuals,
)

__all__ = [
    "FLASH_LSE_RESIDUALS",
    "FLASH_RESIDUALS",
    "GROUPED_MATMUL_RESIDUALS",
    "MATMUL_RESIDUALS",
    "OPS",
    "AlgorithmKernel",
    "Candidate",
    "Explanation",
    "FlashAttentionKernel",
    "FlashAttentionLseKernel",
    "GroupedMatmulKernel",
    "ImplChoice",
    "ImplementationReport",
    "MatmulKernel",
    "OpDefinition",
    "OpKernel",
    "RaggedPagedAttentionKernel",
    "define_op",
    "explain",
    "flash_attention",
    "flash_attention_lse",
    "get_default_executor",
    "get_op",
    "grouped_matmul",
    "matmul",
    "natural_lse",
    "paged_merge_splits",
    "paged_owned_rows",
    "ragged_paged_attention",
    "run",
    "run_op",
    "set_default_executor",
    "use_executor",
    "with_natural_lse",
    "without_residuals",
]
