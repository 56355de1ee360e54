"""Plain reference for ``linear_cross_entropy``: materialised logits, a test oracle, not a kernel.

It computes in float32, or in float64 for float64 inputs (with ``jax_enable_x64``), so tests
can check the op against a float64 oracle.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["reference_linear_cross_entropy", "reference_statistics"]


def _compute_dtype(*arrays: jax.Array) -> Any:
    return jnp.promote_types(jnp.float32, jnp.result_type(*arrays))


def reference_statistics(x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
                         precision: Any = "highest") -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(lse, z_label, z_sum)`` per token, the implementations' output: ``z_label`` is 0 for a label
    outside ``[0, V)``."""
    dtype = _compute_dtype(x, w)
    z = jnp.matmul(x.astype(dtype), w.astype(dtype), precision=precision)
    if logit_soft_cap is not None:
        z = logit_soft_cap * jnp.tanh(z / logit_soft_cap)
    vocab = w.shape[1]
    inside = (labels >= 0) & (labels < vocab)
    picked = jnp.take_along_axis(z, jnp.clip(labels, 0, vocab - 1)[:, None].astype(jnp.int32), axis=1)[:, 0]
    return jax.nn.logsumexp(z, axis=1), jnp.where(inside, picked, 0.0), jnp.sum(z, axis=1)


def reference_linear_cross_entropy(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, ignore_index: int = -100, reduction: str = "mean",
    label_smoothing: float = 0.0, z_loss: float = 0.0, logit_soft_cap: float | None = None,
    precision: Any = "highest",
) -> jax.Array:
    """``ejk.linear_cross_entropy`` with the ``[T, V]`` logits materialised (log-softmax and a smoothed target)."""
    dtype = _compute_dtype(x, w)
    z = jnp.matmul(x.astype(dtype), w.astype(dtype), precision=precision)
    if logit_soft_cap is not None:
        z = logit_soft_cap * jnp.tanh(z / logit_soft_cap)
    vocab = w.shape[1]
    valid = (labels != ignore_index) & (labels >= 0) & (labels < vocab)
    target = jax.nn.one_hot(jnp.where(valid, labels, 0), vocab, dtype=dtype)
    target = (1.0 - label_smoothing) * target + label_smoothing / vocab
    log_p = jax.nn.log_softmax(z, axis=1)
    lse = jax.nn.logsumexp(z, axis=1)
    per_token = -jnp.sum(target * log_p, axis=1) + z_loss * lse**2
    per_token = jnp.where(valid, per_token, 0.0)
    if reduction == "none":
        return per_token
    if reduction == "sum":
        return jnp.sum(per_token)
    return jnp.sum(per_token) / jnp.maximum(jnp.sum(valid), 1)
