"""``grouped_matmul``: everything about the op in one folder.

``_op`` (the kernel and the public function, declared with ``define_op``), ``_check`` (argument
validation), ``_activation`` (the fused gated activation's math, shared by the implementations),
``_reference`` (the plain reference), ``_conformance`` (the check every platform's implementation
passes), ``_shard`` (how a call splits over sharded inputs: experts, rows, columns, contraction) and
``_bench`` (what ``ejk bench`` measures).
"""

from __future__ import annotations

from ejk.ops._grouped_matmul._activation import (
    GROUPED_MATMUL_ACTIVATIONS,
    gated_cotangent,
    gated_gradients,
    gated_output,
)
from ejk.ops._grouped_matmul._op import GroupedMatmulKernel, grouped_matmul

__all__ = ["GROUPED_MATMUL_ACTIVATIONS", "GroupedMatmulKernel", "gated_cotangent", "gated_gradients", "gated_output",
           "grouped_matmul"]
