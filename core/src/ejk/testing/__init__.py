"""Plain reference implementations and conformance helpers for every ejk operation.

Every platform plugin checks its kernels against these references (materialised logits,
float32 math). They are deliberately simple and slow. Each op's reference and conformance check
live with the op (its :class:`~ejk.ops.OpDefinition`); here they are ``reference_<op>`` and
``check_<op>`` for every defined op, and :func:`check_op` runs one by name. The test suites of
ejk and its plugins share the rest: the one tolerance table (:data:`TOLERANCES`,
:func:`assert_close`), problem builders (:class:`AttentionCase`, :func:`paged_batch`) and a
cheaply compiled jit (:func:`fast_jit`) and a walk over a traced program's equations
(:func:`jaxpr_equations`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ejk.testing._cases import (
    FAST_COMPILE,
    AttentionCase,
    attention_values_and_grads,
    fast_jit,
    jaxpr_equations,
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
from ejk.testing._op_checks import TOLERANCES, assert_close, check_op, compare, tolerance

if TYPE_CHECKING:
    from ejk.ops._flash_attention._conformance import (
        FLASH_ATTENTION_CASES,
        SINKS_CASES,
        check_flash_attention,
        check_flash_attention_lse,
        check_flash_attention_sinks,
    )
    from ejk.ops._flash_attention._reference import (
        attention_mask,
        reference_flash_attention,
        reference_flash_attention_lse,
    )
    from ejk.ops._flash_attention_varlen._conformance import (
        VARLEN_CASES,
        check_flash_attention_varlen,
        check_varlen_against_float64,
    )
    from ejk.ops._flash_attention_varlen._reference import (
        reference_flash_attention_varlen,
        reference_varlen_per_sequence,
    )
    from ejk.ops._gated_delta_rule._conformance import GdrCase, gdr_inputs
    from ejk.ops._gla._conformance import GLA_CASES, check_gla
    from ejk.ops._gla._reference import reference_gla
    from ejk.ops._grouped_matmul._conformance import check_grouped_matmul
    from ejk.ops._grouped_matmul._reference import reference_grouped_matmul
    from ejk.ops._linear_cross_entropy._conformance import LINEAR_CROSS_ENTROPY_CASES, check_linear_cross_entropy
    from ejk.ops._linear_cross_entropy._reference import reference_linear_cross_entropy
    from ejk.ops._matmul._conformance import MATMUL_SHAPES, check_matmul
    from ejk.ops._matmul._reference import reference_matmul
    from ejk.ops._mla_paged_attention._conformance import check_mla_paged_attention, mla_batch
    from ejk.ops._mla_paged_attention._reference import mla_paged_attention_float64, reference_mla_paged_attention
    from ejk.ops._ragged_paged_attention._conformance import check_ragged_paged_attention
    from ejk.ops._ragged_paged_attention._reference import reference_ragged_paged_attention
    from ejk.ops._rms_norm._conformance import RMS_NORM_RESIDUAL_SHAPES, RMS_NORM_SHAPES, check_rms_norm
    from ejk.ops._rms_norm._reference import reference_rms_norm
    from ejk.ops._ssd._conformance import SSD_CASES, check_ssd
    from ejk.ops._ssd._reference import reference_ssd

#: Names of an op's folder that are not its reference or check, by the module that holds them.
_OP_EXTRAS = {
    "FLASH_ATTENTION_CASES": "ejk.ops._flash_attention._conformance",
    "SINKS_CASES": "ejk.ops._flash_attention._conformance",
    "check_flash_attention_sinks": "ejk.ops._flash_attention._conformance",
    "attention_mask": "ejk.ops._flash_attention._reference",
    "MATMUL_SHAPES": "ejk.ops._matmul._conformance",
    "VARLEN_CASES": "ejk.ops._flash_attention_varlen._conformance",
    "check_varlen_against_float64": "ejk.ops._flash_attention_varlen._conformance",
    "reference_varlen_per_sequence": "ejk.ops._flash_attention_varlen._reference",
    "mla_batch": "ejk.ops._mla_paged_attention._conformance",
    "mla_paged_attention_float64": "ejk.ops._mla_paged_attention._reference",
    "GdrCase": "ejk.ops._gated_delta_rule._conformance",
    "gdr_inputs": "ejk.ops._gated_delta_rule._conformance",
    "LINEAR_CROSS_ENTROPY_CASES": "ejk.ops._linear_cross_entropy._conformance",
    "RMS_NORM_RESIDUAL_SHAPES": "ejk.ops._rms_norm._conformance",
    "RMS_NORM_SHAPES": "ejk.ops._rms_norm._conformance",
    "GLA_CASES": "ejk.ops._gla._conformance",
    "SSD_CASES": "ejk.ops._ssd._conformance",
}

__all__ = [
    "FAST_COMPILE",
    "AttentionCase",
    "ConformanceError",
    "FLASH_ATTENTION_CASES",
    "GLA_CASES",
    "GdrCase",
    "LINEAR_CROSS_ENTROPY_CASES",
    "MATMUL_SHAPES",
    "SINKS_CASES",
    "SSD_CASES",
    "RMS_NORM_RESIDUAL_SHAPES",
    "RMS_NORM_SHAPES",
    "TOLERANCES",
    "VARLEN_CASES",
    "assert_close",
    "attention_mask",
    "attention_values_and_grads",
    "check_flash_attention",
    "check_flash_attention_lse",
    "check_flash_attention_sinks",
    "check_flash_attention_varlen",
    "check_gla",
    "check_grouped_matmul",
    "check_linear_cross_entropy",
    "check_matmul",
    "check_mla_paged_attention",
    "check_op",
    "compare",
    "check_ragged_paged_attention",
    "check_rms_norm",
    "check_ssd",
    "check_discovered_plugins",
    "check_imports_lazily",
    "check_plugin",
    "check_varlen_against_float64",
    "expected_plugins",
    "fast_jit",
    "jaxpr_equations",
    "gdr_inputs",
    "mla_batch",
    "mla_paged_attention_float64",
    "paged_batch",
    "reference_flash_attention",
    "reference_flash_attention_lse",
    "reference_flash_attention_varlen",
    "reference_gla",
    "reference_grouped_matmul",
    "reference_linear_cross_entropy",
    "reference_matmul",
    "reference_mla_paged_attention",
    "reference_ragged_paged_attention",
    "reference_rms_norm",
    "reference_ssd",
    "reference_varlen_per_sequence",
    "tolerance",
    "values_and_grads",
]


def __getattr__(name: str) -> Any:
    """``reference_<op>`` / ``check_<op>`` of a defined op (read from its definition), and the few
    other names of the ops' folders, imported on first access."""
    if name in _OP_EXTRAS:
        value = getattr(importlib.import_module(_OP_EXTRAS[name]), name)
    else:
        kind, _, op = name.partition("_")
        from ejk.ops import OPS

        definition = OPS.get(op) if kind in ("reference", "check") else None
        value = None
        if definition is not None:
            value = definition.reference_fn() if kind == "reference" else definition.check_fn()
        if value is None:
            raise AttributeError(f"module 'ejk.testing' has no attribute {name!r}")
    globals()[name] = value
    return value
