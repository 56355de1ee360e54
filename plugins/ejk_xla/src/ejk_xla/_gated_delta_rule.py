"""``gated_delta_rule`` in plain XLA: the chunked (WY / UT-transform) algorithm, differentiated by JAX.

Tokens are laid out in chunks of ``C`` (a sequence starts on a chunk boundary; padding tokens have
``k = v = β = g = 0`` and leave the state unchanged). Per chunk and head, with ``G`` the cumulative
log decay inside the chunk, ``Γ_ij = exp(G_i − G_j)`` for ``i ≥ j``:

- ``A = strictly_lower(β_i k_i·k_j Γ_ij)``; ``(I + A) [W | U] = [β e^G k | β v]`` (one unit
  lower-triangular solve): the delta rule's corrections ``u = U − W S`` given the state ``S``
  entering the chunk;
- a scan over chunks carries the float32 state: ``S ← e^{G_C} S + (k e^{G_C − G})ᵀ (U − W S)``,
  reset to the sequence's initial state on its first chunk;
- ``o = scale (e^G q S + lower(q·k Γ) (U − W S))``, all chunks at once.

Everything is float32 with full-precision products. Gradients are JAX's autodiff of this
computation (no custom VJP): the backward keeps one ``[H, K, V]`` state per chunk (``T / C`` of
them) and the chunks' ``[C, C]`` matrices, so memory is ``O(T·H·(K + V + C) + (T / C)·H·K·V)``
(about 2 GB at 32k tokens, H 32, K = V = 128).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import one_of

__all__ = ["GatedDeltaRuleConfig", "chunk_layout", "config_space", "gated_delta_rule", "heuristic_config"]

_HIGHEST = lax.Precision.HIGHEST
_EPS = 1e-6  # use_qk_l2norm: x / sqrt(sum(x ** 2) + 1e-6), as the op specifies


@attrs.frozen(kw_only=True)
class GatedDeltaRuleConfig:
    """Config of the XLA chunked gated delta rule.

    Attributes:
        chunk: Tokens per chunk: the scan runs ``T / chunk`` steps; the per-chunk work is
            ``O(chunk² (K + V))``.
    """

    chunk: int = attrs.field(default=64, validator=one_of(16, 32, 64, 128))


class Layout(NamedTuple):
    """Where tokens sit in the chunked layout ``[chunks, C]``.

    ``slot`` (``[tokens]``, a token's position in the flat chunked layout) and ``src`` (``[chunks·C]``,
    the token of each slot, ``-1`` for padding) are ``None`` for the batch layout, which pads ``T``
    at the end of each row.
    """

    chunks: int
    seq: jax.Array  # [chunks] the sequence of each chunk
    first: jax.Array  # [chunks] whether a chunk starts its sequence
    last: jax.Array  # [N] each sequence's last chunk, -1 for an empty one
    slot: jax.Array | None
    src: jax.Array | None


def chunk_layout(batch: int, length: int, cu_seqlens: jax.Array | None, chunk: int) -> Layout:
    """The chunked layout of ``batch`` rows of ``length`` tokens, or of the packed sequences ``cu_seqlens``."""
    if cu_seqlens is None:
        per = -(-length // chunk)
        c = jnp.arange(batch * per, dtype=jnp.int32)
        last = jnp.arange(batch, dtype=jnp.int32) * per + per - 1 if per else jnp.full((batch,), -1, jnp.int32)
        return Layout(batch * per, c // max(per, 1), c % max(per, 1) == 0, last, None, None)
    cu = cu_seqlens.astype(jnp.int32)
    sequences = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    counts = (lens + chunk - 1) // chunk
    cum = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    chunks = -(-length // chunk) + sequences
    c = jnp.arange(chunks, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cum[1:], c, side="right"), 0, max(sequences - 1, 0)).astype(jnp.int32)
    first = (c == cum[seq]) & (c < cum[-1])
    pos = jnp.arange(chunks * chunk, dtype=jnp.int32)
    pseq = seq[pos // chunk]
    offset = (pos // chunk - cum[pseq]) * chunk + pos % chunk
    valid = (pos // chunk < cum[-1]) & (offset < lens[pseq])
    src = jnp.where(valid, cu[pseq] + offset, -1)
    t = jnp.arange(length, dtype=jnp.int32)
    tseq = jnp.clip(jnp.searchsorted(cu[1:], t, side="right"), 0, max(sequences - 1, 0))
    slot = cum[tseq] * chunk + t - cu[tseq]
    last = jnp.where(lens > 0, cum[1:] - 1, -1)
    return Layout(chunks, seq, first, last, slot, src)


def _to_chunks(x: jax.Array, layout: Layout, chunk: int) -> jax.Array:
    """``[B, T, H, ...]`` → ``[chunks, H, C, ...]`` (float32, zeros in padding)."""
    b, t = x.shape[:2]
    rest = x.shape[2:]
    if layout.src is None:
        pad = layout.chunks // max(b, 1) * chunk - t
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * len(rest))
        x = x.reshape(layout.chunks, chunk, *rest)
    else:
        flat = x[0]
        x = jnp.where((layout.src >= 0).reshape(-1, *(1,) * len(rest)), flat[jnp.maximum(layout.src, 0)], 0)
        x = x.reshape(layout.chunks, chunk, *rest)
    return jnp.swapaxes(x, 1, 2).astype(jnp.float32)


def _from_chunks(o: jax.Array, layout: Layout, batch: int, length: int) -> jax.Array:
    """``[chunks, H, C, V]`` → ``[B, T, H, V]``."""
    o = jnp.swapaxes(o, 1, 2)
    o = o.reshape(-1, *o.shape[2:])
    if layout.slot is None:
        return o.reshape(batch, -1, *o.shape[1:])[:, :length]
    return o[layout.slot][None]


def _l2(x: jax.Array) -> jax.Array:
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _EPS)


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.einsum(spec, a, b, precision=_HIGHEST)


def gated_delta_rule(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, initial_state: jax.Array | None = None,
    cu_seqlens: jax.Array | None = None, *, scale: float, use_qk_l2norm: bool,
    cfg: GatedDeltaRuleConfig | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)`` by the chunked algorithm."""
    cfg = cfg or GatedDeltaRuleConfig()
    batch, length, heads, dk = q.shape
    dv = v.shape[-1]
    sequences = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    init = (jnp.zeros((sequences, heads, dk, dv), jnp.float32) if initial_state is None
            else initial_state.astype(jnp.float32))
    if length == 0 or sequences == 0:
        return jnp.zeros(v.shape, q.dtype), init
    c = cfg.chunk
    layout = chunk_layout(batch, length, cu_seqlens, c)
    qc, kc = _to_chunks(q, layout, c), _to_chunks(k, layout, c)
    if use_qk_l2norm:
        qc, kc = _l2(qc), _l2(kc)
    vc = _to_chunks(v, layout, c)
    gc = jnp.cumsum(_to_chunks(g, layout, c), axis=-1)  # [chunks, H, C]
    bc = _to_chunks(beta, layout, c)

    idx = jnp.arange(c)
    diff = gc[..., :, None] - gc[..., None, :]
    gamma = jnp.where(idx[:, None] >= idx[None, :], jnp.exp(jnp.where(idx[:, None] >= idx[None, :], diff, 0.0)), 0.0)
    strict = jnp.where(idx[:, None] > idx[None, :], gamma, 0.0)
    a = bc[..., :, None] * _dot("nhik,nhjk->nhij", kc, kc) * strict
    rhs = jnp.concatenate([(bc * jnp.exp(gc))[..., None] * kc, bc[..., None] * vc], axis=-1)
    eye = jnp.eye(c, dtype=jnp.float32)
    wu = lax.linalg.triangular_solve(a + eye, rhs, left_side=True, lower=True, unit_diagonal=True)
    w, u = wu[..., :dk], wu[..., dk:]
    g_end = gc[..., -1]  # [chunks, H]
    k_dec = kc * jnp.exp(g_end[..., None] - gc)[..., None]

    def step(state: jax.Array, x: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        first, s, w_c, u_c, kd_c, ge_c = x
        state = jnp.where(first, init[s], state)
        new = u_c - _dot("hck,hkv->hcv", w_c, state)
        return jnp.exp(ge_c)[:, None, None] * state + _dot("hck,hcv->hkv", kd_c, new), state

    _, states = lax.scan(step, jnp.zeros_like(init[0]), (layout.first, layout.seq, w, u, k_dec, g_end))
    new = u - _dot("nhck,nhkv->nhcv", w, states)
    attn = _dot("nhik,nhjk->nhij", qc, kc) * gamma
    o = scale * (_dot("nhck,nhkv->nhcv", jnp.exp(gc)[..., None] * qc, states) + _dot("nhij,nhjv->nhiv", attn, new))
    last = jnp.maximum(layout.last, 0)
    final = (jnp.exp(g_end[last])[..., None, None] * states[last]
             + _dot("nhck,nhcv->nhkv", k_dec[last], new[last]))
    final = jnp.where((layout.last >= 0)[:, None, None, None], final, init)
    return _from_chunks(o, layout, batch, length).astype(q.dtype), final


def config_space(q: Any, *_: Any, **__: Any) -> list[GatedDeltaRuleConfig]:
    """Autotuning candidates: chunks of 16 to 128 tokens, the heuristic's first."""
    first = heuristic_config(q)
    return [first, *(GatedDeltaRuleConfig(chunk=s) for s in (16, 32, 64, 128) if s != first.chunk)]


def heuristic_config(q: Any, *_: Any, **__: Any) -> GatedDeltaRuleConfig:
    """Chunks of 64 tokens (32 for sequences of at most 32 tokens)."""
    return GatedDeltaRuleConfig(chunk=32 if int(q.shape[1]) <= 32 else 64)
