"""Sample calls of ``matmul`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """A square bfloat16 GEMM and a batched float32 one with a vector ``b``."""
    return [
        ((jax.ShapeDtypeStruct((128, 128), jnp.bfloat16), jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)), {}),
        ((jax.ShapeDtypeStruct((2, 16, 32), jnp.float32), jax.ShapeDtypeStruct((32,), jnp.float32)), {}),
    ]
