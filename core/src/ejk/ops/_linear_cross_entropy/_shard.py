"""``linear_cross_entropy`` per shard: tokens, and the vocabulary (vocabulary-parallel ``w``).

The implementations return per-token statistics ``(lse, z_label, z_sum)`` of the logits; the loss
is built from them after the sharded call, so splitting only has to combine statistics:

- **tokens** (``x`` dim 0, ``labels`` alike): each shard computes its tokens' statistics; no
  communication (the loss's reduction then sums over the token-sharded vectors as XLA partitions it).
- **vocabulary** (``w`` dim 1, vocabulary parallelism as in Megatron's output layer): a shard holds
  ``V / d`` consecutive columns. It runs the op on them with its labels shifted by its first
  column (a label in another shard falls outside ``[0, V / d)``, whose ``z_label`` is 0 by the
  contract), then ``lse = log Σ exp(lse_shard)`` (a ``pmax`` and a ``psum`` of ``[T]``),
  ``z_label`` and ``z_sum`` by ``psum``. Only ``3·T`` floats move; nothing of size ``T·V`` or
  ``H·V`` does. Gradients follow through the collectives: each shard's backward gets its share
  ``exp(lse_shard − lse)`` of the log-sum-exp's cotangent, and ``dx`` is summed over the shards
  by the transpose of the replicated ``x``. That share differs per token, so each shard's call is
  told ``reduction="none"`` (the loss options are advisory, see ``_op``): an implementation that
  would assume the cotangent of a mean or a sum (ejk-xla's ``grad_in_forward``) refuses it, and
  ``platform="auto"`` takes one that does not.

A split hidden dim (``x`` dim 1 / ``w`` dim 0) is gathered first: partial logits cannot go through
the log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ejk.ops._shard_plan import Axes, AxesOf, Call, ShardPlan, Size, divides, spec

__all__ = ["combine_vocab_shards", "linear_cross_entropy_rule"]


def linear_cross_entropy_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    x, w, _ = arrays
    (t, _), (_, v) = x.shape, w.shape
    vocab = divides(size, axes_of(w, 1), v)
    tokens = divides(size, axes_of(x, 0), t)
    if set(tokens) & set(vocab):
        tokens = ()
    vector = spec(tokens)
    plan_specs = (spec(tokens, None), spec(None, vocab), vector)
    if not vocab:
        return ShardPlan(plan_specs, (vector, vector, vector))
    return ShardPlan(plan_specs, (vector, vector, vector), _vocab_body(vocab))


def combine_vocab_shards(lse: jax.Array, z_label: jax.Array, z_sum: jax.Array,
                         axes: Axes) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The statistics of the whole vocabulary from each shard's (inside ``shard_map`` over ``axes``)."""
    top = jax.lax.pmax(jax.lax.stop_gradient(lse), axes)  # a shift only: no gradient
    total = top + jnp.log(jax.lax.psum(jnp.exp(lse - top), axes))
    return total, jax.lax.psum(z_label, axes), jax.lax.psum(z_sum, axes)


def _vocab_body(vocab: Axes) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        del static

        def local(x: jax.Array, w: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
            first = jax.lax.axis_index(vocab) * w.shape[1]
            shifted = labels - first.astype(labels.dtype)
            # Labels whose shift would wrap (never a real class of this shard) stay out of range.
            shifted = jnp.where((labels >= first) & (labels < first + w.shape[1]), shifted, -1)
            lse, z_label, z_sum = call(x, w, shifted, reduction="none")  # a per-token cotangent (above)
            return combine_vocab_shards(lse, z_label, z_sum, vocab)

        return local

    return body
