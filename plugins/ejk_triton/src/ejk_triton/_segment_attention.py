"""``flash_attention`` with segment ids on the varlen kernels: key blocks outside a row's segment are skipped.

Packed training through ``ejk.flash_attention(..., q_segment_ids=, kv_segment_ids=)`` puts many short
documents in one long row; a dense kernel computes every block of the ``[Sq, Sk]`` square (or its causal
triangle) and masks most of it. Here the batch is folded into one packed axis and every query row gets
the interval of keys it may see: the hull of the keys that carry its segment id (the first and last of
them, found without sorting: :func:`_id_hulls`), intersected with its causal /
window band (positions are those of the row, as ``flash_attention`` defines them). The varlen kernels
loop over the blocks of that interval only and compare segment ids inside it, so any segment ids are
exact (a segment split into several runs just widens the hull), and contiguous segments, the packed
case, skip everything outside their own block of the square. Rows whose interval holds keys of their
own id only (``exact``: the hull is as long as the id's count of keys) need no id compare at all; the
kernels then run their interior blocks unmasked, as without segment ids.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ejk_triton import _varlen_attention as va

__all__ = ["capability", "config_space", "flash_attention", "heuristic_config", "segment_intervals"]


def _id_hulls(ids_q: jax.Array, ids_k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per row ``[B, Sq]``: ``(lo, hi, exact)``, a key interval ``[lo, hi)`` of its batch row holding every key
    of the row's id (empty when there is none) and whether it holds keys of that id only.

    No sort: the keys are hashed by id into ``Sk`` buckets per batch row (``id mod Sk``; distinct ids below
    ``Sk``, the usual ones, never share one), and two scatters give each bucket its first and last key, its
    smallest and largest id and its count. A bucket of one id gives that id's hull, exact when the id's
    keys fill it (or none: the id has no key); a bucket shared by several ids gives a hull that holds all
    of their keys, never exact (the kernels then compare ids inside it).
    """
    batch, kv_len = ids_k.shape
    pos = jnp.broadcast_to(jnp.arange(kv_len, dtype=jnp.int32), ids_k.shape)
    rows = jnp.arange(batch, dtype=jnp.int32)[:, None] * kv_len
    bucket_k = (rows + jnp.remainder(ids_k, kv_len)).reshape(-1)
    # min of (pos, -pos, id, ~id): first key, -last key, smallest id, ~largest id (~ reverses the order
    # without overflow).
    keyed = jnp.stack([pos, -pos, ids_k, ~ids_k], axis=-1).reshape(-1, 4)
    big = jnp.iinfo(jnp.int32).max
    table = jnp.full((batch * kv_len, 4), big, jnp.int32).at[bucket_k].min(keyed, mode="promise_in_bounds")
    count = jnp.zeros((batch * kv_len,), jnp.int32).at[bucket_k].add(1, mode="promise_in_bounds")
    bucket_q = (rows + jnp.remainder(ids_q, kv_len)).reshape(ids_q.shape)
    first, neg_last, id_min, not_id_max = (table[bucket_q, c] for c in range(4))
    keys = count[bucket_q]
    single = id_min == ~not_id_max  # one id in the bucket (an empty bucket has id_min > ~not_id_max)
    found = (keys > 0) & (~single | (id_min == ids_q))
    lo = jnp.where(found, first, 0)
    hi = jnp.where(found, 1 - neg_last, 0)
    exact = ~found | (single & (keys == hi - lo))  # the id's keys fill its hull: no other id inside
    return lo, hi, exact


def segment_intervals(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *, causal: bool,
                      sliding_window: tuple[int, int] | None) -> tuple[jax.Array, ...]:
    """Per packed row (batch folded in, ``b * Sq + i``): ``(lo, hi, hull_lo, hull_hi, inner_lo, inner_hi,
    exact)`` in packed key coordinates (``b * Sk + j``): row ``i`` of batch ``b`` sees only keys in
    ``[lo, hi)`` that carry its id; ``hull_*`` / ``inner_*`` are non-decreasing bounds (``hull_lo <= lo``,
    ``hull_hi >= hi``; ``inner_lo >= lo``, ``inner_hi <= hi``); ``exact`` (int32) is 1 where every key
    of ``[lo, hi)`` carries the row's id (its segment is one contiguous run of keys: the packed case)."""
    batch, q_len = q_segment_ids.shape
    kv_len = kv_segment_ids.shape[1]
    lo, hi, exact = _id_hulls(q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32))
    pos = jnp.arange(q_len, dtype=jnp.int32)[None, :] + (kv_len - q_len)  # the row's position among the keys
    if sliding_window is not None:
        lo = jnp.maximum(lo, pos - sliding_window[0])
        hi = jnp.minimum(hi, pos + sliding_window[1] + 1)
    elif causal:
        hi = jnp.minimum(hi, pos + 1)
    hi = jnp.maximum(hi, lo)
    empty = hi <= lo
    lo = jnp.where(empty, jnp.clip(pos, 0, kv_len), lo)
    hi = jnp.where(empty, lo, hi)
    exact = exact | empty  # a part of an exact interval is exact; an empty one compares nothing
    offset = (jnp.arange(batch, dtype=jnp.int32) * kv_len)[:, None]
    lo, hi = (lo + offset).reshape(-1), (hi + offset).reshape(-1)
    hull_lo = lax.cummin(lo, axis=0, reverse=True)
    hull_hi = lax.cummax(hi, axis=0)
    inner_lo = lax.cummax(lo, axis=0)
    inner_hi = lax.cummin(hi, axis=0, reverse=True)
    return lo, hi, hull_lo, hull_hi, inner_lo, inner_hi, exact.reshape(-1).astype(jnp.int32)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    q_segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None,
    bias: jax.Array | None,
    precision: str = "highest",
    cfg: va.VarlenAttentionConfig | None = None,
) -> jax.Array:
    """``ejk.flash_attention`` for calls with segment ids and no bias (the gate refuses others), at the call's
    ``precision`` for float32 dots (no attention sinks: the core refuses calls with them for it).

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    if q_segment_ids is None or kv_segment_ids is None or bias is not None:
        raise ValueError("ejk-triton's segments kernel runs calls with segment ids and no bias only (its gate)")
    batch, q_len, q_heads, _ = q.shape
    kv_len, kv_heads, v_dim = k.shape[1], k.shape[2], v.shape[3]
    if min(batch, q_len, q_heads, kv_len, v_dim) == 0:
        return jnp.zeros((batch, q_len, q_heads, v_dim), q.dtype)
    flat_q = q.reshape(batch * q_len, q_heads, q.shape[3])
    flat_k, flat_v = k.reshape(batch * kv_len, kv_heads, k.shape[3]), v.reshape(batch * kv_len, kv_heads, v_dim)
    cfg = heuristic_config(flat_q, flat_k, flat_v, causal=causal) if cfg is None else cfg
    lo, hi, hull_lo, hull_hi, inner_lo, inner_hi, exact = segment_intervals(
        q_segment_ids, kv_segment_ids, causal=causal, sliding_window=sliding_window)
    ids = (q_segment_ids.astype(jnp.int32).reshape(-1), kv_segment_ids.astype(jnp.int32).reshape(-1))
    out = va.attend_intervals(flat_q, flat_k, flat_v, lo, hi, hull=(hull_lo, hull_hi), inner=(inner_lo, inner_hi),
                              segment_ids=ids, exact=exact, softmax_scale=softmax_scale,
                              logits_soft_cap=logits_soft_cap, precision=precision, cfg=cfg,
                              reverse=causal or sliding_window is not None)
    return out.reshape(batch, q_len, q_heads, v_dim)


def capability(q: Any, k: Any, v: Any, *, q_segment_ids: Any = None, kv_segment_ids: Any = None, bias: Any = None,
               **_: Any) -> str | None:
    """Calls with segment ids and no bias; otherwise the varlen kernels' rules (dtypes, head dims, GPU)."""
    if q_segment_ids is None or kv_segment_ids is None:
        return "runs calls with segment ids only (ejk-triton's flash kernel takes the others)"
    if bias is not None:
        return "no bias (ejk-triton's flash kernel takes calls with a bias)"
    return va.capability(_flat(q), _flat(k), _flat(v))


def _flat(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((int(x.shape[0]) * int(x.shape[1]), *map(int, x.shape[2:])), x.dtype)


def config_space(q: Any, k: Any, v: Any, *_: Any, causal: bool = False, **__: Any) -> list[va.VarlenAttentionConfig]:
    """The varlen kernels' candidates for the packed shapes."""
    return va.config_space(_flat(q), _flat(k), _flat(v), causal=causal)


def heuristic_config(q: Any, k: Any, v: Any, *_: Any, causal: bool = False, **__: Any) -> va.VarlenAttentionConfig:
    """The varlen kernels' heuristic for the packed shapes (``q`` may already be packed, rank 3)."""
    if len(q.shape) == 4:
        q, k, v = _flat(q), _flat(k), _flat(v)
    return va.heuristic_config(q, k, v, causal=causal)
