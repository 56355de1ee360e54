"""Sample calls of ``flash_attention`` and ``flash_attention_lse`` (``ejk doctor`` and
``ejk.testing.check_plugin`` run every implementation on them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["samples"]


def samples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Plain bfloat16 attention, and causal grouped-query attention with a sliding window."""
    def qkv(sq: int, sk: int, hq: int, hkv: int) -> tuple[Any, ...]:
        kv = jax.ShapeDtypeStruct((1, sk, hkv, 64), jnp.bfloat16)
        return jax.ShapeDtypeStruct((1, sq, hq, 64), jnp.bfloat16), kv, kv

    return [(qkv(128, 128, 4, 4), {}), (qkv(128, 128, 4, 2), {"causal": True, "sliding_window": 32})]
