"""Validation of ``grouped_matmul`` arguments; ``group_sizes`` values are checked where concrete."""

from __future__ import annotations

from typing import Any

import numpy as np

from ejk.ops._check_arrays import concrete, listed, require_floating, require_integer, require_ndim

__all__ = ["check_activation", "check_group_sizes", "check_grouped_matmul_args", "check_grouped_matmul_values"]


def check_grouped_matmul_args(lhs: Any, rhs: Any, group_sizes: Any) -> None:
    """Validate the arguments of ``grouped_matmul(lhs, rhs, group_sizes)``.

    Args:
        lhs: ``[m, k]`` floating array.
        rhs: ``[g, k, n]`` floating array.
        group_sizes: ``[g]`` integer array; where concrete, non-negative with a sum ``<= m``.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "grouped_matmul"
    m, k = require_ndim(op, "lhs", lhs, 2, "[m, k]")
    rhs_shape = require_ndim(op, "rhs", rhs, 3, f"[groups, k={k}, n]")
    if rhs_shape[1] != k:
        raise ValueError(
            f"grouped_matmul: rhs has shape {rhs_shape} but needs [groups, k={k}, n] "
            f"(lhs has shape {(m, k)})"
        )
    groups = rhs_shape[0]
    gs_shape = require_ndim(op, "group_sizes", group_sizes, 1, f"[groups={groups}]")
    if gs_shape[0] != groups:
        raise ValueError(
            f"grouped_matmul: group_sizes has shape {gs_shape} but needs [groups={groups}] "
            f"(one size per matrix of rhs, whose shape is {rhs_shape})"
        )
    require_floating(op, "lhs", lhs)
    require_floating(op, "rhs", rhs)
    require_integer(op, "group_sizes", group_sizes)
    check_group_sizes(group_sizes, m)


def check_activation(activation: Any, rhs: Any) -> str | None:
    """``activation``: ``None`` or a name of :data:`GROUPED_MATMUL_ACTIVATIONS`; a gated one needs ``rhs``'s
    columns to split in two halves (gate, up)."""
    from ejk.ops._grouped_matmul._activation import GROUPED_MATMUL_ACTIVATIONS

    if activation is None:
        return None
    if not isinstance(activation, str) or activation not in GROUPED_MATMUL_ACTIVATIONS:
        raise ValueError(f"grouped_matmul: activation={activation!r} is not supported; pass None (the plain "
                         f"product) or one of {GROUPED_MATMUL_ACTIVATIONS}")
    n = rhs.shape[2]
    if n % 2:
        raise ValueError(f"grouped_matmul: activation={activation!r} needs rhs [groups, k, 2n] (the gate "
                         f"columns [:n], then the up columns [n:]), but rhs has shape {tuple(rhs.shape)} with an "
                         "odd number of columns")
    return activation


def check_grouped_matmul_values(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): ``group_sizes``."""
    check_group_sizes(group_sizes, lhs.shape[0])


def check_group_sizes(group_sizes: Any, m: int) -> None:
    """Where ``group_sizes`` is concrete: non-negative entries summing to at most ``m``."""
    sizes = concrete(group_sizes)
    if sizes is None:
        return
    (negative,) = np.nonzero(sizes < 0)
    if negative.size:
        raise ValueError(
            f"grouped_matmul: group_sizes has negative entries {listed(negative, sizes[negative])} "
            "but needs non-negative sizes"
        )
    total = int(sizes.astype(np.int64).sum())
    if total > m:
        raise ValueError(
            f"grouped_matmul: group_sizes sums to {total} but needs a sum <= m={m} (the rows of lhs)"
        )
