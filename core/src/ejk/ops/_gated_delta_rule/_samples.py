"""Sample calls of ``gated_delta_rule`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every implementation
on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """A bfloat16 batch with float32 gates and an initial state, and three packed sequences."""
    def inputs(b: int, t: int, h: int, dk: int, dv: int) -> tuple[Any, ...]:
        return (jax.ShapeDtypeStruct((b, t, h, dk), jnp.bfloat16), jax.ShapeDtypeStruct((b, t, h, dk), jnp.bfloat16),
                jax.ShapeDtypeStruct((b, t, h, dv), jnp.bfloat16), jax.ShapeDtypeStruct((b, t, h), jnp.float32),
                jax.ShapeDtypeStruct((b, t, h), jnp.bfloat16))

    state = jax.ShapeDtypeStruct((2, 2, 64, 64), jnp.float32)
    cu = jax.ShapeDtypeStruct((4,), jnp.int32)
    return [(inputs(2, 128, 2, 64, 64), {"initial_state": state, "output_final_state": True}),
            (inputs(1, 200, 2, 64, 32), {"cu_seqlens": cu, "use_qk_l2norm": True})]
