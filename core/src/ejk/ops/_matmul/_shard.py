"""``matmul`` per shard: batch dims, rows of ``a``, columns of ``b`` and the contraction.

Batch dims (of ``a`` and ``b`` alike; a broadcast size-1 dim stays whole), rows and columns need
no communication; the contraction ``k`` gives float32 partial products summed with ``psum`` (an
all-reduce of the output), cast once — each device does ``1/d`` of the products instead of
gathering ``k`` and repeating them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ejk.ops._shard_plan import Axes, AxesOf, Call, ShardPlan, Size, divides, spec

__all__ = ["matmul_rule"]


def matmul_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan | None:
    a, b = arrays
    if a.ndim < 2 or b.ndim < 2:
        return None  # a vector operand: run whole
    taken: set[str] = set()

    def free(axes: Axes) -> Axes:
        if set(axes) & taken:
            return ()
        taken.update(axes)
        return axes

    batch = max(a.ndim, b.ndim) - 2
    a_dims: list[Axes] = [()] * a.ndim
    b_dims: list[Axes] = [()] * b.ndim
    out: list[Axes] = []
    for j in range(batch):  # batch dims, aligned from the right; a size-1 dim broadcasts whole
        ia, ib = j - (batch - (a.ndim - 2)), j - (batch - (b.ndim - 2))
        extent = max(a.shape[ia] if ia >= 0 else 1, b.shape[ib] if ib >= 0 else 1)
        wide = [(x, i, dims) for x, i, dims in ((a, ia, a_dims), (b, ib, b_dims)) if i >= 0 and x.shape[i] == extent]
        axes = next((found for x, i, _ in wide if (found := divides(size, axes_of(x, i), extent))), ())
        axes = free(axes) if extent > 1 else ()
        for _, i, dims in wide:
            dims[i] = axes
        out.append(axes)
    a_dims[-2] = free(divides(size, axes_of(a, a.ndim - 2), a.shape[-2]))
    b_dims[-1] = free(divides(size, axes_of(b, b.ndim - 1), b.shape[-1]))
    k = b.shape[-2]
    contract = free(divides(size, axes_of(a, a.ndim - 1), k) or divides(size, axes_of(b, b.ndim - 2), k))
    a_dims[-1] = b_dims[-2] = contract
    return ShardPlan((spec(*a_dims), spec(*b_dims)), spec(*out, a_dims[-2], b_dims[-1]),
                     _contracted(contract) if contract else None)


def _contracted(contract: Axes) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        out_dtype = np.dtype(static["preferred_element_type"])
        extra = {} if out_dtype == np.float32 else {"preferred_element_type": np.dtype(np.float32)}

        def local(a: jax.Array, b: jax.Array) -> jax.Array:
            partial: jax.Array = call(a, b, **extra)
            total: jax.Array = jax.lax.psum(partial, contract)
            return total.astype(out_dtype)

        return local

    return body
