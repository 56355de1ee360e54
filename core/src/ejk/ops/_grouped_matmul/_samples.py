"""Sample calls of ``grouped_matmul`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every
implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Two groups of bfloat16 rows."""
    return [((jax.ShapeDtypeStruct((128, 64), jnp.bfloat16), jax.ShapeDtypeStruct((2, 64, 64), jnp.bfloat16),
              jax.ShapeDtypeStruct((2,), jnp.int32)), {})]
