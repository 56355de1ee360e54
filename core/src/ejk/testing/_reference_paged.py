"""Plain reference for ``ragged_paged_attention``: one sequence at a time, full logits.

It reads the lengths and page tables as concrete values (a Python loop over sequences),
so it cannot run under ``jax.jit``; it is a test oracle, not a kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["reference_ragged_paged_attention"]

_HIGHEST = jax.lax.Precision.HIGHEST


def _window_left(sliding_window: int | Sequence[int] | None) -> int | None:
    """How far back a query sees: ``w`` and ``(w, right)`` give ``w`` (causal: right is 0)."""
    if sliding_window is None:
        return None
    if isinstance(sliding_window, int):
        return sliding_window
    return int(sliding_window[0])


def _sequence_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float,
    left: int | None,
    cap: float | None,
) -> jax.Array:
    """Causal, bottom-right aligned attention of one sequence's queries over its whole context.

    Args:
        q: ``[q_len, Hq, D]``.
        k: ``[kv_len, Hkv, D]``.
        v: ``[kv_len, Hkv, Dv]``.
        scale: Multiplies the logits.
        left: Sliding-window reach to the left, or ``None``.
        cap: Logits soft cap, or ``None``.

    Returns:
        ``[q_len, Hq, Dv]`` float32; rows that see no key are zeros.
    """
    q_len, hq, _ = q.shape
    kv_len, hkv, _ = k.shape
    heads_per_kv = hq // hkv
    k = jnp.repeat(k.astype(jnp.float32), heads_per_kv, axis=1)  # [kv_len, Hq, D]
    v = jnp.repeat(v.astype(jnp.float32), heads_per_kv, axis=1)
    logits = scale * jnp.einsum("qhd,khd->hqk", q.astype(jnp.float32), k, precision=_HIGHEST)
    if cap is not None:
        logits = cap * jnp.tanh(logits / cap)
    position = jnp.arange(q_len)[:, None] + (kv_len - q_len)  # of each query
    key = jnp.arange(kv_len)[None, :]
    visible = key <= position
    if left is not None:
        visible &= key >= position - left
    logits = jnp.where(visible[None], logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probs = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)
    return jnp.einsum("hqk,khd->qhd", probs, v, precision=_HIGHEST)


def reference_ragged_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array | int,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
) -> jax.Array:
    """Ragged paged attention computed sequence by sequence in float32.

    Sequence ``s < num_seqs`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``, the last
    positions of its ``kv_lens[s]`` positions; position ``p`` lives in page
    ``page_indices[s, p // page]`` at slot ``p % page``. Attention is causal; a query at
    position ``i`` sees keys ``j`` with ``i - left <= j <= i`` under a window.

    Args:
        q: ``[T, Hq, D]``.
        k_pages: ``[P, page, Hkv, D]``.
        v_pages: ``[P, page, Hkv, Dv]``.
        kv_lens: ``[S]`` integers (concrete).
        page_indices: ``[S, pages_per_seq]`` integers (concrete).
        cu_q_lens: ``[S+1]`` integers (concrete).
        num_seqs: Number of live sequences (concrete).
        softmax_scale: Logit scale; ``None`` means ``1/sqrt(D)``.
        sliding_window: ``None``, ``w`` or ``(left, right)``; right is ignored (causal).
        logits_soft_cap: ``cap * tanh(logits / cap)`` when given.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows owned by no live sequence, and rows that see
        no key, are zeros.
    """
    tokens, hq, d = q.shape
    page = k_pages.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    left = _window_left(sliding_window)
    lens, table, cu = (np.asarray(x) for x in (kv_lens, page_indices, cu_q_lens))
    out = jnp.zeros((tokens, hq, v_pages.shape[-1]), jnp.float32)
    for s in range(int(np.asarray(num_seqs).reshape(()))):
        kv_len, start, stop = int(lens[s]), int(cu[s]), int(cu[s + 1])
        if stop <= start or kv_len == 0:  # no queries, or nothing to see: rows stay zero
            continue
        pages = table[s, : -(-kv_len // page)]
        k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:kv_len]
        v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:kv_len]
        seq_out = _sequence_attention(q[start:stop], k, v, scale=scale, left=left, cap=logits_soft_cap)
        out = out.at[start:stop].set(seq_out)
    return out.astype(q.dtype)
