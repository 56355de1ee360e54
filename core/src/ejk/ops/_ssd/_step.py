"""``ejk.ssd_step``: one token of the Mamba-2 state-space dual, state in and out (decoding)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejk.ops._check_common import as_array
from ejk.ops._ssd._check import check_ssd_step_args
from ejk.ops._ssd._reference import ssd_dt, ssd_token

__all__ = ["ssd_step"]


def ssd_step(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,  # noqa: N803
    B: jax.Array,  # noqa: N803
    C: jax.Array,  # noqa: N803
    state: jax.Array,
    *,
    D: jax.Array | None = None,  # noqa: N803
    dt_bias: jax.Array | None = None,
    dt_softplus: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """One decoding step of :func:`ejk.ssd`: a token per batch row, the state in and out.

    ``dt ← softplus(dt + dt_bias)`` (as asked), ``S' = exp(dt·A) S + dt x Bᵀ`` and ``y = S' C + D x``: what
    ``ssd(x[:, None], …, initial_state=state, output_final_state=True)`` computes, as one fused XLA expression
    (no chunking, one dispatch when eager), meant for generation inside a jitted decode loop. Differentiable.

    Args:
        x: ``[b, H, P]``.
        dt: ``[b, H]``.
        A: ``[H]``.
        B: ``[b, G, N]`` (head ``h`` reads group ``h // (H // G)``).
        C: ``[b, G, N]``.
        state: ``[b, H, P, N]``, any floating dtype (computed in float32).
        D: ``[H]`` or ``None``.
        dt_bias: ``[H]`` or ``None``.
        dt_softplus: Apply ``softplus`` to ``dt + dt_bias``.

    Returns:
        ``(y [b, H, P] in x.dtype, new_state [b, H, P, N] float32)``.
    """
    names = ("x", "dt", "A", "B", "C", "state")
    x, dt, A, B, C, state = (as_array("ssd_step", n, a)  # noqa: N806
                             for n, a in zip(names, (x, dt, A, B, C, state), strict=True))
    D, dt_bias = (None if a is None else as_array("ssd_step", n, a)  # noqa: N806
                  for n, a in (("D", D), ("dt_bias", dt_bias)))
    check_ssd_step_args(x, dt, A, B, C, state, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus)
    return _step(x, dt, A, B, C, state, D, dt_bias, dt_softplus=dt_softplus)  # type: ignore[no-any-return]


@functools.partial(jax.jit, static_argnames=("dt_softplus",))
def _step(x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, state: jax.Array,
          d: jax.Array | None, dt_bias: jax.Array | None, *, dt_softplus: bool) -> tuple[jax.Array, jax.Array]:
    f32 = jnp.float32
    heads = jnp.arange(x.shape[1]) // (x.shape[1] // b.shape[1])
    step = ssd_dt(dt.astype(f32), None if dt_bias is None else dt_bias.astype(f32), dt_softplus)
    new_state, y = ssd_token(state.astype(f32), x.astype(f32), step, a.astype(f32), b.astype(f32)[:, heads],
                             c.astype(f32)[:, heads])
    if d is not None:
        y = y + d.astype(f32)[:, None] * x.astype(f32)
    return y.astype(x.dtype), new_state
