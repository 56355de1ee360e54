"""A plain, materialised reference for ``flash_attention_varlen`` (the semantics every kernel must match).

The full ``[Hq, Tq, Tk]`` logits are computed (in float32, or float64 for float64 inputs under
x64) and masked by sequence and position, so this is only for tests and small inputs. The mask
is built from each token's sequence and position, independently of the kernels' row intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ejk.ops._flash_attention_varlen._ranges import sanitize_offsets

__all__ = ["reference_flash_attention_varlen", "reference_output", "reference_varlen_per_sequence", "varlen_mask"]


def _tokens(cu: jax.Array, tokens: int) -> tuple[jax.Array, jax.Array]:
    """Each packed token's sequence (``-1`` for padding) and position inside it."""
    idx = jnp.arange(tokens)
    seq = jnp.searchsorted(cu, idx, side="right") - 1
    n = cu.shape[0] - 1
    inside = (seq >= 0) & (seq < n)
    start = cu[jnp.clip(seq, 0, max(n, 0))]
    return jnp.where(inside, seq, -1), idx - start


def varlen_mask(cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array, q_tokens: int, k_tokens: int, *,
                causal: bool, sliding_window: tuple[int, int] | None) -> jax.Array:
    """The bool ``[Tq, Tk]`` visibility of the contract (offsets read as ``cummax(clip(cu, 0, T))``)."""
    cu_q, cu_k = sanitize_offsets(cu_seqlens_q, q_tokens), sanitize_offsets(cu_seqlens_k, k_tokens)
    q_seq, q_pos = _tokens(cu_q, q_tokens)
    k_seq, k_pos = _tokens(cu_k, k_tokens)
    lens_q, lens_k = jnp.diff(cu_q), jnp.diff(cu_k)
    n = cu_q.shape[0] - 1
    shift = jnp.where(q_seq >= 0, (lens_k - lens_q)[jnp.clip(q_seq, 0, max(n - 1, 0))] if n else 0, 0)
    rel = k_pos[None, :] - (q_pos + shift)[:, None]  # p - (r + Sk_s - Sq_s)
    mask = (q_seq[:, None] == k_seq[None, :]) & (q_seq[:, None] >= 0)
    if causal:
        mask &= rel <= 0
    if sliding_window is not None:
        left, right = sliding_window
        mask &= (rel >= -left) & (rel <= right)
    return mask


def reference_flash_attention_varlen(
    q: jax.Array, k: jax.Array, v: jax.Array, cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array, *,
    causal: bool = False, softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None, logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    precision: Any = None,
) -> jax.Array:
    """Packed attention on materialised logits (user-level or normalised arguments).

    ``max_seqlen_*`` and ``precision`` are accepted and ignored: the products run at full precision.

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del max_seqlen_q, max_seqlen_k, precision
    tq, hq, d = q.shape
    tk, hkv, dv = v.shape
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if isinstance(sliding_window, int):
        sliding_window = (sliding_window, sliding_window)
    if sliding_window is not None and causal:
        sliding_window = (sliding_window[0], 0)
    compute = jnp.promote_types(q.dtype, jnp.float32)
    if tq == 0 or tk == 0:
        return jnp.zeros((tq, hq, dv), q.dtype)
    groups = hq // hkv
    qf, kf, vf = (x.astype(compute) for x in (q, k, v))
    kf, vf = jnp.repeat(kf, groups, axis=1), jnp.repeat(vf, groups, axis=1)
    s = jnp.einsum("qhd,khd->hqk", qf, kf, precision=jax.lax.Precision.HIGHEST) * softmax_scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    mask = varlen_mask(cu_seqlens_q, cu_seqlens_k, tq, tk, causal=causal, sliding_window=sliding_window)[None]
    # Double ``where``: masked logits never reach exp, empty rows divide by 1 (no NaN, zero gradients).
    row_max = jax.lax.stop_gradient(jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1))
    if sinks is not None:
        sink = jnp.broadcast_to(sinks.astype(compute)[:, None], row_max.shape)
        row_max = jnp.maximum(row_max, jax.lax.stop_gradient(sink))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)[..., None]
    weights = jnp.where(mask, jnp.exp(jnp.where(mask, s, row_max) - row_max), 0.0)
    denom = jnp.sum(weights, axis=-1)
    if sinks is not None:
        denom = denom + jnp.exp(sink - row_max[..., 0])
    denom = jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("hqk,khd->qhd", weights / denom[..., None], vf, precision=jax.lax.Precision.HIGHEST)
    return out.astype(q.dtype)


def reference_output(q: jax.Array, k: jax.Array, v: jax.Array, *arrays: Any, **static: Any) -> jax.ShapeDtypeStruct:
    """The abstract output of a call in the implementations' view: ``[Tq, Hq, Dv]`` in ``q``'s dtype."""
    return jax.ShapeDtypeStruct((q.shape[0], q.shape[1], v.shape[2]), q.dtype)


def reference_varlen_per_sequence(
    q: jax.Array, k: jax.Array, v: jax.Array, q_lens: Sequence[int], k_lens: Sequence[int], *,
    causal: bool = False, softmax_scale: float | None = None, sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None, sinks: jax.Array | None = None,
) -> jax.Array:
    """An independent reference for tests: dense attention of each sequence alone (host lengths),
    computed in the inputs' dtype (float64 under ``jax.enable_x64``); rows past the sequences are zeros.

    Differentiable (``jax.vjp``) in q, k, v and sinks.
    """
    tq, hq, d = q.shape
    hkv, dv = v.shape[1], v.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    window = (sliding_window, sliding_window) if isinstance(sliding_window, int) else sliding_window
    pieces, q0, k0 = [], 0, 0
    for sq, sk in zip(q_lens, k_lens, strict=True):
        qs, ks, vs = q[q0:q0 + sq], k[k0:k0 + sk], v[k0:k0 + sk]
        q0, k0 = q0 + sq, k0 + sk
        if sq == 0:
            continue
        if sk == 0:
            pieces.append(jnp.zeros((sq, hq, dv), q.dtype))
            continue
        ks, vs = jnp.repeat(ks, hq // hkv, axis=1), jnp.repeat(vs, hq // hkv, axis=1)
        s = jnp.einsum("qhd,khd->hqk", qs, ks, precision=jax.lax.Precision.HIGHEST) * scale
        if logits_soft_cap is not None:
            s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
        rel = jnp.arange(sk)[None, :] - (jnp.arange(sq)[:, None] + sk - sq)
        mask = jnp.ones((sq, sk), bool)
        if causal:
            mask &= rel <= 0
        if window is not None:
            mask &= (rel >= -window[0]) & (rel <= (0 if causal else window[1]))
        logits = jnp.where(mask, s, -jnp.inf)
        if sinks is not None:
            sink = jnp.broadcast_to(sinks.astype(q.dtype)[:, None, None], (hq, sq, 1))
            logits = jnp.concatenate([logits, sink], axis=-1)
        top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        w = jnp.exp(logits - top)
        total = jnp.sum(w, axis=-1, keepdims=True)
        probs = w / jnp.where(total > 0, total, 1.0)
        pieces.append(jnp.einsum("hqk,khd->qhd", probs[..., :sk], vs, precision=jax.lax.Precision.HIGHEST))
    pieces.append(jnp.zeros((tq - q0, hq, dv), q.dtype))
    return jnp.concatenate(pieces, axis=0).astype(q.dtype)
