"""``jnp.matmul`` shapes on top of a batched product kernel, forward and backward (GPU and TPU share it).

A *product* is ``product(x, y, ta=, tb=, out_dtype=) -> [Z, m, n]`` with ``x`` ``[Z, m, k]``
(``[Z, k, m]`` when ``ta``) and ``y`` ``[Z, k, n]`` (``[Z, n, k]`` when ``tb``): the kernels read
transposed operands in place, so the backward needs no transposed copies.

- 1-D operands become a row (``a``) or a column (``b``), squeezed from the result;
- when ``b`` has no batch (or only size-1 batch dims), ``a``'s batch folds into its rows: one
  2-D product each way, forward and backward;
- otherwise both operands are broadcast to the common batch (a copy only where an operand's
  own batch is broadcast) and the broadcast dims of the gradients are summed in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Product", "Shapes", "matmul_backward", "matmul_forward", "shapes"]

Product = Callable[..., jax.Array]


class Shapes(NamedTuple):
    """The matrix form of a call: ``a`` ``[*a_batch, m, k]`` @ ``b`` ``[*b_batch, k, n]``."""

    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    a_vector: bool
    b_vector: bool

    @property
    def folds(self) -> bool:
        """``b`` has no batch to speak of: ``a``'s batch folds into its rows."""
        return math.prod(self.b_batch) == 1

    @property
    def rows(self) -> int:
        """Rows of the 2-D product when :attr:`folds`, else ``m``."""
        return math.prod(self.a_batch) * self.m if self.folds else self.m

    @property
    def z(self) -> int:
        """Batch of the kernel's product."""
        return 1 if self.folds else math.prod(self.batch)

    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, *(() if self.a_vector else (self.m,)), *(() if self.b_vector else (self.n,)))


def shapes(a: Any, b: Any) -> Shapes:
    """The matrix form of ``jnp.matmul(a, b)`` (abstract arguments suffice)."""
    a_shape = (1, *a.shape) if a.ndim == 1 else tuple(int(n) for n in a.shape)
    b_shape = (*b.shape, 1) if b.ndim == 1 else tuple(int(n) for n in b.shape)
    batch = tuple(int(n) for n in np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    return Shapes(a_shape[:-2], b_shape[:-2], batch, a_shape[-2], a_shape[-1], b_shape[-1], a.ndim == 1, b.ndim == 1)


def _full_batch(x: jax.Array, batch: tuple[int, ...]) -> jax.Array:
    rows, cols = x.shape[-2:]
    if tuple(x.shape[:-2]) != batch:
        x = jnp.broadcast_to(x, (*batch, rows, cols))
    return x.reshape(math.prod(batch), rows, cols)


def _sum_to(x: jax.Array, batch: tuple[int, ...], target: tuple[int, ...], dtype: Any) -> jax.Array:
    """``x`` ``[prod(batch), r, c]`` summed over the batch dims that ``target`` broadcasts."""
    x = x.reshape(*batch, *x.shape[-2:])
    lead = len(batch) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target) if t == 1 and batch[lead + i] != 1)
    return jnp.sum(x, axis=axes).reshape(*target, *x.shape[-2:]).astype(dtype) if axes else x.astype(dtype)


def matmul_forward(product: Product, a: jax.Array, b: jax.Array, out_dtype: Any) -> jax.Array:
    """``jnp.matmul(a, b)`` in ``out_dtype`` through ``product``."""
    s = shapes(a, b)
    a3, b3 = a.reshape(*s.a_batch, s.m, s.k), b.reshape(*s.b_batch, s.k, s.n)
    if s.folds:
        out = product(a3.reshape(1, s.rows, s.k), b3.reshape(1, s.k, s.n), out_dtype=out_dtype)
    else:
        out = product(_full_batch(a3, s.batch), _full_batch(b3, s.batch), out_dtype=out_dtype)
    return out.reshape(s.out_shape())


def matmul_backward(product: Product, a: jax.Array, b: jax.Array, d_out: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)``: ``d c @ bᵀ`` and ``aᵀ @ d c`` (transposes read in place), broadcast batches summed."""
    s = shapes(a, b)
    a3, b3 = a.reshape(*s.a_batch, s.m, s.k), b.reshape(*s.b_batch, s.k, s.n)
    if s.folds:
        dc = d_out.reshape(1, s.rows, s.n)
        a2, b2 = a3.reshape(1, s.rows, s.k), b3.reshape(1, s.k, s.n)
        da = product(dc, b2, tb=True, out_dtype=a.dtype)
        db = product(a2, dc, ta=True, out_dtype=b.dtype)
        return da.reshape(a.shape), db.reshape(b.shape)
    dc = d_out.reshape(s.z, s.m, s.n)
    a_full, b_full = _full_batch(a3, s.batch), _full_batch(b3, s.batch)
    a_sums, b_sums = tuple(s.a_batch) != s.batch, tuple(s.b_batch) != s.batch
    da = product(dc, b_full, tb=True, out_dtype=jnp.float32 if a_sums else a.dtype)
    db = product(a_full, dc, ta=True, out_dtype=jnp.float32 if b_sums else b.dtype)
    return (_sum_to(da, s.batch, s.a_batch, a.dtype).reshape(a.shape),
            _sum_to(db, s.batch, s.b_batch, b.dtype).reshape(b.shape))
