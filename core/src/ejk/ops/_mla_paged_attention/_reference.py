"""Plain reference for ``mla_paged_attention``: one sequence at a time, full logits, in float64.

It reads the lengths and page tables as concrete values and computes in NumPy float64 (no
compilation per shape), so it cannot run under ``jax.jit``; it is a test oracle, not a kernel.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["mla_paged_attention_float64", "reference_mla_paged_attention", "reference_output"]


def _sequence(q: np.ndarray[Any, Any], latent: np.ndarray[Any, Any], *, dv: int, scale: float,
              causal: bool) -> np.ndarray[Any, Any]:
    """``[Sq, Hq, Dv]`` float64: queries ``[Sq, Hq, Dk]`` over one context ``[kv_len, Dk]``.

    Query ``i`` sits at position ``kv_len - Sq + i``; causal, it sees keys ``j`` up to there.
    Rows that see no key are zeros.
    """
    sq = q.shape[0]
    kv_len = latent.shape[0]
    logits = scale * np.einsum("qhd,kd->qhk", q, latent)
    visible = np.ones((sq, kv_len), bool)
    if causal:
        visible = np.arange(kv_len)[None, :] <= (np.arange(sq) + kv_len - sq)[:, None]
    logits = np.where(visible[:, None, :], logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True, initial=-np.inf)
    weights = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))
    total = weights.sum(axis=-1, keepdims=True)
    empty = total == 0  # no visible key; a NaN total (NaN in q or a visible key) propagates
    probs = np.where(empty, 0.0, weights / np.where(empty, 1.0, total))
    out: np.ndarray[Any, Any] = np.einsum("qhk,kd->qhd", probs, latent[:, :dv])
    return out


def mla_paged_attention_float64(
    q: Any,
    kv_pages: Any,
    kv_lens: Any,
    page_indices: Any,
    *,
    v_head_dim: int,
    softmax_scale: float | None = None,
    causal: bool = True,
) -> np.ndarray[Any, Any]:
    """Latent (MLA) paged attention computed sequence by sequence in float64 (a NumPy array).

    Sequence ``b``'s position ``p`` lives in page ``page_indices[b, p // page]`` at slot
    ``p % page``; keys are whole positions ``[Dk]``, values their first ``v_head_dim`` dims.

    Args:
        q: ``[B, Sq, Hq, Dk]``.
        kv_pages: ``[P, page, Dk]``.
        kv_lens: ``[B]`` integers (concrete).
        page_indices: ``[B, pages_per_seq]`` integers (concrete).
        v_head_dim: Value dims.
        softmax_scale: Logit scale; ``None`` means ``1/sqrt(Dk)``.
        causal: Query ``i`` sees keys ``j <= kv_len - Sq + i`` (else every key ``< kv_len``).

    Returns:
        ``[B, Sq, Hq, v_head_dim]`` float64; rows that see no key are zeros.
    """
    batch, sq, hq, dk = q.shape
    page = kv_pages.shape[1]
    scale = 1.0 / math.sqrt(dk) if softmax_scale is None else float(softmax_scale)
    lens, table = np.asarray(kv_lens).astype(np.int64), np.asarray(page_indices).astype(np.int64)
    q64 = np.asarray(jnp.asarray(q, jnp.float32)).astype(np.float64)
    kv64 = np.asarray(jnp.asarray(kv_pages, jnp.float32)).astype(np.float64)
    out = np.zeros((batch, sq, hq, v_head_dim), np.float64)
    for b in range(batch):
        kv_len = int(lens[b])
        if kv_len == 0 or sq == 0:
            continue
        latent = kv64[table[b, : -(-kv_len // page)]].reshape(-1, dk)[:kv_len]
        out[b] = _sequence(q64[b], latent, dv=v_head_dim, scale=scale, causal=causal)
    return out


def reference_mla_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    *,
    v_head_dim: int,
    softmax_scale: float | None = None,
    causal: bool = True,
) -> jax.Array:
    """:func:`mla_paged_attention_float64` rounded to ``q.dtype``: ``[B, Sq, Hq, v_head_dim]``."""
    out = mla_paged_attention_float64(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim,
                                      softmax_scale=softmax_scale, causal=causal)
    return jnp.asarray(out.astype(np.float32), q.dtype)


def reference_output(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *,
                     v_head_dim: int, **static: Any) -> jax.ShapeDtypeStruct:
    """The abstract output of a call in the implementations' view: ``[B, Sq, Hq, v_head_dim]`` in ``q``'s
    dtype (the reference runs in NumPy, so ``jax.eval_shape`` cannot trace it)."""
    return jax.ShapeDtypeStruct((*q.shape[:3], v_head_dim), q.dtype)
