"""Plain reference for ``matmul`` (float32 math, easy to read): a test oracle, not a kernel.

It takes the op's ``precision`` and ``preferred_element_type`` with the same defaults.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["reference_matmul"]


def reference_matmul(
    a: jax.Array, b: jax.Array, *, precision: Any = "highest", preferred_element_type: Any = None
) -> jax.Array:
    """``jnp.matmul(a, b)`` computed in float32.

    Args:
        a: ``[..., m, k]`` or ``[k]``.
        b: ``[..., k, n]`` or ``[k]`` (batch dimensions broadcast, as in ``jnp.matmul``).
        precision: Of the products, as for ``jax.lax.dot_general``; default ``"highest"``.
        preferred_element_type: Output dtype; ``None`` means ``result_type(a, b)``.

    Returns:
        ``jnp.matmul(a, b)``'s shape in ``preferred_element_type``.
    """
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    out = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=precision)
    return out.astype(out_dtype)
