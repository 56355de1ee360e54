"""``jax.vmap`` of a kernel whose arrays all lead with the batch dimension: the mapped axis is
folded into that batch, so the ``pallas_call`` inside runs one bigger batch on its own grid.

Pallas's own batching rule adds a grid dimension instead, which the Mosaic TPU kernels cannot
take: their ``dimension_semantics`` name one entry per grid dimension of the unbatched call (the
TPU interpreter fails with ``safe_zip`` 5 vs 4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["fold_vmap_into_batch"]


def fold_vmap_into_batch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (positional array arguments, or ``None``, and results, each ``[batch, ...]``) whose
    ``jax.vmap`` runs ``fn`` once on ``[mapped * batch, ...]`` (unmapped arguments are broadcast)."""

    @jax.custom_batching.custom_vmap
    def folded(*args: Any) -> Any:
        return fn(*args)

    @folded.def_vmap
    def rule(axis_size: int, in_batched: Any, *args: Any) -> tuple[Any, Any]:
        def merge(x: Any, batched: bool) -> Any:
            x = x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            return x.reshape(axis_size * x.shape[1], *x.shape[2:])

        out = folded(*(jax.tree.map(merge, a, b) for a, b in zip(args, in_batched, strict=True)))
        split = jax.tree.map(lambda y: y.reshape(axis_size, y.shape[0] // axis_size, *y.shape[1:]), out)
        return split, jax.tree.map(lambda _: True, out)

    return functools.wraps(fn)(folded)
