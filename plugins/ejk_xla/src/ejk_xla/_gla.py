"""XLA ``gla``: chunked gated linear attention, differentiated by JAX with per-chunk recomputation.

Per chunk of ``C`` tokens, with ``G`` the running sum of the log gates inside the chunk (``G_i <= 0``
decreasing) and ``S`` the state entering it::

    o_i = scale · ( (q_i ⊙ e^{G_i})ᵀ S  +  Σ_{j<=i} (Σ_k q_ik k_jk e^{G_ik - G_jk}) v_j )
    S'  = e^{G_C} ⊙ S  +  Σ_j (k_j ⊙ e^{G_C - G_j}) v_jᵀ

Every exponent is ``<= 0``: the intra-chunk weights ``e^{G_ik - G_jk}`` (``j <= i``) are formed
exactly, ``[C, C, K]`` per chunk, so no gate is ever divided out (no overflow however small the gates).
The chunks' intra parts run in parallel, a bounded number at a time (``lax.map``), each under
``jax.checkpoint`` so that the backward pass recomputes them instead of storing ``[C, C, K]`` tensors;
the states between chunks come from one associative scan (``_linear_chunks``). Products and states
are float32. The gradient is JAX's VJP of this forward, recomputed in the backward pass from the
inputs (the residuals, ``GLA_RESIDUALS``, so other platforms' forwards pair with this backward), for
every input; the checkpointed chunks keep its memory at the states between chunks.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import GLA_RESIDUALS, positive_int
from ejk_xla._linear_chunks import (
    chunk_layout,
    chunk_size,
    final_states,
    from_chunks,
    operand_vjp_of,
    pass_states,
    to_chunks,
)

__all__ = ["GlaConfig", "config_space", "gla", "heuristic_config", "vjp"]

#: Floats of the ``[C, C, K]`` intra-chunk weights one ``lax.map`` step may hold (256 Mi: 1 GiB).
_INTRA_FLOATS = 1 << 28


@attrs.frozen(kw_only=True)
class GlaConfig:
    """Config of the XLA ``gla``.

    Attributes:
        chunk: Tokens per chunk (a shorter input uses the smallest power of two holding it). Larger
            chunks mean fewer, larger products and a longer exact ``[C, C, K]`` weight per chunk.
    """

    chunk: int = attrs.field(default=64, validator=positive_int)


def config_space(**call: Any) -> list[GlaConfig]:
    return [GlaConfig(chunk=c) for c in (16, 32, 64, 128)]


def heuristic_config(**call: Any) -> GlaConfig:
    return GlaConfig()


def _intra(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One chunk ``[rows, C, H, ·]``: its intra-chunk output, the state its tokens add, its total log decay."""
    cum = jnp.cumsum(g, axis=1)
    size = q.shape[1]
    causal = (jnp.arange(size)[:, None] >= jnp.arange(size)[None, :])[None, :, :, None, None]
    weights = jnp.exp(jnp.where(causal, cum[:, :, None] - cum[:, None, :], -jnp.inf))  # [rows, i, j, H, K]
    scores = jnp.einsum("rihk,rijhk->rhij", q, k[:, None] * weights)
    out = jnp.einsum("rhij,rjhv->rihv", scores, v)
    total = cum[:, -1]
    added = jnp.einsum("rjhk,rjhv->rhkv", k * jnp.exp(total[:, None] - cum), v)
    return out, added, total


def gla(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, initial_state: jax.Array | None = None,
        cu_seqlens: jax.Array | None = None, *, scale: float,
        cfg: GlaConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """``ejk.gla`` by chunks (see the module docstring); returns ``(o, final_state)``.

    Args:
        q, k: ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` log gates.
        initial_state: ``[N, H, K, V]`` or ``None`` (zeros).
        cu_seqlens: ``[N+1]`` offsets of packed sequences (``B = 1``) or ``None``.
        scale: The output scale, resolved.
        cfg: :class:`GlaConfig` (``None``: the default).
    """
    cfg = cfg or GlaConfig()
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    states = b if cu_seqlens is None else cu_seqlens.shape[0] - 1
    init = (jnp.zeros((states, h, dk, dv), jnp.float32) if initial_state is None
            else initial_state.astype(jnp.float32))
    if t == 0:
        return jnp.zeros((b, 0, h, dv), q.dtype), init
    layout = chunk_layout(b, t, chunk_size(t, cfg.chunk), cu_seqlens)
    qc, kc, vc, gc = (to_chunks(x.astype(jnp.float32), layout) for x in (q, k, v, g))
    per_step = max(1, _INTRA_FLOATS // max(1, layout.rows * layout.size ** 2 * h * dk))
    intra_out, added, total = jax.lax.map(jax.checkpoint(lambda xs: _intra(*xs)), (qc, kc, vc, gc),
                                          batch_size=min(per_step, layout.chunks))
    entering, leaving = pass_states(jnp.exp(total)[..., None], added, layout, init)
    inter = jnp.einsum("nrchk,nrhkv->nrchv", qc * jnp.exp(jnp.cumsum(gc, axis=2)), entering)
    o = from_chunks(scale * (inter + intra_out), layout, t)
    return o.astype(q.dtype), final_states(leaving, layout, init)



#: Residuals: the operands (``GLA_RESIDUALS``); the backward recomputes the chunks.
vjp = operand_vjp_of(gla, ("q", "k", "v", "g", "initial_state", "cu_seqlens"), "cu_seqlens", GLA_RESIDUALS)
