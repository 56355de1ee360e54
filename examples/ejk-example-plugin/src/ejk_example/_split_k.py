"""A second implementation of the existing ``matmul`` op: split-K (XLA).

The contraction dimension is cut into ``splits`` slices; each slice is one ``dot_general`` with
float32 accumulation and the partial products are summed in float32, then rounded once to the
output dtype. It helps skinny products (a long K, small M and N) where one dot leaves most of the
machine idle. Same contract as every ``matmul`` implementation (docs/KERNEL_CONTRACT.md): resolved
``precision`` pair, ``preferred_element_type`` the output dtype; differentiated by JAX.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import next_pow2, power_of_two

__all__ = ["MAX_SPLITS", "SplitKConfig", "capability", "config_space", "heuristic_config", "matmul"]

MAX_SPLITS = 16


@attrs.frozen(kw_only=True)
class SplitKConfig:
    """Config of the split-K matmul: how many slices of K (a power of two)."""

    splits: int = attrs.field(default=2, validator=power_of_two(1))


def matmul(a: jax.Array, b: jax.Array, *, precision: str | tuple[str, str] = ("highest", "highest"),
           preferred_element_type: Any = None, cfg: SplitKConfig | None = None) -> jax.Array:
    """``a @ b`` (``a`` ``[..., m, k]``, ``b`` ``[..., k, n]``, batch dims broadcast) as a sum over K slices."""
    cfg = cfg or SplitKConfig()
    dtype = jnp.result_type(a, b)
    out_dtype = dtype if preferred_element_type is None else preferred_element_type
    if a.dtype != b.dtype:
        a, b = a.astype(dtype), b.astype(dtype)
    k = a.shape[-1]
    splits = max(1, min(cfg.splits, k))
    bounds = [k * i // splits for i in range(splits + 1)]
    total = None
    for lo, hi in itertools.pairwise(bounds):
        part = jnp.matmul(a[..., lo:hi], b[..., lo:hi, :], precision=precision, preferred_element_type=jnp.float32)
        total = part if total is None else total + part
    if total is None:  # k == 0
        total = jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32)
    return total.astype(out_dtype)


def capability(a: Any, b: Any, **_: Any) -> str | None:
    """Split-K needs matrices: 1-D operands are left to other implementations."""
    if len(a.shape) < 2 or len(b.shape) < 2:
        return "1-D operands are not supported (split-K needs a [..., m, k] @ [..., k, n] product)"
    return None


def config_space(a: Any, b: Any, **_: Any) -> list[SplitKConfig]:
    """Autotuning candidates: 1 to 16 slices, never more slices than K."""
    k = int(a.shape[-1])
    return [SplitKConfig(splits=s) for s in (1, 2, 4, 8, 16) if s <= max(k, 1)]


def heuristic_config(a: Any, b: Any, **_: Any) -> SplitKConfig:
    """Without measuring: about K / max(M, N) slices, a power of two in [1, 16]."""
    m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    ratio = k // max(m, n, 1)
    return SplitKConfig(splits=min(MAX_SPLITS, next_pow2(ratio)) if ratio >= 2 else 1)
