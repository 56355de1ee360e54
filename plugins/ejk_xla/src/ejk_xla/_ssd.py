"""XLA ``ssd``: the Mamba-2 state-space dual by chunks, laid out as the Mamba-2 paper does.

With ``a_t = dt_t·A_h`` the log decay, ``Λ`` its running sum inside a chunk and ``S`` the state
entering the chunk, every chunk of ``C`` tokens computes in parallel:

1. the diagonal block: ``y_i = Σ_{j<=i} (C_i·B_j) e^{Λ_i - Λ_j} dt_j x_j`` (``[C, C]`` per head);
2. the state its tokens add: ``Σ_j e^{Λ_C - Λ_j} dt_j x_j B_jᵀ``;
3. the states between chunks: one associative scan (``_linear_chunks``), restarting at each
   sequence's first chunk from its initial state;
4. the off-diagonal part: ``y_i += e^{Λ_i} S C_i``; then ``+ D_h x_i``.

Every exponent is ``<= 0`` for ``A <= 0``. Heads share their group's ``B`` and ``C``: ``C·B`` is
formed once per group. Products and states are float32. The gradient is JAX's VJP of this forward,
recomputed in the backward pass from the inputs (the residuals, ``SSD_RESIDUALS``, so other
platforms' forwards pair with this backward), for every input.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import SSD_RESIDUALS, positive_int
from ejk_xla._linear_chunks import (
    chunk_layout,
    chunk_size,
    final_states,
    from_chunks,
    operand_vjp_of,
    pass_states,
    to_chunks,
)

__all__ = ["SsdConfig", "config_space", "heuristic_config", "ssd", "vjp"]


@attrs.frozen(kw_only=True)
class SsdConfig:
    """Config of the XLA ``ssd``.

    Attributes:
        chunk: Tokens per chunk (a shorter input uses the smallest power of two holding it).
    """

    chunk: int = attrs.field(default=128, validator=positive_int)


def config_space(**call: Any) -> list[SsdConfig]:
    return [SsdConfig(chunk=c) for c in (32, 64, 128, 256)]


def heuristic_config(**call: Any) -> SsdConfig:
    return SsdConfig()


def ssd(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,  # noqa: N803
        D: jax.Array | None = None, dt_bias: jax.Array | None = None,  # noqa: N803
        initial_state: jax.Array | None = None, cu_seqlens: jax.Array | None = None, *, dt_softplus: bool,
        cfg: SsdConfig | None = None) -> tuple[jax.Array, jax.Array]:
    """``ejk.ssd`` by chunks (see the module docstring); returns ``(y, final_state)``.

    Args:
        x: ``[b, T, H, P]``; dt ``[b, T, H]``; A ``[H]``; B, C ``[b, T, G, N]``; D, dt_bias ``[H]`` or ``None``.
        initial_state: ``[N_seq, H, P, N]`` or ``None`` (zeros).
        cu_seqlens: ``[N_seq+1]`` offsets of packed sequences (``b = 1``) or ``None``.
        dt_softplus: Apply ``softplus`` to ``dt + dt_bias``.
        cfg: :class:`SsdConfig` (``None``: the default).
    """
    cfg = cfg or SsdConfig()
    b, t, h, p = x.shape
    groups, n = B.shape[2:]
    heads = h // groups
    f32 = jnp.float32
    states = b if cu_seqlens is None else cu_seqlens.shape[0] - 1
    init = jnp.zeros((states, h, p, n), f32) if initial_state is None else initial_state.astype(f32)
    if t == 0:
        return jnp.zeros_like(x), init
    step = dt.astype(f32) + (0.0 if dt_bias is None else dt_bias.astype(f32))
    step = jax.nn.softplus(step) if dt_softplus else step
    layout = chunk_layout(b, t, chunk_size(t, cfg.chunk), cu_seqlens)
    size = layout.size
    xc = to_chunks((x.astype(f32) * step[..., None]).reshape(b, t, groups, heads, p), layout)  # [c, r, C, G, E, P]
    log_decay = to_chunks((step * A.astype(f32)).reshape(b, t, groups, heads), layout)  # [c, r, C, G, E]
    bc, cc = to_chunks(B.astype(f32), layout), to_chunks(C.astype(f32), layout)  # [c, r, C, G, N]
    cum = jnp.moveaxis(jnp.cumsum(log_decay, axis=2), 2, -1)  # [c, r, G, E, C]
    causal = jnp.arange(size)[:, None] >= jnp.arange(size)[None, :]
    segment = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))  # [c, r, G, E, i, j]
    scores = jnp.einsum("crigs,crjgs->crgij", cc, bc)
    y = jnp.einsum("crgij,crgeij,crjgep->crigep", scores, segment, xc)
    total = cum[..., -1]
    added = jnp.einsum("crjgs,crgej,crjgep->crgeps", bc, jnp.exp(total[..., None] - cum), xc)
    entering, leaving = pass_states(jnp.exp(total)[..., None, None], added, layout,
                                    init.reshape(states, groups, heads, p, n))
    y = y + jnp.einsum("crigs,crgei,crgeps->crigep", cc, jnp.exp(cum), entering)
    y = from_chunks(y.reshape(*y.shape[:3], h, p), layout, t)
    if D is not None:
        y = y + D.astype(f32)[:, None] * x.astype(f32)
    final = final_states(leaving, layout, init.reshape(states, groups, heads, p, n))
    return y.astype(x.dtype), final.reshape(states, h, p, n)



#: Residuals: the operands (``SSD_RESIDUALS``); the backward recomputes the chunks.
vjp = operand_vjp_of(ssd, ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state", "cu_seqlens"), "cu_seqlens",
                     SSD_RESIDUALS)
