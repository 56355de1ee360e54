"""Sample calls of ``gla`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """A bfloat16 batch with float32 gates, and three packed sequences with initial states."""
    def args(b: int, t: int) -> tuple[Any, ...]:
        x = jax.ShapeDtypeStruct((b, t, 2, 32), jnp.bfloat16)
        return x, x, x, jax.ShapeDtypeStruct((b, t, 2, 32), jnp.float32)

    packed = {"cu_seqlens": np.asarray([0, 40, 40, 100], np.int32),
              "initial_state": jax.ShapeDtypeStruct((3, 2, 32, 32), jnp.float32)}
    return [(args(2, 64), {}), (args(1, 100), packed)]
