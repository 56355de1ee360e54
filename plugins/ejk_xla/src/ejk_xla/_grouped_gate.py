"""``grouped_matmul(..., activation=...)`` composed: the plain product by whichever implementation
``platform="auto"`` runs for it, then the activation in XLA.

Fusing the activation saves a pass over the ``[m, 2n]`` product, but only a kernel that takes
``activation`` can fuse it. Where the fastest plain kernel for a shape does not (ejk-pallas's Mosaic
GPU kernel, first on the Hopper packs for large experts), running it and gating afterwards can beat
the fastest fused one; this implementation is that choice, ranked by measurement like any other. The
product is rounded to the output dtype before the activation (as composing the two calls by hand);
gradients flow through the plain call's own backward.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ejk.plugin import gated_output

__all__ = ["capability", "grouped_matmul_then_gate"]


def grouped_matmul_then_gate(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, precision: Any,
                             preferred_element_type: Any, activation: str | None = None, cfg: Any = None) -> jax.Array:
    """``gated_output(grouped_matmul(lhs, rhs, group_sizes), activation)``, the product by ``platform="auto"``."""
    import ejk

    del cfg  # no config of its own: the plain call chooses (and tunes) its implementation
    z = ejk.grouped_matmul(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type)
    return gated_output(z.astype(jnp.float32), activation).astype(z.dtype)


def capability(lhs: Any, rhs: Any, group_sizes: Any, *, activation: str | None = None, **_: Any) -> str | None:
    """Gated calls only: a plain call is the plain implementations' (and would call itself)."""
    return None if activation is not None else "runs calls with an activation only"
