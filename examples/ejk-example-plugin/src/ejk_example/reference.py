"""The plain reference of ``rms_norm`` (float32 math, no tricks): what every implementation must match."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["reference_rms_norm"]


def reference_rms_norm(x: jax.Array, weight: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` in float32, returned in ``x``'s dtype."""
    x32 = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (x32 / rms * weight.astype(jnp.float32)).astype(x.dtype)
