"""The key interval each packed query row sees, from the offsets (shared by every implementation).

Packed attention reduces to one rule per query row: row ``i`` sees the keys ``[lo[i], hi[i])`` of
the packed key axis (an empty interval when it sees none). Both ``lo`` and ``hi`` are
non-decreasing in ``i``, so a block of rows sees ``[lo[first], hi[last])`` and the rows that see a
block of keys are a contiguous range too (found with ``searchsorted``): kernels skip every block
outside the band without per-sequence bookkeeping.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["sanitize_offsets", "varlen_row_ranges"]

#: Up to this many elements, pairwise compares over the offsets replace scans and searches (one fusion each).
_SMALL = 1 << 24


def sanitize_offsets(cu_seqlens: jax.Array, tokens: int) -> jax.Array:
    """The offsets as every implementation reads them: ``cummax(clip(cu, 0, tokens))`` in int32.

    An offset past the packed length is the packed length, and an offset below its predecessor
    repeats it (that sequence is empty): wrong offsets never read out of bounds.
    """
    cu = jnp.clip(cu_seqlens.astype(jnp.int32), 0, tokens)
    n = cu.shape[0]
    if n * n > _SMALL:
        return jax.lax.cummax(cu, axis=0)
    # Few offsets: the running max as one masked reduction (XLA lowers cummax to a tree of reduce-windows:
    # several launches, for a handful of numbers).
    before = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]
    return jnp.max(jnp.where(before, cu[None, :], 0), axis=1)


def varlen_row_ranges(
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    q_tokens: int,
    k_tokens: int,
    *,
    causal: bool,
    sliding_window: tuple[int, int] | None,
) -> tuple[jax.Array, jax.Array]:
    """``(lo, hi)``, int32 ``[q_tokens]`` each: packed query row ``i`` sees keys ``lo[i] <= j < hi[i]``.

    Args:
        cu_seqlens_q: ``[N+1]`` int offsets of the query sequences (sanitised here as
            :func:`sanitize_offsets` does).
        cu_seqlens_k: ``[N+1]`` int offsets of the key sequences.
        q_tokens: ``Tq``, the packed query length.
        k_tokens: ``Tk``, the packed key length.
        causal: Key ``p`` of a sequence is visible to its query ``r`` iff ``p <= r + Sk - Sq``.
        sliding_window: Normalised ``(left, right)`` or ``None``: visible iff
            ``-left <= p - (r + Sk - Sq) <= right``.

    Returns:
        Non-decreasing ``lo`` and ``hi`` with ``lo <= hi``; rows of no sequence (padding) and rows
        that see no key have ``lo == hi``.
    """
    cu_q = sanitize_offsets(cu_seqlens_q, q_tokens)
    cu_k = sanitize_offsets(cu_seqlens_k, k_tokens)
    rows = jnp.arange(q_tokens, dtype=jnp.int32)
    # The number of offsets <= row, less 1 (-1 before cu_q[0]): for few sequences one compare-and-count
    # reduction, else a fused binary search (jnp.searchsorted's default is an XLA while loop: a launch per level).
    if q_tokens * cu_q.shape[0] <= _SMALL:
        seq = jnp.sum(cu_q[None, :] <= rows[:, None], axis=1, dtype=jnp.int32) - 1
    else:
        seq = jnp.searchsorted(cu_q, rows, side="right", method="scan_unrolled").astype(jnp.int32) - 1
    n = cu_q.shape[0] - 1
    inside = (seq >= 0) & (seq < n)
    s = jnp.clip(seq, 0, max(n - 1, 0))
    q_start, q_end = cu_q[s], cu_q[jnp.minimum(s + 1, n)]
    k_start, k_end = cu_k[s], cu_k[jnp.minimum(s + 1, n)]
    k_len = k_end - k_start
    pos = rows - q_start + (k_len - (q_end - q_start))  # the row's position among its sequence's keys
    lo = k_start
    hi = k_end
    if sliding_window is not None:
        left, right = sliding_window
        lo = k_start + jnp.clip(pos - left, 0, k_len)
        hi = k_start + jnp.clip(pos + right + 1, 0, k_len)
    elif causal:
        hi = k_start + jnp.clip(pos + 1, 0, k_len)
    hi = jnp.maximum(hi, lo)
    # Padding rows: an empty interval that keeps both arrays non-decreasing.
    before = jnp.where(seq < 0, cu_k[0], cu_k[n])
    lo = jnp.where(inside, lo, before)
    hi = jnp.where(inside, hi, before)
    return lo.astype(jnp.int32), hi.astype(jnp.int32)
