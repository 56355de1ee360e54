"""A plain, materialised reference for ``flash_attention`` (the semantics every kernel must match).

Everything is computed in float32 (float64 for float64 inputs, under ``jax_enable_x64``) on the
full ``[B, Hq, Sq, Sk]`` logits, at full precision whatever ``precision`` says, so this is only
for tests and small inputs. See ``docs/KERNEL_CONTRACT.md`` (section ``flash_attention``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["attention_mask", "normalize_window", "reference_flash_attention", "reference_flash_attention_lse"]


def normalize_window(
    sliding_window: int | tuple[int, int] | None, *, causal: bool
) -> tuple[int, int] | None:
    """Turns a user-level ``sliding_window`` into ``(left, right)`` (or ``None``).

    Args:
        sliding_window: ``None``, an int ``w`` meaning ``(w, w)``, or a ``(left, right)`` pair.
        causal: With causal attention the right side is 0.

    Returns:
        ``(left, right)`` or ``None`` when there is no window.
    """
    if sliding_window is None:
        return None
    if isinstance(sliding_window, int):
        left, right = sliding_window, sliding_window
    else:
        left, right = (int(x) for x in sliding_window)
    return (int(left), 0 if causal else int(right))


def attention_mask(
    q_len: int,
    kv_len: int,
    *,
    causal: bool = False,
    sliding_window: tuple[int, int] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """The boolean visibility mask of the contract, bottom-right aligned.

    Query ``i`` sits at position ``i + kv_len - q_len``.

    Args:
        q_len: Number of queries ``Sq``.
        kv_len: Number of keys ``Sk``.
        causal: Key ``j`` visible iff ``j <= i + Sk - Sq``.
        sliding_window: Normalised ``(left, right)``: visible iff
            ``-left <= j - (i + Sk - Sq) <= right``.
        q_segment_ids: ``[B, Sq]`` ints (with ``kv_segment_ids``): visible iff ids are equal.
        kv_segment_ids: ``[B, Sk]`` ints.

    Returns:
        A bool array of shape ``[B, 1, Sq, Sk]`` (``B`` is 1 without segment ids).
    """
    pos = jnp.arange(q_len)[:, None] + (kv_len - q_len)
    rel = jnp.arange(kv_len)[None, :] - pos  # j - (i + Sk - Sq)
    mask = jnp.ones((q_len, kv_len), dtype=bool)
    if causal:
        mask &= rel <= 0
    if sliding_window is not None:
        left, right = sliding_window
        mask &= (rel >= -left) & (rel <= right)
    mask = mask[None, None]
    if q_segment_ids is not None and kv_segment_ids is not None:
        same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
        mask = mask & same[:, None]
    return mask


def _compute_dtype(q: jax.Array) -> jnp.dtype:
    """float32, or float64 for float64 inputs (the references' float64 checks)."""
    return jnp.promote_types(q.dtype, jnp.float32)


def _logits(
    q: jax.Array,
    k: jax.Array,
    *,
    softmax_scale: float,
    logits_soft_cap: float | None,
    bias: jax.Array | None,
) -> jax.Array:
    """``scale · q kᵀ``, soft-capped, plus bias: float32 (or float64) ``[B, Hq, Sq, Sk]``."""
    dtype = _compute_dtype(q)
    groups = q.shape[2] // k.shape[2]
    k_full = jnp.repeat(k, groups, axis=2)  # q head h uses kv head h // groups
    logits = jnp.einsum(
        "bqhd,bkhd->bhqk",
        q.astype(dtype),
        k_full.astype(dtype),
        precision=jax.lax.Precision.HIGHEST,
    )
    logits = logits * softmax_scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
    if bias is not None:
        logits = logits + bias.astype(dtype)
    return logits


def _sink_logits(sinks: jax.Array | None, dtype: jnp.dtype) -> jax.Array | None:
    """``sinks [Hq]`` as ``[1, Hq, 1, 1]`` in the compute dtype (at least float32)."""
    if sinks is None:
        return None
    return sinks.astype(dtype)[None, :, None, None]


def _masked_softmax(logits: jax.Array, mask: jax.Array, sinks: jax.Array | None = None) -> jax.Array:
    """Softmax over the last axis that gives zeros (and zero gradients) for rows that see nothing;
    ``sinks`` (``[1, Hq, 1, 1]``) add ``e^sink`` to the denominator of the rows that see a key.

    The double ``where`` keeps ``-inf`` and ``0/0`` out of both the forward and the backward
    pass: masked entries never reach ``exp`` and an empty row divides by 1, not 0. A row
    whose every visible logit is ``-inf`` (from the bias) counts as empty too.
    """
    masked = jnp.where(mask, logits, -jnp.inf)
    row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
    seen = jnp.isfinite(row_max)
    if sinks is not None:
        row_max = jnp.maximum(row_max, jax.lax.stop_gradient(sinks))
    safe_max = jnp.where(seen, row_max, 0.0)
    safe_logits = jnp.where(mask, logits, safe_max)
    weights = jnp.where(mask, jnp.exp(safe_logits - safe_max), 0.0)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.where(seen, jnp.exp(jnp.where(seen, sinks - safe_max, 0.0)), 0.0)
    safe_denom = jnp.where(denom > 0, denom, 1.0)
    return weights / safe_denom


def reference_flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    bias: jax.Array | None = None,
    sinks: jax.Array | None = None,
    precision: object = None,
) -> jax.Array:
    """Softmax attention with materialised float32 logits (user-level arguments).

    Args:
        q: ``[B, Sq, Hq, D]``.
        k: ``[B, Sk, Hkv, D]`` with ``Hq % Hkv == 0``; q head ``h`` uses kv head ``h // (Hq // Hkv)``.
        v: ``[B, Sk, Hkv, Dv]``.
        causal: Key ``j`` visible to query ``i`` iff ``j <= i + Sk - Sq``.
        softmax_scale: Logit scale; ``None`` means ``1 / sqrt(D)``.
        sliding_window: ``w`` for ``(w, w)`` or ``(left, right)``; with ``causal`` the right
            side is 0.
        logits_soft_cap: ``cap · tanh(logits / cap)`` before the bias.
        q_segment_ids: ``[B, Sq]`` ints; queries see only keys with an equal id.
        kv_segment_ids: ``[B, Sk]`` ints.
        bias: Broadcastable to ``[B, Hq, Sq, Sk]``; added after the soft cap.
        sinks: ``[Hq]``: one extra logit per head in each row's denominator (not capped, not biased).
        precision: Ignored: the reference always computes at full precision.

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del precision
    batch, q_len, q_heads, head_dim = q.shape
    kv_len, kv_heads, v_dim = k.shape[1], k.shape[2], v.shape[3]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if kv_len == 0 or q_len == 0:
        return jnp.zeros((batch, q_len, q_heads, v_dim), q.dtype)
    window = normalize_window(sliding_window, causal=causal)
    if window is not None:  # as the op's validation does: a window past the sequence is the whole sequence
        window = (min(window[0], kv_len - 1), min(window[1], q_len - 1))
    logits = _logits(q, k, softmax_scale=softmax_scale, logits_soft_cap=logits_soft_cap, bias=bias)
    mask = attention_mask(
        q_len,
        kv_len,
        causal=causal,
        sliding_window=window,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
    probs = _masked_softmax(logits, mask, _sink_logits(sinks, logits.dtype))
    v_full = jnp.repeat(v, q_heads // kv_heads, axis=2).astype(logits.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v_full, precision=jax.lax.Precision.HIGHEST)
    return out.astype(q.dtype)


def reference_flash_attention_lse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    bias: jax.Array | None = None,
    sinks: jax.Array | None = None,
    precision: object = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`reference_flash_attention` and the float32 log-sum-exp ``[B, Hq, Sq]`` of each row's
    visible logits (``-inf`` for rows that see no key), as ``ejk.flash_attention_lse`` returns; with
    ``sinks``, of the full denominator ``Σ_visible e^logit + e^sink`` (rows that see no key: ``-inf``)."""
    batch, q_len, q_heads, head_dim = q.shape
    kv_len = k.shape[1]
    out = reference_flash_attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
        sinks=sinks,
    )
    lse_dtype = _compute_dtype(q)
    if kv_len == 0 or q_len == 0:
        return out, jnp.full((batch, q_heads, q_len), -jnp.inf, lse_dtype)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    window = normalize_window(sliding_window, causal=causal)
    if window is not None:
        window = (min(window[0], kv_len - 1), min(window[1], q_len - 1))
    logits = _logits(q, k, softmax_scale=scale, logits_soft_cap=logits_soft_cap, bias=bias)
    mask = attention_mask(q_len, kv_len, causal=causal, sliding_window=window,
                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    mask = jnp.broadcast_to(mask, logits.shape) & (logits > -jnp.inf)
    # Double ``where`` as in the softmax: empty rows give -inf with zero (never NaN) gradients.
    row_max = jax.lax.stop_gradient(jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True))
    safe_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.where(mask, jnp.exp(jnp.where(mask, logits, safe_max) - safe_max), 0.0)
    total = jnp.sum(weights, axis=-1)
    seen = total > 0
    lse = jnp.where(seen, jnp.log(jnp.where(seen, total, 1.0)) + safe_max[..., 0], -jnp.inf)
    sink = _sink_logits(sinks, logits.dtype)
    if sink is not None:  # log(e^lse + e^sink) on the rows that see a key
        lse = jnp.where(seen, jnp.logaddexp(jnp.where(seen, lse, 0.0), sink[..., 0]), -jnp.inf)
    return out, lse
