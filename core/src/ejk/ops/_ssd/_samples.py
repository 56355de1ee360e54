"""Sample calls of ``ssd`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """A bfloat16 batch with every option, and three packed sequences with initial states."""
    def args(b: int, t: int) -> tuple[Any, ...]:
        f32 = jnp.float32
        groups = jax.ShapeDtypeStruct((b, t, 2, 16), jnp.bfloat16)
        return (jax.ShapeDtypeStruct((b, t, 4, 32), jnp.bfloat16), jax.ShapeDtypeStruct((b, t, 4), f32),
                jax.ShapeDtypeStruct((4,), f32), groups, groups)

    head = jax.ShapeDtypeStruct((4,), jnp.float32)
    options = {"D": head, "dt_bias": head, "dt_softplus": True}
    packed = {"cu_seqlens": np.asarray([0, 40, 40, 100], np.int32),
              "initial_state": jax.ShapeDtypeStruct((3, 4, 32, 16), jnp.float32)}
    return [(args(2, 64), options), (args(1, 100), packed)]
