"""``ejk.gla_step``: one token of gated linear attention, state in and out (decoding)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejk.ops._check_common import as_array
from ejk.ops._gla._check import check_gla_step_args
from ejk.ops._gla._reference import gla_token

__all__ = ["gla_step"]


def gla_step(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    state: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One decoding step of :func:`ejk.gla`: a token per batch row, the state in and out.

    ``S' = diag(exp(g)) S + k vᵀ`` and ``o = scale · S'ᵀ q``: what ``gla(q[:, None], …, initial_state=state,
    output_final_state=True)`` computes, as one fused XLA expression (no chunking, one dispatch when eager),
    meant for generation inside a jitted decode loop. Differentiable.

    Args:
        q: ``[B, H, K]``.
        k: ``[B, H, K]``.
        v: ``[B, H, V]``.
        g: ``[B, H, K]`` log forget gates.
        state: ``[B, H, K, V]``, any floating dtype (computed in float32).
        scale: ``None`` means ``K ** -0.5``.

    Returns:
        ``(o [B, H, V] in q.dtype, new_state [B, H, K, V] float32)``.
    """
    names = ("q", "k", "v", "g", "state")
    q, k, v, g, state = (as_array("gla_step", n, x) for n, x in zip(names, (q, k, v, g, state), strict=True))
    return _step(q, k, v, g, state, scale=check_gla_step_args(q, k, v, g, state, scale))  # type: ignore[no-any-return]


@functools.partial(jax.jit, static_argnames=("scale",))
def _step(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, state: jax.Array, *,
          scale: float) -> tuple[jax.Array, jax.Array]:
    f32 = jnp.float32
    new_state, o = gla_token(state.astype(f32), q.astype(f32), k.astype(f32), v.astype(f32), g.astype(f32), scale)
    return o.astype(q.dtype), new_state
