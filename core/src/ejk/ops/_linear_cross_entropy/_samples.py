"""Sample calls of ``linear_cross_entropy`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every
implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """A bfloat16 call whose vocabulary is not a multiple of 128, and a float32 one with every option."""
    return [
        ((jax.ShapeDtypeStruct((64, 128), jnp.bfloat16), jax.ShapeDtypeStruct((128, 1000), jnp.bfloat16),
          jax.ShapeDtypeStruct((64,), jnp.int32)), {}),
        ((jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((32, 100), jnp.float32),
          jax.ShapeDtypeStruct((16,), jnp.int32)),
         {"reduction": "none", "label_smoothing": 0.1, "z_loss": 1e-4, "logit_soft_cap": 30.0}),
    ]
