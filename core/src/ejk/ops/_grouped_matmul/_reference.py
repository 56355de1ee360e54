"""Plain reference for ``grouped_matmul`` (float32 math, easy to read).

It is a test oracle, not a kernel: it gathers a weight matrix per row (an ``[m, k, n]``
intermediate), which a real implementation must never do. It takes the op's ``precision`` and
``preferred_element_type`` with the same defaults.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["reference_grouped_matmul"]


def reference_grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: Any = "highest",
    preferred_element_type: Any = None,
    activation: str | None = None,
) -> jax.Array:
    """Row-grouped matmul computed in float32 through a per-row gather of ``rhs``.

    Rows ``[start_i, start_i + group_sizes[i])`` (consecutive groups) are multiplied by
    ``rhs[i]``; rows past ``sum(group_sizes)`` are zeros. Differentiable in ``lhs`` and
    ``rhs`` through plain autodiff.

    Args:
        lhs: ``[m, k]``.
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]`` non-negative integers with a sum ``<= m``.
        precision: Of the products, as for ``jax.lax.dot_general``; default ``"highest"``.
        preferred_element_type: Output dtype; ``None`` means ``lhs.dtype``.
        activation: ``None``, or ``"swiglu"``: ``silu(z[:, :n/2]) * z[:, n/2:]`` of the float32 product ``z``.

    Returns:
        ``[m, n]`` in ``preferred_element_type`` (``[m, n / 2]`` with an activation).
    """
    from ejk.ops._grouped_matmul._activation import gated_output

    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    m = lhs.shape[0]
    groups, _, n = rhs.shape
    if groups == 0:
        return jnp.zeros((m, n if activation is None else n // 2), out_dtype)
    ends = jnp.cumsum(jnp.asarray(group_sizes, jnp.int32))
    rows = jnp.arange(m, dtype=jnp.int32)
    group_of_row = jnp.searchsorted(ends, rows, side="right")  # first group whose end is past the row
    in_some_group = rows < ends[-1]
    per_row_rhs = rhs.astype(jnp.float32)[jnp.minimum(group_of_row, groups - 1)]  # [m, k, n]
    out = jnp.einsum("mk,mkn->mn", lhs.astype(jnp.float32), per_row_rhs, precision=precision)
    out = jnp.where(in_some_group[:, None], out, 0.0)
    return gated_output(out, activation).astype(out_dtype)
