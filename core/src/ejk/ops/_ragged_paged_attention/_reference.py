"""Plain reference for ``ragged_paged_attention``: one sequence at a time, full logits.

It reads the lengths and page tables as concrete values and does the math in NumPy
float32 (a Python loop over sequences, no compilation per shape), so it cannot run under
``jax.jit``; it is a test oracle, not a kernel.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._flash_attention._reference import normalize_window

__all__ = ["reference_ragged_paged_attention"]

def _sequence_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    scale: float,
    left: int | None,
    cap: float | None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Causal, bottom-right aligned attention of one sequence's queries over its whole context.

    Args:
        q: ``[q_len, Hq, D]`` float32.
        k: ``[kv_len, Hkv, D]`` float32.
        v: ``[kv_len, Hkv, Dv]`` float32.
        scale: Multiplies the logits.
        left: Sliding-window reach to the left, or ``None``.
        cap: Logits soft cap, or ``None``.
        sinks: ``[Hq]`` float32 sink logits (in each seen row's denominator), or ``None``.

    Returns:
        ``[q_len, Hq, Dv]`` float32; rows that see no key are zeros.
    """
    q_len, hq, _ = q.shape
    kv_len, hkv, _ = k.shape
    k = np.repeat(k, hq // hkv, axis=1)  # GQA: q head h reads kv head h // (Hq // Hkv)
    v = np.repeat(v, hq // hkv, axis=1)
    logits = np.float32(scale) * np.einsum("qhd,khd->hqk", q, k)
    if cap is not None:
        logits = np.float32(cap) * np.tanh(logits / np.float32(cap))
    position = np.arange(q_len)[:, None] + (kv_len - q_len)  # of each query
    key = np.arange(kv_len)[None, :]
    visible = key <= position
    if left is not None:
        visible &= key >= position - left
    logits = np.where(visible[None], logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    seen = np.isfinite(row_max)
    if sinks is not None:
        row_max = np.where(seen, np.maximum(row_max, sinks[:, None, None]), row_max)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(logits - safe_max).astype(np.float32)
    total = weights.sum(axis=-1, keepdims=True)
    empty = total == 0  # no visible key; a NaN total (NaN in q or a visible key) propagates
    if sinks is not None:
        total = total + np.where(seen, np.exp(sinks[:, None, None] - safe_max), 0.0).astype(np.float32)
    probs = np.where(empty, 0.0, weights / np.where(empty, 1.0, total)).astype(np.float32)
    out: np.ndarray = np.einsum("hqk,khd->qhd", probs, v)
    return out


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
    sinks: jax.Array | None = None,
    precision: object = None,
) -> jax.Array:
    """Ragged paged attention computed sequence by sequence in float32 (full precision: ``precision``
    is ignored).

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
        sinks: ``[Hq]`` sink logits (concrete), or ``None``.
        precision: Ignored.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows owned by no live sequence, and rows that see
        no key, are zeros.
    """
    tokens, hq, d = q.shape
    page = k_pages.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    window = normalize_window(sliding_window, causal=True)
    left = None if window is None else window[0]
    del precision
    lens, table, cu = (np.asarray(x) for x in (kv_lens, page_indices, cu_q_lens))
    sinks32 = None if sinks is None else np.asarray(jnp.asarray(sinks, jnp.float32))
    q32, k32, v32 = (np.asarray(x).astype(np.float32) for x in (q, k_pages, v_pages))
    out = np.zeros((tokens, hq, v_pages.shape[-1]), np.float32)
    for s in range(int(np.asarray(num_seqs).reshape(()))):
        kv_len, start, stop = int(lens[s]), int(cu[s]), int(cu[s + 1])
        if stop <= start or kv_len == 0:  # no queries, or nothing to see: rows stay zero
            continue
        pages = table[s, : -(-kv_len // page)]
        k = k32[pages].reshape(-1, *k32.shape[2:])[:kv_len]
        v = v32[pages].reshape(-1, *v32.shape[2:])[:kv_len]
        out[start:stop] = _sequence_attention(q32[start:stop], k, v, scale=scale, left=left, cap=logits_soft_cap,
                                                 sinks=sinks32)
    return jnp.asarray(out, q.dtype)


def reference_output(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, *arrays: Any,
                     **static: Any) -> jax.ShapeDtypeStruct:
    """The abstract output of a call in the implementations' view: ``[T, Hq, Dv]`` in ``q``'s dtype
    (the reference runs in NumPy, so ``jax.eval_shape`` cannot trace it)."""
    return jax.ShapeDtypeStruct((*q.shape[:-1], v_pages.shape[-1]), q.dtype)
