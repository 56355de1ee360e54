"""Plain reference for ``rms_norm``: float32 math (float64 for float64 inputs), a test oracle, not a kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["reference_rms_norm"]


def reference_rms_norm(x: jax.Array, scale: jax.Array, residual: jax.Array | None = None, *,
                       eps: float = 1e-6) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``x / sqrt(mean(x²) + eps) * scale`` over the last dimension, in ``x.dtype``; with ``residual``,
    ``(rms_norm(h), h)`` of ``h = x + residual`` (rounded to ``x.dtype`` before the normalisation)."""
    if residual is None:
        return _normalise(x, scale, eps)
    h = (x.astype(jnp.promote_types(jnp.float32, x.dtype)) + residual).astype(x.dtype)
    return _normalise(h, scale, eps), h


def _normalise(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    dtype = jnp.promote_types(jnp.float32, jnp.result_type(x, scale))
    x32 = x.astype(dtype)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed * scale.astype(dtype)).astype(x.dtype)
