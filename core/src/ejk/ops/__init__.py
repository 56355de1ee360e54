"""The public operations and how they are dispatched, and the residual tags of their custom VJPs
(:data:`FLASH_RESIDUALS`, :data:`FLASH_LSE_RESIDUALS`, :data:`MATMUL_RESIDUALS`,
:data:`GROUPED_MATMUL_RESIDUALS`, :data:`LINEAR_CROSS_ENTROPY_RESIDUALS`, :data:`RMS_NORM_RESIDUALS`,
:data:`GLA_RESIDUALS`, :data:`SSD_RESIDUALS`; see docs/KERNEL_CONTRACT.md).

Each built-in operation is one folder, ``ejk/ops/_<name>/`` (listed in :mod:`ejk.ops._builtin`),
holding its kernel and public function, validation, reference, conformance check, residual
formats, shard rule and bench workload, tied together by its :func:`define_op` call.
"""

from __future__ import annotations

from ejk._contract import Extension
from ejk._operand_vjp import GROUPED_MATMUL_RESIDUALS, MATMUL_RESIDUALS
from ejk.ops._base import (
    Candidate,
    ImplChoice,
    OpKernel,
    get_default_executor,
    run_op,
    set_default_executor,
    use_executor,
)
from ejk.ops._builtin import BUILTIN_OPS, builtin_ops
from ejk.ops._definition import OPS, OpDefinition, define_op, get_op
from ejk.ops._explain import Explanation, ImplementationReport, explain
from ejk.ops._flash_attention import FlashAttentionKernel, FlashAttentionLseKernel, flash_attention, flash_attention_lse
from ejk.ops._flash_attention._residuals import (
    FLASH_LSE_RESIDUALS,
    FLASH_RESIDUALS,
    LSE2_INDEX,
    fold_sinks,
    natural_lse,
    sinks_backward,
    sinks_cotangent,
    with_natural_lse,
)
from ejk.ops._flash_attention_varlen import (
    FlashAttentionVarlenKernel,
    flash_attention_varlen,
    sanitize_offsets,
    varlen_row_ranges,
)
from ejk.ops._gated_delta_rule import GatedDeltaRuleKernel, gated_delta_rule, gated_delta_rule_step
from ejk.ops._generic import AlgorithmKernel, run
from ejk.ops._gla import GLA_RESIDUALS, GlaKernel, gla, gla_step
from ejk.ops._grouped_matmul import (
    GROUPED_MATMUL_ACTIVATIONS,
    GroupedMatmulKernel,
    gated_cotangent,
    gated_gradients,
    gated_output,
    grouped_matmul,
)
from ejk.ops._linear_cross_entropy import (
    LINEAR_CROSS_ENTROPY_RESIDUALS,
    LinearCrossEntropyKernel,
    linear_cross_entropy,
)
from ejk.ops._matmul import MatmulKernel, matmul
from ejk.ops._mla_paged_attention import MlaPagedAttentionKernel, mla_paged_attention
from ejk.ops._ragged_paged_attention import (
    RaggedPagedAttentionKernel,
    paged_merge_splits,
    paged_owned_rows,
    ragged_paged_attention,
)
from ejk.ops._residuals import without_residuals
from ejk.ops._rms_norm import RMS_NORM_RESIDUALS, RmsNormKernel, rms_norm
from ejk.ops._ssd import SSD_RESIDUALS, SsdKernel, ssd, ssd_step

builtin_ops()  # defines every built-in op, including any not re-exported above

__all__ = [
    "BUILTIN_OPS",
    "FLASH_LSE_RESIDUALS",
    "FLASH_RESIDUALS",
    "GLA_RESIDUALS",
    "GROUPED_MATMUL_ACTIVATIONS",
    "GROUPED_MATMUL_RESIDUALS",
    "LINEAR_CROSS_ENTROPY_RESIDUALS",
    "LSE2_INDEX",
    "MATMUL_RESIDUALS",
    "OPS",
    "RMS_NORM_RESIDUALS",
    "SSD_RESIDUALS",
    "AlgorithmKernel",
    "Candidate",
    "Explanation",
    "Extension",
    "FlashAttentionKernel",
    "GatedDeltaRuleKernel",
    "FlashAttentionLseKernel",
    "FlashAttentionVarlenKernel",
    "GlaKernel",
    "GroupedMatmulKernel",
    "ImplChoice",
    "ImplementationReport",
    "LinearCrossEntropyKernel",
    "MatmulKernel",
    "MlaPagedAttentionKernel",
    "OpDefinition",
    "OpKernel",
    "RaggedPagedAttentionKernel",
    "RmsNormKernel",
    "SsdKernel",
    "builtin_ops",
    "define_op",
    "explain",
    "flash_attention",
    "flash_attention_lse",
    "fold_sinks",
    "flash_attention_varlen",
    "gated_cotangent",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "gated_gradients",
    "gated_output",
    "get_default_executor",
    "get_op",
    "gla",
    "gla_step",
    "grouped_matmul",
    "linear_cross_entropy",
    "matmul",
    "mla_paged_attention",
    "natural_lse",
    "paged_merge_splits",
    "paged_owned_rows",
    "ragged_paged_attention",
    "rms_norm",
    "run",
    "run_op",
    "sanitize_offsets",
    "set_default_executor",
    "sinks_backward",
    "sinks_cotangent",
    "ssd",
    "ssd_step",
    "use_executor",
    "varlen_row_ranges",
    "with_natural_lse",
    "without_residuals",
]
