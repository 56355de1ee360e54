"""Plain step-by-step reference of ``gla`` (one token at a time, easy to read): a test oracle, not a kernel.

It computes in float32, or in float64 when given float64 inputs under ``jax_enable_x64`` (the
tests' oracle). :func:`run_recurrence` is the token loop ``ssd``'s reference shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["gla_token", "reference_gla", "run_recurrence"]


def _compute_dtype(*arrays: Any) -> Any:
    return jnp.result_type(jnp.float32, *(x.dtype for x in arrays if x is not None))


def gla_token(state: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
              scale: float) -> tuple[jax.Array, jax.Array]:
    """One token of GLA for every row: ``(S' = diag(exp(g)) S + k vᵀ, scale · S'ᵀ q)``; ``[..., H, K(, V)]``."""
    state = jnp.exp(g)[..., None] * state + k[..., :, None] * v[..., None, :]
    return state, scale * jnp.einsum("...hk,...hkv->...hv", q, state, precision="highest")


def run_recurrence(
    step: Callable[[jax.Array, tuple[jax.Array, ...]], tuple[jax.Array, jax.Array]],
    inputs: tuple[jax.Array, ...],
    initial_state: jax.Array,
    cu_seqlens: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """Run ``step(state, token_inputs) -> (new_state, out)`` over the tokens of every sequence.

    Args:
        step: One token of every batch row: ``state [R, ...]`` and the token's inputs ``[R, ...]``.
        inputs: Arrays ``[R, T, ...]``.
        initial_state: ``[N, ...]``: one per batch row (``N = R``), or per sequence with ``cu_seqlens``.
        cu_seqlens: ``[N+1]`` offsets of the sequences packed in row 0 (``R = 1``), or ``None``.

    Returns:
        ``(outs [R, T, ...], final_states [N, ...])``; a sequence without tokens keeps its initial state.
    """
    rows, tokens = inputs[0].shape[:2]
    t = jnp.arange(tokens)
    if cu_seqlens is None:
        reset = jnp.broadcast_to(t == 0, (rows, tokens))
        seq = jnp.broadcast_to(jnp.arange(rows)[:, None], (rows, tokens))
    else:
        seq = jnp.searchsorted(cu_seqlens[1:], t, side="right")[None]
        reset = (t == cu_seqlens[jnp.minimum(seq[0], cu_seqlens.shape[0] - 1)])[None]

    def body(state: jax.Array, xs: tuple[Any, ...]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        r, s, *token = xs
        start = initial_state[jnp.minimum(s, initial_state.shape[0] - 1)]
        state = jnp.where(r.reshape(r.shape + (1,) * (state.ndim - 1)), start, state)
        state, out = step(state, tuple(token))
        return state, (out, state)

    first = initial_state[:rows] if cu_seqlens is None else jnp.zeros_like(initial_state[:1])
    xs = (reset.T, seq.T, *(jnp.moveaxis(x, 1, 0) for x in inputs))
    _, (outs, states) = jax.lax.scan(body, first, xs)
    outs = jnp.moveaxis(outs, 0, 1)
    if tokens == 0:
        return outs, initial_state
    if cu_seqlens is None:
        return outs, states[-1]
    last = jnp.clip(cu_seqlens[1:] - 1, 0, tokens - 1)
    nonempty = (cu_seqlens[1:] > cu_seqlens[:-1]).reshape((-1,) + (1,) * (initial_state.ndim - 1))
    return outs, jnp.where(nonempty, states[last, 0], initial_state)


def reference_gla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    initial_state: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated linear attention, one token at a time.

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ`` and ``o_t = scale · S_tᵀ q_t`` per head, the state
    starting from ``initial_state`` (zeros when ``None``) at the first token of each sequence.

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` log forget gates.
        initial_state: ``[N, H, K, V]`` or ``None``.
        cu_seqlens: ``[N+1]`` offsets of packed sequences (``B = 1``) or ``None`` (``N = B``).
        scale: Default ``K ** -0.5``.

    Returns:
        ``(o [B, T, H, V] in q.dtype, final_state [N, H, K, V])``, the state in float32 (float64 for
        float64 inputs).
    """
    b, _, h, dk = q.shape
    dv = v.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    dtype = _compute_dtype(q, k, v, g, initial_state)
    states = b if cu_seqlens is None else cu_seqlens.shape[0] - 1
    init = jnp.zeros((states, h, dk, dv), dtype) if initial_state is None else initial_state.astype(dtype)

    def step(state: jax.Array, token: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        qt, kt, vt, gt = token
        return gla_token(state, qt, kt, vt, gt, scale)

    inputs = tuple(x.astype(dtype) for x in (q, k, v, g))
    o, final = run_recurrence(step, inputs, init, cu_seqlens)
    state_dtype = jnp.result_type(jnp.float32, dtype)
    return o.astype(q.dtype), final.astype(state_dtype)
