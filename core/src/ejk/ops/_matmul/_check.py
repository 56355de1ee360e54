"""Validation of ``matmul`` arguments (shaped as for ``jnp.matmul``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ejk.ops._check_arrays import require_array, require_floating, shape_of

__all__ = ["check_matmul_args"]


def _contraction_needs(b_ndim: int, k: int) -> str:
    if b_ndim == 1:
        return f"[k={k}]"
    return f"[k={k}, n]" if b_ndim == 2 else f"[..., k={k}, n]"


def check_matmul_args(a: Any, b: Any) -> None:
    """Validate the arguments of ``matmul(a, b)``, shaped as for ``jnp.matmul``.

    ``a [..., m, k] @ b [..., k, n]`` with batch dimensions that broadcast (NumPy rules); a
    1-D ``a`` is a row ``[k]`` and a 1-D ``b`` a column ``[k]``, whose dimension is dropped
    from the result, as in ``jnp.matmul``.

    Args:
        a: ``[..., m, k]`` or ``[k]``, floating.
        b: ``[..., k, n]`` or ``[k]``, floating.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "matmul"
    require_array(op, "a", a, "[..., m, k] or [k]")
    a_shape = shape_of(a)
    if not a_shape:
        raise ValueError("matmul: a has shape () but needs [..., m, k] or [k] (at least 1 dimension; "
                         "multiply by a scalar with *)")
    k = a_shape[-1]
    require_array(op, "b", b, f"[..., k={k}, n] or [k={k}]")
    b_shape = shape_of(b)
    if not b_shape:
        raise ValueError(f"matmul: b has shape () but needs [..., k={k}, n] or [k={k}] (at least 1 dimension; "
                         "multiply by a scalar with *)")
    b_k = b_shape[-2] if len(b_shape) >= 2 else b_shape[0]
    if b_k != k:
        where = "its first dimension" if len(b_shape) <= 2 else "its second-to-last dimension"
        raise ValueError(
            f"matmul: b has shape {b_shape} but needs {_contraction_needs(len(b_shape), k)} ({where} must match "
            f"the last dimension of a, whose shape is {a_shape})"
        )
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    try:
        np.broadcast_shapes(a_batch, b_batch)
    except ValueError:
        raise ValueError(
            f"matmul: b has shape {b_shape} but needs batch dimensions that broadcast with a's {a_batch} "
            f"(a has shape {a_shape}); its batch dimensions {b_batch} differ where neither is 1, aligned from "
            "the right as in jnp.matmul: reshape or insert size-1 axes"
        ) from None
    require_floating(op, "a", a)
    require_floating(op, "b", b)
