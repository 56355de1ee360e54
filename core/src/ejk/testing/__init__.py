"""Plain reference implementations and conformance helpers for every ejk operation.

Every platform plugin checks its kernels against these references (materialised logits,
float32 math). They are deliberately simple and slow. The test suites of ejk and its plugins
share the rest: the one tolerance table (:data:`TOLERANCES`, :func:`assert_close`), problem
builders (:class:`AttentionCase`, :func:`paged_batch`) and a cheaply compiled jit (:func:`fast_jit`).
"""

from __future__ import annotations

from ejk.testing._cases import (
    FAST_COMPILE,
    AttentionCase,
    attention_values_and_grads,
    fast_jit,
    paged_batch,
    values_and_grads,
)
from ejk.testing._conformance import (
    ConformanceError,
    check_discovered_plugins,
    check_imports_lazily,
    check_plugin,
    expected_plugins,
)
from ejk.testing._op_checks import (
    FLASH_ATTENTION_CASES,
    MATMUL_SHAPES,
    TOLERANCES,
    assert_close,
    check_flash_attention,
    check_grouped_matmul,
    check_matmul,
    check_op,
    check_ragged_paged_attention,
    tolerance,
)
from ejk.testing._reference_attention import (
    attention_mask,
    reference_flash_attention,
    reference_flash_attention_lse,
)
from ejk.testing._reference_matmul import reference_grouped_matmul, reference_matmul
from ejk.testing._reference_paged import reference_ragged_paged_attention

__all__ = [
    "FAST_COMPILE",
    "AttentionCase",
    "ConformanceError",
    "FLASH_ATTENTION_CASES",
    "MATMUL_SHAPES",
    "TOLERANCES",
    "assert_close",
    "attention_mask",
    "attention_values_and_grads",
    "check_flash_attention",
    "check_grouped_matmul",
    "check_matmul",
    "check_op",
    "check_ragged_paged_attention",
    "check_discovered_plugins",
    "check_imports_lazily",
    "check_plugin",
    "expected_plugins",
    "fast_jit",
    "paged_batch",
    "reference_flash_attention",
    "reference_flash_attention_lse",
    "reference_grouped_matmul",
    "reference_matmul",
    "reference_ragged_paged_attention",
    "tolerance",
    "values_and_grads",
]
