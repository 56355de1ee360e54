"""Plain step-by-step reference of ``ssd`` (one token at a time, easy to read): a test oracle, not a kernel.

It computes in float32, or in float64 when given float64 inputs under ``jax_enable_x64``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejk.ops._gla._reference import run_recurrence

__all__ = ["reference_ssd", "ssd_dt", "ssd_token"]


def ssd_dt(dt: jax.Array, dt_bias: jax.Array | None, dt_softplus: bool) -> jax.Array:
    """The step sizes the recurrence uses: ``dt + dt_bias``, then ``softplus`` when asked."""
    if dt_bias is not None:
        dt = dt + dt_bias
    return jax.nn.softplus(dt) if dt_softplus else dt


def ssd_token(state: jax.Array, x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array,
              c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token of the SSD for every row, ``B`` and ``C`` already per head: ``(S' = exp(dt·a) S + dt x bᵀ,
    S' c)`` with ``S [..., H, P, N]``, ``x [..., H, P]``, ``dt [..., H]``, ``a [H]``, ``b, c [..., H, N]``."""
    decay = jnp.exp(dt * a)[..., None, None]
    state = decay * state + (dt[..., None] * x)[..., :, None] * b[..., None, :]
    return state, jnp.einsum("...hpn,...hn->...hp", state, c, precision="highest")


def reference_ssd(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,  # noqa: N803
    B: jax.Array,  # noqa: N803
    C: jax.Array,  # noqa: N803
    D: jax.Array | None = None,  # noqa: N803
    dt_bias: jax.Array | None = None,
    initial_state: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None,
    *,
    dt_softplus: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The Mamba-2 state-space dual, one token at a time (see ``ejk.ssd`` for the recurrence).

    Returns:
        ``(y [b, T, H, P] in x.dtype, final_state [N, H, P, N_state])``, the state in float32
        (float64 for float64 inputs).
    """
    b, _, h, p = x.shape
    groups, n = B.shape[2:]
    dtype = jnp.result_type(jnp.float32, *(a.dtype for a in (x, dt, A, B, C, D, dt_bias, initial_state)
                                           if a is not None))
    states = b if cu_seqlens is None else cu_seqlens.shape[0] - 1
    init = jnp.zeros((states, h, p, n), dtype) if initial_state is None else initial_state.astype(dtype)
    step_size = ssd_dt(dt.astype(dtype), None if dt_bias is None else dt_bias.astype(dtype), dt_softplus)
    heads = jnp.arange(h) // (h // groups)
    a = A.astype(dtype)

    def step(state: jax.Array, token: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        xt, dtt, bt, ct = token  # [r, H, P], [r, H], [r, G, N], [r, G, N]
        return ssd_token(state, xt, dtt, a, bt[:, heads], ct[:, heads])

    inputs = (x.astype(dtype), step_size, B.astype(dtype), C.astype(dtype))
    y, final = run_recurrence(step, inputs, init, cu_seqlens)
    if D is not None:
        y = y + D.astype(dtype)[:, None] * x.astype(dtype)
    return y.astype(x.dtype), final.astype(jnp.result_type(jnp.float32, dtype))
