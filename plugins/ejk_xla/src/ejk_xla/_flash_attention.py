"""Chunked (flash) attention in plain ``jax.numpy`` / ``lax``: memory O(S · block), any backend.

The forward pass walks over query blocks (``lax.scan``) and, for each, over the key blocks it
can see (``lax.fori_loop`` with bounds derived from causal / window masks, so fully masked
blocks are skipped), keeping an online softmax (running max ``m``, running sum ``l`` and a
float32 accumulator). It never builds the ``[Sq, Sk]`` logits; only a user-given bias has
that size. A ``jax.custom_vjp`` saves the inputs, the output and the per-row log-sum-exp, and
the backward pass recomputes the probabilities block by block (FlashAttention-2 style):
the outer loop runs over key blocks (accumulating ``dk``, ``dv``), the inner loop over the
query blocks that see them, adding into a float32 ``dq`` buffer (and ``dbias`` if needed).

Grouped-query attention is handled without repeating ``k`` / ``v``: queries are laid out as
``[B, Hkv, G, S, D]`` with ``G = Hq // Hkv`` query heads per kv head.

Internal layouts (``n*`` = number of blocks):

- q-like blocks: ``[nq, B, Hkv, G, bq, D]``; row statistics ``[nq, B, Hkv, G, bq]``
- kv blocks: ``[nk, B, Hkv, bk, D]``
- segment ids: ``[nq, B, bq]`` / ``[nk, B, bk]``
- bias: padded ``[Bb, H1, H2, Sq' or 1, Sk' or 1]`` with ``(H1, H2) = (Hkv, G)`` or ``(1, 1)``
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.config.validators import positive_int
from ejk.parallel import varying_like
from ejk.plugin import cotangent_like
from ejk.tiling import cdiv as _cdiv

__all__ = ["FlashAttentionConfig", "config_space", "flash_attention", "flash_attention_lse", "heuristic_config"]


@attrs.frozen(kw_only=True)
class FlashAttentionConfig:
    """Block sizes of the XLA flash attention.

    Attributes:
        block_q: Query rows per block (clamped to ``Sq``).
        block_k: Key rows per block (clamped to ``Sk``).
    """

    block_q: int = attrs.field(validator=positive_int)
    block_k: int = attrs.field(validator=positive_int)


@attrs.frozen
class _Static:
    """Everything static about one call (hashable: a ``nondiff_argnums`` argument)."""

    causal: bool
    scale: float
    window: tuple[int, int] | None
    cap: float | None
    block_q: int
    block_k: int
    precision: str = "highest"

    @property
    def masks_positions(self) -> bool:
        return self.causal or self.window is not None


# ----------------------------------------------------------------------------------------------
# Layout helpers
# ----------------------------------------------------------------------------------------------


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _to_q_blocks(x: jax.Array, kv_heads: int, block: int) -> jax.Array:
    """``[B, S, Hq, ...]`` → ``[n, B, Hkv, G, block, ...]`` (zero-padded)."""
    batch, seq, heads = x.shape[:3]
    tail = x.shape[3:]
    n = _cdiv(seq, block)
    x = _pad_axis(x, 1, n * block).reshape(batch, n, block, kv_heads, heads // kv_heads, *tail)
    return jnp.moveaxis(x, (1, 2), (0, 4))


def _from_q_blocks(x: jax.Array, seq: int) -> jax.Array:
    """Inverse of :func:`_to_q_blocks`: ``[n, B, Hkv, G, block, ...]`` → ``[B, S, Hq, ...]``."""
    n, batch, kv_heads, groups, block = x.shape[:5]
    tail = x.shape[5:]
    x = jnp.moveaxis(x, (0, 4), (1, 2)).reshape(batch, n * block, kv_heads * groups, *tail)
    return x[:, :seq]


def _to_kv_blocks(x: jax.Array, block: int) -> jax.Array:
    """``[B, S, Hkv, D]`` → ``[n, B, Hkv, block, D]`` (zero-padded)."""
    batch, seq, heads, dim = x.shape
    n = _cdiv(seq, block)
    x = _pad_axis(x, 1, n * block).reshape(batch, n, block, heads, dim)
    return x.transpose(1, 0, 3, 2, 4)


def _from_kv_blocks(x: jax.Array, seq: int) -> jax.Array:
    n, batch, heads, block, dim = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(batch, n * block, heads, dim)[:, :seq]


def _to_seq_blocks(ids: jax.Array, block: int) -> jax.Array:
    """``[B, S]`` → ``[n, B, block]`` (padded with -1; padded positions are masked anyway)."""
    batch, seq = ids.shape
    n = _cdiv(seq, block)
    ids = jnp.pad(ids, ((0, 0), (0, n * block - seq)), constant_values=-1)
    return ids.reshape(batch, n, block).transpose(1, 0, 2)


def _bias_5d(bias: jax.Array, kv_heads: int, st: _Static) -> jax.Array:
    """``[Bb, Hb, Sqb, Skb]`` → padded ``[Bb, H1, H2, Sq' | 1, Sk' | 1]`` for block slicing."""
    bb, hb, sqb, skb = bias.shape
    heads = (kv_heads, hb // kv_heads) if hb > 1 else (1, 1)
    bias = bias.reshape(bb, *heads, sqb, skb)
    if sqb > 1:
        bias = _pad_axis(bias, 3, _cdiv(sqb, st.block_q) * st.block_q)
    if skb > 1:
        bias = _pad_axis(bias, 4, _cdiv(skb, st.block_k) * st.block_k)
    return bias


def _bias_window(bias5: jax.Array, i: jax.Array, j: jax.Array, st: _Static) -> tuple[Any, ...]:
    """Start indices and sizes of block ``(i, j)`` inside a 5-D bias (size-1 dims stay 1)."""
    rows = st.block_q if bias5.shape[3] > 1 else 1
    cols = st.block_k if bias5.shape[4] > 1 else 1
    zero = jnp.zeros((), jnp.int32)
    starts = (zero, zero, zero, i * rows if rows > 1 else zero, j * cols if cols > 1 else zero)
    sizes = (*bias5.shape[:3], rows, cols)
    return starts, sizes


def _bias_block(bias5: jax.Array | None, i: jax.Array, j: jax.Array, st: _Static) -> jax.Array | None:
    if bias5 is None:
        return None
    starts, sizes = _bias_window(bias5, i, j, st)
    return lax.dynamic_slice(bias5, starts, sizes).astype(jnp.float32)


def _add_bias_grad(buf: jax.Array, ds: jax.Array, i: jax.Array, j: jax.Array, st: _Static) -> jax.Array:
    """Adds ``ds`` (``[B, Hkv, G, bq, bk]``), summed over the bias's broadcast dims, into ``buf``."""
    axes = tuple(a for a in range(5) if buf.shape[a] == 1 and ds.shape[a] != 1)
    contribution = jnp.sum(ds, axis=axes, keepdims=True) if axes else ds
    starts, sizes = _bias_window(buf, i, j, st)
    current = lax.dynamic_slice(buf, starts, sizes)
    return lax.dynamic_update_slice(buf, current + contribution, starts)


# ----------------------------------------------------------------------------------------------
# Masks and block ranges
# ----------------------------------------------------------------------------------------------


def _block_mask(
    st: _Static,
    lens: tuple[int, int],
    i: jax.Array,
    j: jax.Array,
    q_seg: jax.Array | None,
    kv_seg: jax.Array | None,
) -> jax.Array | None:
    """Visibility of block ``(i, j)``, broadcastable to ``[B, Hkv, G, bq, bk]`` (``None``: all visible)."""
    q_len, kv_len = lens
    rows = i * st.block_q + jnp.arange(st.block_q)
    cols = j * st.block_k + jnp.arange(st.block_k)
    rel = cols[None, :] - (rows[:, None] + (kv_len - q_len))  # j - (i + Sk - Sq)
    conditions = []
    if q_len % st.block_q:
        conditions.append(rows[:, None] < q_len)
    if kv_len % st.block_k:
        conditions.append(cols[None, :] < kv_len)
    if st.causal:
        conditions.append(rel <= 0)
    if st.window is not None:
        conditions.append((rel >= -st.window[0]) & (rel <= st.window[1]))
    mask = None
    for cond in conditions:
        mask = cond if mask is None else mask & cond
    if mask is not None:
        mask = mask[None, None, None]
    if q_seg is not None and kv_seg is not None:
        same = (q_seg[:, :, None] == kv_seg[:, None, :])[:, None, None]
        mask = same if mask is None else mask & same
    return mask


def _right_reach(st: _Static) -> int | None:
    """How far right of its position a query may see (``None``: unbounded)."""
    if st.window is not None:
        return st.window[1]
    return 0 if st.causal else None


def _blocks_covering(lo: jax.Array, hi: jax.Array, length: int, block: int) -> tuple[jax.Array, jax.Array]:
    """Blocks ``[first, last)`` that cover indices ``[lo, hi]`` clipped to ``[0, length)``."""
    lo = jnp.maximum(lo, 0)
    hi_excl = jnp.minimum(hi + 1, length)
    first = lo // block
    last = jnp.where(hi_excl > lo, (hi_excl + block - 1) // block, first)
    return first, last


def _kv_block_range(st: _Static, lens: tuple[int, int], i: jax.Array) -> tuple[Any, Any]:
    """Key blocks that query block ``i`` can see: ``[first, last)``."""
    q_len, kv_len = lens
    n_k = _cdiv(kv_len, st.block_k)
    if not st.masks_positions:
        return 0, n_k
    offset = kv_len - q_len
    first_pos = i * st.block_q + offset
    last_pos = jnp.minimum(i * st.block_q + st.block_q, q_len) - 1 + offset
    lo = first_pos - st.window[0] if st.window is not None else jnp.zeros_like(first_pos)
    right = _right_reach(st)
    hi = last_pos + right if right is not None else jnp.full_like(last_pos, kv_len - 1)
    return _blocks_covering(lo, hi, kv_len, st.block_k)


def _q_block_range(st: _Static, lens: tuple[int, int], j: jax.Array) -> tuple[Any, Any]:
    """Query blocks that can see key block ``j``: ``[first, last)``."""
    q_len, kv_len = lens
    n_q = _cdiv(q_len, st.block_q)
    if not st.masks_positions:
        return 0, n_q
    offset = kv_len - q_len
    first_col = j * st.block_k
    last_col = jnp.minimum(j * st.block_k + st.block_k, kv_len) - 1
    right = _right_reach(st)
    lo = first_col - offset - right if right is not None else jnp.zeros_like(first_col)
    hi = last_col - offset + st.window[0] if st.window is not None else jnp.full_like(last_col, q_len - 1)
    return _blocks_covering(lo, hi, q_len, st.block_q)


# ----------------------------------------------------------------------------------------------
# Block math
# ----------------------------------------------------------------------------------------------


def _dot(st: _Static, spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``einsum`` with float32 accumulation, at the call's ``precision`` for float32 inputs."""
    precision = lax.Precision(st.precision) if a.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=precision)


def _scores(
    st: _Static, q_blk: jax.Array, k_blk: jax.Array, bias_blk: jax.Array | None
) -> tuple[jax.Array, jax.Array | None]:
    """Float32 logits of one block ``[B, Hkv, G, bq, bk]`` and ``tanh`` of the soft cap (for the VJP)."""
    s = _dot(st, "bhgqd,bhkd->bhgqk", q_blk, k_blk) * st.scale
    tanh = None
    if st.cap is not None:
        tanh = jnp.tanh(s / st.cap)
        s = st.cap * tanh
    if bias_blk is not None:
        s = s + bias_blk
    return s, tanh


def _apply_mask(s: jax.Array, mask: jax.Array | None) -> jax.Array:
    return s if mask is None else jnp.where(mask, s, -jnp.inf)


def _finite_or_zero(x: jax.Array) -> jax.Array:
    return jnp.where(x == -jnp.inf, 0.0, x)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


def _online_softmax_step(
    st: _Static, carry: tuple[jax.Array, ...], s: jax.Array, v_blk: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Folds one block of masked logits ``s`` into (running max, running sum, accumulator).

    Masked entries are ``-inf``; a row that has seen only ``-inf`` keeps max ``-inf`` and sum 0,
    and the max is replaced by 0 where it is ``-inf`` so no ``inf - inf`` is ever formed.
    """
    m, total, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    m_safe = _finite_or_zero(m_new)
    p = jnp.exp(s - m_safe[..., None])
    alpha = jnp.exp(m - m_safe)
    pv = _dot(st, "bhgqk,bhkd->bhgqd", p.astype(v_blk.dtype), v_blk)
    return m_new, alpha * total + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv


def _forward(
    st: _Static,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_seg: jax.Array | None,
    kv_seg: jax.Array | None,
    bias: jax.Array | None,
    sinks: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Output ``[B, Sq, Hq, Dv]`` and log-sum-exp ``[nq, B, Hkv, G, bq]`` (``+inf`` for empty rows;
    with ``sinks`` ``[Hq]``, of the full denominator: the sink enters each seen row's sum once)."""
    kv_heads = k.shape[2]
    lens = (q.shape[1], k.shape[1])
    kb, vb = _to_kv_blocks(k, st.block_k), _to_kv_blocks(v, st.block_k)
    kv_segb = None if kv_seg is None else _to_seq_blocks(kv_seg, st.block_k)
    bias5 = None if bias is None else _bias_5d(bias, kv_heads, st)
    qb = _to_q_blocks(q, kv_heads, st.block_q)
    q_segb = None if q_seg is None else _to_seq_blocks(q_seg, st.block_q)
    row_shape = qb.shape[1:5]
    sink = None if sinks is None else sinks.astype(jnp.float32).reshape(1, kv_heads, -1, 1)  # [1, Hkv, G, 1]

    def q_step(_: None, xs: tuple[Any, ...]) -> tuple[None, tuple[jax.Array, jax.Array]]:
        i, q_blk, q_seg_blk = xs

        def k_step(j: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            s, _ = _scores(st, q_blk, kb[j], _bias_block(bias5, i, j, st))
            mask = _block_mask(st, lens, i, j, q_seg_blk, None if kv_segb is None else kv_segb[j])
            return _online_softmax_step(st, carry, _apply_mask(s, mask), vb[j])

        init = varying_like((
            jnp.full(row_shape, -jnp.inf, jnp.float32),
            jnp.zeros(row_shape, jnp.float32),
            jnp.zeros((*row_shape, v.shape[3]), jnp.float32),
        ), q_blk, kb, vb, bias5, q_seg_blk, kv_segb)
        first, last = _kv_block_range(st, lens, i)
        m, total, acc = lax.fori_loop(first, last, k_step, init)
        seen = total > 0
        if sink is not None:  # one more term of the denominator, on the rows that see a key
            m_new = jnp.where(seen, jnp.maximum(m, sink), m)
            alpha = jnp.where(seen, jnp.exp(_finite_or_zero(m) - _finite_or_zero(m_new)), 1.0)
            total = alpha * total + jnp.where(seen, jnp.exp(jnp.where(seen, sink - _finite_or_zero(m_new), 0.0)), 0.0)
            acc, m = alpha[..., None] * acc, m_new
        safe_total = jnp.where(seen, total, 1.0)
        out = acc / safe_total[..., None]
        lse = jnp.where(seen, _finite_or_zero(m) + jnp.log(safe_total), jnp.inf)
        return None, (out.astype(q.dtype), lse)

    xs = (jnp.arange(qb.shape[0]), qb, q_segb)
    _, (out_b, lse) = lax.scan(q_step, None, xs)
    return _from_q_blocks(out_b, lens[0]), lse


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


def _block_grads(
    st: _Static,
    blocks: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
    rows: tuple[jax.Array, jax.Array],
    bias_blk: jax.Array | None,
    mask: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Gradient pieces of one ``(q block, k block)`` pair, recomputing its probabilities.

    Args:
        st: Static parameters.
        blocks: ``(q, k, v, d_out)`` blocks.
        rows: ``(lse, delta)`` of the q block's rows (``delta = rowsum(d_out * out)``).
        bias_blk: The bias block (float32) or ``None``.
        mask: Visibility of the block or ``None``.

    Returns:
        ``(d_logits, dq, dk, dv)``: the gradient w.r.t. the final logits (which is the bias
        gradient) and this block's float32 contributions to ``dq``, ``dk``, ``dv``.
    """
    q_blk, k_blk, v_blk, do_blk = blocks
    lse, delta = rows
    s, tanh = _scores(st, q_blk, k_blk, bias_blk)
    p = jnp.exp(_apply_mask(s, mask) - lse[..., None])  # 0 where masked; lse = +inf for empty rows
    dv = _dot(st, "bhgqk,bhgqd->bhkd", p.astype(do_blk.dtype), do_blk)
    dp = _dot(st, "bhgqd,bhkd->bhgqk", do_blk, v_blk)
    d_logits = p * (dp - delta[..., None])
    d_raw = d_logits if tanh is None else d_logits * (1.0 - tanh * tanh)
    d_raw = (d_raw * st.scale).astype(q_blk.dtype)
    dq = _dot(st, "bhgqk,bhkd->bhgqd", d_raw, k_blk)
    dk = _dot(st, "bhgqk,bhgqd->bhkd", d_raw, q_blk)
    return d_logits, dq, dk, dv


def _backward(
    st: _Static,
    residuals: tuple[Any, ...],
    d_out: jax.Array,
    d_lse: jax.Array | None = None,
) -> tuple[Any, ...]:
    """Recomputes the probabilities block by block and returns ``(dq, dk, dv, None, None, dbias, dsinks)``.

    ``d_lse`` (``[B, Hq, Sq]``), the cotangent of the log-sum-exp output, enters as
    ``d_logits = p · (dp - delta + d_lse)``, i.e. it is subtracted from ``delta``. With sinks the
    lse includes them, so ``p`` is unchanged and ``dsinks[h] = -Σ_rows e^(sink - lse) · delta``.
    """
    q, k, v, q_seg, kv_seg, bias, sinks, out, lse = residuals
    kv_heads = k.shape[2]
    lens = (q.shape[1], k.shape[1])
    qb = _to_q_blocks(q, kv_heads, st.block_q)
    dob = _to_q_blocks(d_out.astype(q.dtype), kv_heads, st.block_q)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    if d_lse is not None:
        delta = delta - jnp.swapaxes(d_lse.astype(jnp.float32), 1, 2)
    deltab = _to_q_blocks(delta, kv_heads, st.block_q)
    q_segb = None if q_seg is None else _to_seq_blocks(q_seg, st.block_q)
    bias5 = None if bias is None else _bias_5d(bias, kv_heads, st)

    def k_step(carry: tuple[Any, ...], xs: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[jax.Array, ...]]:
        j, k_blk, v_blk, kv_seg_blk = xs

        def q_step(i: jax.Array, inner: tuple[Any, ...]) -> tuple[Any, ...]:
            dk, dv, dq_buf, dbias_buf = inner
            mask = _block_mask(st, lens, i, j, None if q_segb is None else q_segb[i], kv_seg_blk)
            ds, dq_i, dk_i, dv_i = _block_grads(
                st, (qb[i], k_blk, v_blk, dob[i]), (lse[i], deltab[i]), _bias_block(bias5, i, j, st), mask
            )
            if dbias_buf is not None:
                dbias_buf = _add_bias_grad(dbias_buf, ds, i, j, st)
            dq_buf = lax.dynamic_update_index_in_dim(dq_buf, dq_buf[i] + dq_i, i, axis=0)
            return dk + dk_i, dv + dv_i, dq_buf, dbias_buf

        dq_buf, dbias_buf = carry
        init = (
            *varying_like((jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(v_blk.shape, jnp.float32)),
                          qb, k_blk, v_blk, dob, bias5, lse),
            dq_buf,
            dbias_buf,
        )
        first, last = _q_block_range(st, lens, j)
        dk, dv, dq_buf, dbias_buf = lax.fori_loop(first, last, q_step, init)
        return (dq_buf, dbias_buf), (dk.astype(k.dtype), dv.astype(v.dtype))

    kb, vb = _to_kv_blocks(k, st.block_k), _to_kv_blocks(v, st.block_k)
    kv_segb = None if kv_seg is None else _to_seq_blocks(kv_seg, st.block_k)
    dbias0 = None if bias5 is None else jnp.zeros(bias5.shape, jnp.float32)
    carry0 = varying_like((jnp.zeros(qb.shape, jnp.float32), dbias0), qb, kb, vb, dob, bias5, lse)
    (dq_buf, dbias_buf), (dkb, dvb) = lax.scan(k_step, carry0, (jnp.arange(kb.shape[0]), kb, vb, kv_segb))
    dq = _from_q_blocks(dq_buf, lens[0]).astype(q.dtype)
    dk = _from_kv_blocks(dkb, lens[1])
    dv = _from_kv_blocks(dvb, lens[1])
    dbias = None
    if bias is not None and dbias_buf is not None:
        dbias = dbias_buf[:, :, :, : bias.shape[2], : bias.shape[3]].reshape(bias.shape).astype(bias.dtype)
    dsinks = None
    if sinks is not None:  # lse = +inf on empty and padded rows: they contribute exp(-inf) = 0
        sink = sinks.astype(jnp.float32).reshape(1, 1, kv_heads, -1, 1)
        p_sink = jnp.exp(sink - lse)
        dsinks = cotangent_like(-jnp.sum(p_sink * deltab, axis=(0, 1, 4)).reshape(sinks.shape).astype(sinks.dtype),
                                sinks)  # summed over mesh axes the sinks do not vary along
    return dq, dk, dv, None, None, dbias, dsinks


# ----------------------------------------------------------------------------------------------
# custom_vjp wiring and the public entry point
# ----------------------------------------------------------------------------------------------


def _fa(st: _Static, q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, bias: Any, sinks: Any) -> jax.Array:
    return _forward(st, q, k, v, q_seg, kv_seg, bias, sinks)[0]


def _fa_fwd(st: _Static, q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, bias: Any,
            sinks: Any) -> tuple[jax.Array, Any]:
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, bias, sinks)
    return out, (q, k, v, q_seg, kv_seg, bias, sinks, out, lse)


_flash = jax.custom_vjp(_fa, nondiff_argnums=(0,))
_flash.defvjp(_fa_fwd, _backward)


def _public_lse(lse: jax.Array, q_len: int) -> jax.Array:
    """Internal ``[nq, B, Hkv, G, bq]`` (``+inf`` when empty) → ``[B, Hq, Sq]`` (``-inf`` when empty)."""
    rows = jnp.swapaxes(_from_q_blocks(lse, q_len), 1, 2)
    return jnp.where(rows == jnp.inf, -jnp.inf, rows)


def _fa_lse(st: _Static, q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, bias: Any,
            sinks: Any) -> tuple[jax.Array, jax.Array]:
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, bias, sinks)
    return out, _public_lse(lse, q.shape[1])


def _fa_lse_fwd(st: _Static, q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any,
                bias: Any, sinks: Any) -> tuple[tuple[jax.Array, jax.Array], Any]:
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, bias, sinks)
    return (out, _public_lse(lse, q.shape[1])), (q, k, v, q_seg, kv_seg, bias, sinks, out, lse)


def _fa_lse_bwd(st: _Static, residuals: tuple[Any, ...], cotangents: tuple[jax.Array, jax.Array]) -> tuple[Any, ...]:
    d_out, d_lse = cotangents
    q_len = residuals[0].shape[1]
    empty = _public_lse(residuals[-1], q_len) == -jnp.inf
    return _backward(st, residuals, d_out, jnp.where(empty, 0.0, d_lse))  # rows that see nothing: no gradient


_flash_lse = jax.custom_vjp(_fa_lse, nondiff_argnums=(0,))
_flash_lse.defvjp(_fa_lse_fwd, _fa_lse_bwd)


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
    sinks: jax.Array | None = None,
    precision: str = "highest",
    cfg: FlashAttentionConfig | None = None,
) -> jax.Array:
    """Memory-efficient softmax attention (arguments already normalised, see KERNEL_CONTRACT.md).

    Args:
        q: ``[B, Sq, Hq, D]``.
        k: ``[B, Sk, Hkv, D]`` with ``Hq % Hkv == 0``.
        v: ``[B, Sk, Hkv, Dv]``.
        causal: Bottom-right aligned causal mask.
        softmax_scale: Resolved logit scale.
        sliding_window: ``(left, right)`` or ``None`` (right is 0 when causal).
        logits_soft_cap: ``cap · tanh(logits / cap)`` or ``None``.
        q_segment_ids: ``[B, Sq]`` int32 or ``None``.
        kv_segment_ids: ``[B, Sk]`` int32 or ``None``.
        bias: ``None`` or broadcastable to ``[B, Hq, Sq, Sk]``.
        sinks: ``None`` or ``[Hq]`` sink logits (in each seen row's denominator once).
        precision: ``"default"``, ``"high"`` or ``"highest"``: of the float32 products.
        cfg: Block sizes; ``None`` uses :func:`heuristic_config`.

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    batch, q_len, q_heads, _ = q.shape
    kv_len, v_dim = k.shape[1], v.shape[3]
    if min(batch, q_len, q_heads, kv_len, v_dim) == 0:
        return jnp.zeros((batch, q_len, q_heads, v_dim), q.dtype)
    st, q_segment_ids, kv_segment_ids = _static(q, k, v, causal, softmax_scale, sliding_window, logits_soft_cap,
                                                q_segment_ids, kv_segment_ids, precision, cfg)
    out: jax.Array = _flash(st, q, k, v, q_segment_ids, kv_segment_ids, bias, sinks)
    return out


def flash_attention_lse(
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
    sinks: jax.Array | None = None,
    precision: str = "highest",
    cfg: FlashAttentionConfig | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`flash_attention` plus the float32 log-sum-exp ``[B, Hq, Sq]`` (``-inf`` for empty rows).

    Differentiable in both outputs (the ``ejk.flash_attention_lse`` contract); with ``sinks`` the lse
    includes them.
    """
    batch, q_len, q_heads, _ = q.shape
    kv_len, v_dim = k.shape[1], v.shape[3]
    if min(batch, q_len, q_heads, kv_len, v_dim) == 0:
        out = jnp.zeros((batch, q_len, q_heads, v_dim), q.dtype)
        return out, jnp.full((batch, q_heads, q_len), -jnp.inf, jnp.float32)
    st, q_segment_ids, kv_segment_ids = _static(q, k, v, causal, softmax_scale, sliding_window, logits_soft_cap,
                                                q_segment_ids, kv_segment_ids, precision, cfg)
    out, lse = _flash_lse(st, q, k, v, q_segment_ids, kv_segment_ids, bias, sinks)
    return out, lse


def _static(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, softmax_scale: float,
            sliding_window: tuple[int, int] | None, logits_soft_cap: float | None, q_segment_ids: Any,
            kv_segment_ids: Any, precision: str, cfg: FlashAttentionConfig | None) -> tuple[_Static, Any, Any]:
    q_len, kv_len = q.shape[1], k.shape[1]
    cfg = heuristic_config(q, k, v) if cfg is None else cfg
    st = _Static(
        causal=bool(causal),
        scale=float(softmax_scale),
        window=None if sliding_window is None else (int(sliding_window[0]), int(sliding_window[1])),
        cap=None if logits_soft_cap is None else float(logits_soft_cap),
        block_q=min(cfg.block_q, q_len),
        block_k=min(cfg.block_k, kv_len),
        precision=str(precision),
    )
    if q_segment_ids is None or kv_segment_ids is None:
        q_segment_ids = kv_segment_ids = None
    return st, q_segment_ids, kv_segment_ids


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------

_CPU_CANDIDATES = ((128, 128), (128, 256), (256, 256), (256, 512), (512, 256), (512, 512), (1024, 512), (64, 128))
# On an H100 (benchmarks/results/attention_gpu_h100.md) 1024 x 1024 beat 512 x 512, 1024 x 512 and
# 256 x 512 for every shape measured: accelerators want few, large block matmuls.
_ACCELERATOR_CANDIDATES = ((1024, 1024), (512, 512), (1024, 512), (512, 1024), (2048, 1024), (1024, 2048),
                          (256, 512), (2048, 2048))


def _candidates() -> tuple[tuple[int, int], ...]:
    return _CPU_CANDIDATES if jax.default_backend() == "cpu" else _ACCELERATOR_CANDIDATES


def _lengths(q: Any, k: Any) -> tuple[int, int]:
    return int(q.shape[1]), int(k.shape[1])


def config_space(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> list[FlashAttentionConfig]:
    """Autotuning candidates: a few ``(block_q, block_k)`` pairs clamped to the lengths.

    Args:
        q: Anything with ``.shape`` ``[B, Sq, Hq, D]`` (e.g. ``jax.ShapeDtypeStruct``).
        k: ``[B, Sk, Hkv, D]``.
        v: ``[B, Sk, Hkv, Dv]`` (unused).
        *_: Further abstract arguments of the op (segment ids, bias), ignored.

    Returns:
        At most eight distinct configs, in a stable order.
    """
    del v
    q_len, kv_len = _lengths(q, k)
    seen: dict[FlashAttentionConfig, None] = {}
    for bq, bk in _candidates():
        cfg = FlashAttentionConfig(block_q=max(1, min(bq, q_len)), block_k=max(1, min(bk, kv_len)))
        seen.setdefault(cfg, None)
    return list(seen)


def heuristic_config(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> FlashAttentionConfig:
    """A default by shape and backend, clamped to the sequence lengths.

    On the CPU, 256 x 256 blocks keep a block's logits cache-sized (measured fastest for the
    backward pass); on accelerators, 1024 x 1024 blocks give larger matmuls and fewer loop steps
    (fastest of the configs measured on an H100, forward and backward).

    Args:
        q: ``[B, Sq, Hq, D]`` (anything with ``.shape``).
        k: ``[B, Sk, Hkv, D]``.
        v: ``[B, Sk, Hkv, Dv]`` (unused).
        *_: Further abstract arguments of the op, ignored.

    Returns:
        The config.
    """
    del v
    q_len, kv_len = _lengths(q, k)
    block = 256 if jax.default_backend() == "cpu" else 1024
    return FlashAttentionConfig(block_q=max(1, min(block, q_len)), block_k=max(1, min(block, kv_len)))
