"""``linear_cross_entropy``: everything about the op in one folder.

``_op`` (the kernel, the public function and the loss built from the implementations' per-token
statistics), ``_check`` (argument validation), ``_reference`` (the plain reference with
materialised logits), ``_conformance`` (the check every platform's implementation passes),
``_shard`` (vocabulary-parallel and token-parallel calls) and ``_bench`` (what ``ejk bench`` measures).
"""

from __future__ import annotations

from ejk.ops._linear_cross_entropy._op import (
    LINEAR_CROSS_ENTROPY_RESIDUALS,
    LinearCrossEntropyKernel,
    linear_cross_entropy,
)

__all__ = ["LINEAR_CROSS_ENTROPY_RESIDUALS", "LinearCrossEntropyKernel", "linear_cross_entropy"]
