"""Sample calls of ``flash_attention_varlen`` (``ejk doctor`` and ``ejk.testing.check_plugin`` run every
implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Three bfloat16 sequences (one empty) with a padding tail; causal grouped-query attention with a window."""
    cu = np.asarray([0, 40, 40, 100], np.int32)
    q = jax.ShapeDtypeStruct((128, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((128, 2, 64), jnp.bfloat16)
    return [((q, kv, kv, cu, cu), {}), ((q, kv, kv, cu, cu), {"causal": True, "sliding_window": 32})]
