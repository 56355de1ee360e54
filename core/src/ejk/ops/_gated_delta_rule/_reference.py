"""Plain step-by-step reference of ``gated_delta_rule`` (one token at a time): a test oracle, not a kernel.

It computes in ``promote_types(q.dtype, float32)``: float32 for the op's inputs, float64 for
float64 inputs under ``jax_enable_x64`` (the tests' oracle).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["L2NORM_EPS", "delta_step", "l2_normalize", "reference_gated_delta_rule"]

#: ``use_qk_l2norm``: ``x / sqrt(sum(x ** 2) + L2NORM_EPS)`` over the last dimension.
L2NORM_EPS = 1e-6
_HIGHEST = jax.lax.Precision.HIGHEST


def l2_normalize(x: jax.Array) -> jax.Array:
    """``x / sqrt(sum(x ** 2, -1) + 1e-6)``, in ``x``'s dtype."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def delta_step(state: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
               scale: float) -> tuple[jax.Array, jax.Array]:
    """One token of the gated delta rule: ``(o, new_state)``, everything in ``state``'s dtype.

    ``q, k [..., K]``, ``v [..., V]``, ``g, beta [...]``, ``state [..., K, V]``:
    ``S ← S·e^g``, ``u = β (v − kᵀS)``, ``S ← S + k uᵀ``, ``o = scale · qᵀS``.
    """
    dt = state.dtype
    q, k, v, g, beta = (x.astype(dt) for x in (q, k, v, g, beta))
    state = state * jnp.exp(g)[..., None, None]
    u = beta[..., None] * (v - jnp.einsum("...k,...kv->...v", k, state, precision=_HIGHEST))
    state = state + k[..., :, None] * u[..., None, :]
    o = scale * jnp.einsum("...k,...kv->...v", q, state, precision=_HIGHEST)
    return o, state


def _packed(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, init: jax.Array,
            cu: jax.Array, scale: float) -> tuple[jax.Array, jax.Array]:
    """``q [T, H, K]`` … holding the sequences ``cu [N + 1]``; ``init [N, H, K, V]``; returns ``(o, finals)``."""
    length, sequences = q.shape[0], init.shape[0]
    if sequences == 0 or length == 0:
        return jnp.zeros((*v.shape[:-1], v.shape[-1]), init.dtype), init
    t = jnp.arange(length, dtype=cu.dtype)
    seq = jnp.clip(jnp.searchsorted(cu[1:], t, side="right"), 0, sequences - 1)
    start, end = t == cu[seq], t == cu[seq + 1] - 1

    def step(carry: tuple[jax.Array, jax.Array], x: tuple[jax.Array, ...]) -> tuple[Any, jax.Array]:
        state, finals = carry
        qt, kt, vt, gt, bt, s, first, last = x
        state = jnp.where(first, init[s], state)
        o, state = delta_step(state, qt, kt, vt, gt, bt, scale)
        finals = finals.at[s].set(jnp.where(last, state, finals[s]))
        return (state, finals), o

    (_, finals), o = jax.lax.scan(step, (jnp.zeros_like(init[0]), init), (q, k, v, g, beta, seq, start, end))
    return o, finals


def reference_gated_delta_rule(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
    initial_state: jax.Array | None = None, cu_seqlens: jax.Array | None = None, *,
    scale: float | None = None, use_qk_l2norm: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule one token at a time: ``(o [B, T, H, V] in q.dtype, final_state)``.

    Args: as for :func:`ejk.gated_delta_rule` (``scale`` ``None`` means ``K ** -0.5``).

    Returns:
        ``o`` and the final states ``[N, H, K, V]`` (``N = B``, or the packed sequences of
        ``cu_seqlens``) in ``promote_types(q.dtype, float32)``.
    """
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    ct, out_dtype = jnp.promote_types(q.dtype, jnp.float32), q.dtype
    scale = dk ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q, k = l2_normalize(q.astype(ct)), l2_normalize(k.astype(ct))
    if cu_seqlens is None:
        init = jnp.zeros((batch, heads, dk, dv), ct) if initial_state is None else initial_state.astype(ct)
        cu = jnp.asarray([0, length], jnp.int32)
        def row(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                init: jax.Array) -> tuple[jax.Array, jax.Array]:
            return _packed(q, k, v, g, beta, init, cu, scale)

        o, finals = jax.vmap(row)(q, k, v, g, beta, init[:, None])
        return o.astype(out_dtype), finals[:, 0]
    sequences = cu_seqlens.shape[0] - 1
    init = jnp.zeros((sequences, heads, dk, dv), ct) if initial_state is None else initial_state.astype(ct)
    o, finals = _packed(q[0], k[0], v[0], g[0], beta[0], init, cu_seqlens.astype(jnp.int32), scale)
    return o[None].astype(out_dtype), finals
