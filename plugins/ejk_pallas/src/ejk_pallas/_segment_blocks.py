"""Which blocks of the attention square the Mosaic GPU kernels visit under segment ids, computed in XLA.

Query row ``i`` sees key ``j`` iff ``q_ids[i] == k_ids[j]`` and the static mask's causal / window bounds hold
with row ``i`` at ``pos[i] = i + off[i]`` on the key axis (``off`` the mask's ``Sk - Sq``, or per row for
packed sequences). From each block's smallest and largest id and position, :func:`block_visibility` tells
which (query block, key block) pairs may hold a visible pair and which are wholly visible; exact for ids
sorted along each row (packed sequences), a superset otherwise (the kernels still mask every block that is
not wholly visible). :func:`block_ranges` turns a row of it into the loop bounds the kernels read at run
time: for each 64-row consumer block the blocks ``lo <= lo_full <= hi_full <= hi`` (``[lo, hi)`` may hold
visible pairs, ``[lo_full, hi_full)`` need no mask) and for each CTA of ``consumers`` such blocks their hull.

Where each row's keys are one range ``[k_lo, k_hi)`` (packed sequences), :func:`visible_bounds` cuts it to the
mask's band and :func:`range_block_ranges` gives the same loop bounds straight from those ranges: one block
reduction instead of the per-block pairs. :func:`key_visible_bounds` is the transpose, each key's visible
queries, for the backward's dK / dV kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from ejk_pallas._flash_attention import _Mask

__all__ = ["PAD_K_ID", "PAD_Q_ID", "block_ranges", "block_visibility", "pad_segments",
           "key_visible_bounds", "range_block_ranges", "visible_bounds"]

#: Ids of padded query rows and padded keys (never equal: padded rows see nothing, padded keys are seen by none).
PAD_Q_ID, PAD_K_ID = -1, -2
#: Sentinel of the per-block extremes (a row or key that takes no part).
_BIG = 2**30


def _pad(x: Any, to: int, value: int) -> Any:
    return jnp.pad(x.astype(jnp.int32), ((0, 0), (0, to - x.shape[1])), constant_values=value)


def pad_segments(segments: tuple[Any, Any, Any], sqp: int, skp: int) -> tuple[Any, Any, Any]:
    """``(q_ids [B, sqp], k_ids [B, skp], q_off [B, sqp] | None)`` int32, padded with :data:`PAD_Q_ID`,
    :data:`PAD_K_ID` and 0."""
    q_ids, k_ids, q_off = segments
    return _pad(q_ids, sqp, PAD_Q_ID), _pad(k_ids, skp, PAD_K_ID), None if q_off is None else _pad(q_off, sqp, 0)


def _block_min(parts: list[Any], block: int) -> list[Any]:
    """The smallest of each of ``parts`` (``[B, L]`` arrays) per block of ``block`` along axis 1, taken in
    one reduction: on a GPU one kernel (these tiny arrays cost their launches, not their bytes)."""
    x = jnp.stack(parts)  # the parts major, the block minor: one row reduction
    out = jnp.min(x.reshape(len(parts), x.shape[1], x.shape[2] // block, block), axis=3)
    return list(out)


def block_visibility(q_ids: Any, k_ids: Any, q_off: Any, mask: _Mask, bq: int, bk: int) -> tuple[Any, Any]:
    """``(some, every)``, bool ``[B, Sqp / bq, Skp / bk]``: whether a query block of ``bq`` rows and a key
    block of ``bk`` keys may hold a visible pair, and whether every pair of them is visible.

    ``q_ids`` ``[B, Sqp]`` and ``k_ids`` ``[B, Skp]`` padded past ``mask.sq`` / ``mask.sk``; ``q_off``
    ``[B, Sqp]`` or ``None`` (``mask.offset`` for every row).
    """
    batch, sqp = q_ids.shape
    skp = k_ids.shape[1]
    rows = jnp.arange(sqp, dtype=jnp.int32)
    real_row = (rows < mask.sq)[None, :]
    pos = jnp.broadcast_to(rows[None, :] + (mask.offset if q_off is None else q_off), (batch, sqp))
    # Each block's smallest and largest id and position over its real rows (the largest as minus the smallest
    # of the negated), and whether it holds one id over every row (padded rows count: a block with some is
    # never wholly visible).
    q_lo, neg_q_hi, p_lo, neg_p_hi, id_lo, neg_id_hi = (x[:, :, None] for x in _block_min(
        [jnp.where(real_row, q_ids, _BIG), jnp.where(real_row, -q_ids, _BIG), jnp.where(real_row, pos, _BIG),
         jnp.where(real_row, -pos, _BIG), q_ids, -q_ids], bq))
    q_hi, p_hi, one_id = -neg_q_hi, -neg_p_hi, id_lo == -neg_id_hi
    real_key = (jnp.arange(skp, dtype=jnp.int32) < mask.sk)[None, :]
    k_lo, neg_k_hi = (x[:, None, :] for x in _block_min([jnp.where(real_key, k_ids, _BIG),
                                                         jnp.where(real_key, -k_ids, _BIG)], bk))
    k_hi = -neg_k_hi
    c0 = jnp.arange(skp // bk, dtype=jnp.int32)[None, None, :] * bk
    c1 = jnp.minimum(c0 + (bk - 1), mask.sk - 1)  # the block's last real key
    some = (q_lo <= k_hi) & (k_lo <= q_hi)
    every = one_id & (k_lo == k_hi) & (q_lo == k_lo) & (c0 + bk <= mask.sk)
    if mask.right is not None:  # j <= pos + right
        some &= c0 <= p_hi + mask.right
        every &= c0 + (bk - 1) <= p_lo + mask.right
    if mask.left is not None:  # j >= pos - left
        some &= c1 >= p_lo - mask.left
        every &= c0 >= p_hi - mask.left
    return some, every


def block_ranges(some: Any, every: Any, consumers: int) -> jax.Array:
    """Loop bounds from :func:`block_visibility`'s ``[B, n, m]`` (rows: 64-wide consumer blocks, columns: the
    streamed blocks): int32 ``[B, n / consumers, consumers + 1, 4]``, ``[..., c, :]`` consumer ``c``'s
    ``(lo, lo_full, hi_full, hi)`` and ``[..., consumers, :2]`` the CTA's ``[lo, hi)`` (their hull; an empty
    consumer gets the empty range at the CTA's ``lo``). Wholly visible blocks that are not contiguous are all
    masked."""
    m = some.shape[2]
    blocks = jnp.arange(m, dtype=jnp.int32)
    # Each row's first and last block of each kind in one reduction (the last as minus the least negated).
    firsts = jnp.min(jnp.stack([jnp.where(some, blocks, m), jnp.where(some, -(blocks + 1), 0),
                                jnp.where(every, blocks, m), jnp.where(every, -(blocks + 1), 0)]), axis=3)
    lo, hi, f_lo, f_hi = firsts[0], -firsts[1], firsts[2], -firsts[3]
    contiguous = jnp.sum(every, axis=2, dtype=jnp.int32) == f_hi - f_lo
    return _pack(lo, hi, jnp.where(contiguous, f_lo, m), jnp.where(contiguous, f_hi, 0), consumers)


def _pack(lo: Any, hi: Any, f_lo: Any, f_hi: Any, consumers: int) -> jax.Array:
    """:func:`block_ranges`'s array from each consumer block's ``[lo, hi)`` (empty when ``lo >= hi``) and wholly
    visible ``[f_lo, f_hi)`` (``[B, n]`` each), clipped so that ``lo <= lo_full <= hi_full <= hi``."""
    batch, n = lo.shape
    shape = (batch, n // consumers, consumers)
    lo, hi = lo.reshape(shape), hi.reshape(shape)
    # The hull as elementwise extremes of the few consumers (no reduction: XLA fuses this whole function).
    cta_lo = functools.reduce(jnp.minimum, [lo[:, :, c:c + 1] for c in range(consumers)])
    cta_hi = functools.reduce(jnp.maximum, [hi[:, :, c:c + 1] for c in range(consumers)])
    cta_lo = jnp.where(cta_lo >= cta_hi, 0, cta_lo)
    cta_hi = jnp.maximum(cta_hi, cta_lo)
    empty = lo >= hi
    lo = jnp.where(empty, cta_lo, lo)
    hi = jnp.where(empty, cta_lo, hi)
    f_lo = jnp.clip(f_lo.reshape(shape), lo, hi)
    f_hi = jnp.clip(f_hi.reshape(shape), f_lo, hi)
    f_lo = jnp.where(f_hi > f_lo, f_lo, hi)
    f_hi = jnp.maximum(f_hi, f_lo)
    # One concatenate (one kernel): each bound with the CTA's appended as the last "consumer".
    lo, f_lo, f_hi, hi = (jnp.concatenate([x, cta], axis=2) for x, cta in
                          ((lo, cta_lo), (f_lo, cta_hi), (f_hi, cta_lo), (hi, cta_hi)))
    return jnp.stack([lo, f_lo, f_hi, hi], axis=-1).astype(jnp.int32)


def _band_cut(lo: Any, hi: Any, at: Any, limit: int, below: int | None, above: int | None) -> tuple[Any, Any]:
    """``[lo, hi)`` cut to ``[0, limit)`` and to the band ``at - below <= x <= at + above`` (``None``: unbounded)."""
    hi = jnp.minimum(hi, limit)
    if below is not None:
        lo = jnp.maximum(lo, at - below)
    if above is not None:
        hi = jnp.minimum(hi, at + above + 1)
    return lo.astype(jnp.int32), hi.astype(jnp.int32)


def visible_bounds(k_lo: Any, k_hi: Any, q_off: Any, mask: _Mask) -> tuple[Any, Any]:
    """Each row's visible keys ``[lo, hi)`` (int32 ``[B, Sqp]``): its key range ``[k_lo, k_hi)`` (padded rows
    empty) cut to the keys that exist and to the causal / window band (row ``i`` at ``i + q_off[i]`` on the key
    axis, or ``mask.offset`` when ``q_off`` is ``None``). A kernel then tests two bounds per key and nothing
    else."""
    rows = jnp.arange(k_lo.shape[1], dtype=jnp.int32)
    pos = rows[None, :] + (mask.offset if q_off is None else q_off)
    return _band_cut(k_lo, k_hi, pos, mask.sk, mask.left, mask.right)


def key_visible_bounds(q_lo: Any, q_hi: Any, k_off: Any, mask: _Mask) -> tuple[Any, Any]:
    """Each key's visible queries ``[lo, hi)`` (int32 ``[B, Skp]``), the transpose of :func:`visible_bounds`: its
    sequence's queries ``[q_lo, q_hi)`` (padded keys empty) cut to the queries that exist and to the causal /
    window band, key ``j`` of a sequence whose queries sit at ``i + k_off[j]`` on the key axis (``k_off`` its
    ``Sk_s - Sq_s``). Query ``i`` sees key ``j`` iff ``i + off - left <= j <= i + off + right``, so ``j - off - right
    <= i <= j - off + left``."""
    keys = jnp.arange(q_lo.shape[1], dtype=jnp.int32)[None, :]
    return _band_cut(q_lo, q_hi, keys - k_off, mask.sq, mask.right, mask.left)


def range_block_ranges(lo: Any, hi: Any, rows: int, bk: int, consumers: int) -> jax.Array:
    """:func:`block_ranges`'s array from each row's visible range ``[lo, hi)`` of the streamed axis
    (:func:`visible_bounds` or :func:`key_visible_bounds`; ``[B, L]`` int32, never negative; rows from ``rows`` on
    are padding) for 64-row consumer blocks and streamed blocks of ``bk``.

    A row's visible keys are one range, so a block's may-see blocks are the hull of its rows' ranges and its
    wholly visible blocks lie in their intersection: one reduction of four extremes per block."""
    seen = (lo < hi) & (jnp.arange(lo.shape[1], dtype=jnp.int32) < rows)[None, :]
    # Per 64-row block, in one reduction: the least start and the greatest end of the rows that see a key (their
    # hull), and the greatest start and least end of all rows (their intersection; a padded or blind row, taken
    # as the range [0, 0), empties it).
    u_lo, neg_u_hi, neg_i_lo, i_hi = _block_min([jnp.where(seen, lo, _BIG), jnp.where(seen, -hi, _BIG),
                                                 jnp.where(seen, -lo, 0), jnp.where(seen, hi, 0)], 64)
    u_hi, i_lo = -neg_u_hi, -neg_i_lo
    some = u_lo < u_hi
    first = jnp.where(some, u_lo // bk, 0)
    last = jnp.where(some, (u_hi + bk - 1) // bk, 0)
    f_lo = (i_lo + bk - 1) // bk  # the first block wholly inside every row's range
    f_hi = i_hi // bk
    return _pack(first, last, f_lo, f_hi, consumers)
