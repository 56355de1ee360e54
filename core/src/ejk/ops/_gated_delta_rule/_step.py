"""``ejk.gated_delta_rule_step``: one token of the gated delta rule, state in and out (decoding)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejk.ops._check_common import as_array
from ejk.ops._gated_delta_rule._check import check_flag, check_step_args
from ejk.ops._gated_delta_rule._reference import delta_step, l2_normalize

__all__ = ["gated_delta_rule_step"]


def gated_delta_rule_step(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    state: jax.Array,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """One decoding step of :func:`ejk.gated_delta_rule`: a token per batch row, the state in and out.

    ``gated_delta_rule(q[:, None], …, initial_state=state, output_final_state=True)`` computes the
    same, but this is one fused XLA expression (no chunking, no dispatch), meant for generation
    inside a jitted decode loop. Differentiable.

    Args:
        q: ``[B, H, K]``.
        k: ``[B, H, K]``.
        v: ``[B, H, V]``.
        g: ``[B, H]`` log decay.
        beta: ``[B, H]``.
        state: ``[B, H, K, V]``, any floating dtype (computed in float32).
        scale: ``None`` means ``K ** -0.5``.
        use_qk_l2norm: Normalise ``q`` and ``k`` over ``K`` first.

    Returns:
        ``(o [B, H, V] in q.dtype, new_state [B, H, K, V] float32)``.
    """
    op = "gated_delta_rule_step"
    q, k, v, g, beta, state = (as_array(op, n, x) for n, x in
                               zip(("q", "k", "v", "g", "beta", "state"), (q, k, v, g, beta, state), strict=True))
    resolved = check_step_args(q, k, v, g, beta, state, scale)
    return _step(q, k, v, g, beta, state, scale=resolved,  # type: ignore[no-any-return]
                 use_qk_l2norm=check_flag(op, "use_qk_l2norm", use_qk_l2norm))


@functools.partial(jax.jit, static_argnames=("scale", "use_qk_l2norm"))
def _step(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, state: jax.Array, *,
          scale: float, use_qk_l2norm: bool) -> tuple[jax.Array, jax.Array]:
    """The step as one jitted function: an eager call is one dispatch, not one per operation."""
    out_dtype = q.dtype
    if use_qk_l2norm:
        q, k = l2_normalize(q.astype(jnp.float32)), l2_normalize(k.astype(jnp.float32))
    o, new_state = delta_step(state.astype(jnp.float32), q, k, v, g, beta, scale)
    return o.astype(out_dtype), new_state
