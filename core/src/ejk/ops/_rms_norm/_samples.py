"""Sample calls of ``rms_norm`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """bfloat16 activations ``[batch, seq, D]`` and a float32 matrix with a width that is not a power of two."""
    return [
        ((jax.ShapeDtypeStruct((2, 64, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256,), jnp.bfloat16)), {}),
        ((jax.ShapeDtypeStruct((16, 96), jnp.float32), jax.ShapeDtypeStruct((96,), jnp.float32)), {"eps": 1e-5}),
    ]
