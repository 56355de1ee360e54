"""``flash_attention`` with segment ids on the varlen kernels: key blocks outside a row's segment are skipped.

Packed training through ``ejk.flash_attention(..., q_segment_ids=, kv_segment_ids=)`` puts many short
documents in one long row; a dense kernel computes every block of the ``[Sq, Sk]`` square (or its causal
triangle) and masks most of it. Here the batch is folded into one packed axis and every query row gets
the interval of keys it may see: the hull of the keys that carry its segment id (the first and last of
them, found with a stable sort of the key ids and two ``searchsorted``), intersected with its causal /
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


def segment_intervals(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *, causal: bool,
                      sliding_window: tuple[int, int] | None) -> tuple[jax.Array, ...]:
    """Per packed row (batch folded in, ``b * Sq + i``): ``(lo, hi, hull_lo, hull_hi, inner_lo, inner_hi,
    exact)`` in packed key coordinates (``b * Sk + j``): row ``i`` of batch ``b`` sees only keys in
    ``[lo, hi)`` that carry its id; ``hull_*`` / ``inner_*`` are non-decreasing bounds (``hull_lo <= lo``,
    ``hull_hi >= hi``; ``inner_lo >= lo``, ``inner_hi <= hi``); ``exact`` (int32) is 1 where every key
    of ``[lo, hi)`` carries the row's id (its segment is one contiguous run of keys: the packed case)."""
    batch, q_len = q_segment_ids.shape
    kv_len = kv_segment_ids.shape[1]
    ids_q, ids_k = q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32)
    order = jnp.argsort(ids_k, axis=1, stable=True).astype(jnp.int32)  # by id, then by position
    sorted_ids = jnp.take_along_axis(ids_k, order, axis=1)
    # One fused search per side (the default method is an XLA while loop: a launch per level).
    search = jax.vmap(lambda a, x, side: jnp.searchsorted(a, x, side=side, method="scan_unrolled"),
                      in_axes=(0, 0, None))
    first = search(sorted_ids, ids_q, "left").astype(jnp.int32)
    end = search(sorted_ids, ids_q, "right").astype(jnp.int32)
    found = end > first
    lo = jnp.where(found, jnp.take_along_axis(order, jnp.minimum(first, kv_len - 1), axis=1), 0)
    hi = jnp.where(found, jnp.take_along_axis(order, jnp.maximum(end - 1, 0), axis=1) + 1, 0)
    exact = hi - lo == end - first  # the hull holds as many keys as carry the id: no other id inside
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
