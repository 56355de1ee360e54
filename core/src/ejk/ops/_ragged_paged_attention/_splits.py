"""Helpers of ``ragged_paged_attention`` kernels: the rows live sequences own, and split-K merging."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["paged_merge_splits", "paged_owned_rows"]


def paged_owned_rows(tokens: int, cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
    """``[tokens]`` bool: the query rows a live sequence owns, ``cu_q_lens[0] <= row < cu_q_lens[num_seqs]``.

    The contract's other rows are zeros; kernels that leave them unwritten mask their output with this
    (``cu_q_lens`` and ``num_seqs`` are clipped into range, so invalid input stays in bounds).
    """
    cu = jnp.clip(cu_q_lens.astype(jnp.int32), 0, tokens)
    live = jnp.clip(jnp.reshape(num_seqs, ()).astype(jnp.int32), 0, cu.shape[0] - 1)
    rows = jnp.arange(tokens, dtype=jnp.int32)
    return (rows >= cu[0]) & (rows < cu[live])


def paged_merge_splits(acc: jax.Array, row_max: jax.Array, row_sum: jax.Array,
                       sinks2: jax.Array | None = None) -> jax.Array:
    """Merge split-K partials of attention over the leading ``Z`` (splits) axis, in float32.

    Args:
        acc: ``[Z, ..., Dv]`` unnormalised outputs (``Σ 2^(s - row_max) · v`` over a split's keys).
        row_max: ``[Z, ...]`` running maxima of the base-2 logits (``-inf`` for a split that saw no key).
        row_sum: ``[Z, ...]`` running sums ``Σ 2^(s - row_max)``.
        sinks2: Base-2 sink logits (``sinks · log2 e``) broadcastable to a row's shape ``[...]``, or
            ``None``: each row that saw a key adds ``2^sink`` to its denominator once.

    Returns:
        ``[..., Dv]``: the normalised output. Rows that saw no key in any split are zeros; a NaN max
        or sum (NaN in the row's query or in a key or value it sees) propagates to the row.
    """
    top = jnp.max(row_max, axis=0)
    seen = top != -jnp.inf
    if sinks2 is not None:
        top = jnp.maximum(top, sinks2)
    top = jnp.where(seen, top, 0.0)
    weight = jnp.exp2(row_max - top)  # 0 for splits that saw nothing
    total = jnp.sum(weight * row_sum, axis=0)
    if sinks2 is not None:
        total = total + jnp.where(seen, jnp.exp2(jnp.where(seen, sinks2 - top, 0.0)), 0.0)
    merged = jnp.sum(weight[..., None] * acc, axis=0)
    empty = total == 0.0
    return jnp.where(empty[..., None], 0.0, merged / jnp.where(empty, 1.0, total)[..., None])
