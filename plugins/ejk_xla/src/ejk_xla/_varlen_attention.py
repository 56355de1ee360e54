"""Packed variable-length flash attention in plain ``jax.numpy`` / ``lax``: no ``[T, T]`` mask, any backend.

Every packed query row ``i`` sees one interval of packed keys, ``[lo[i], hi[i])``
(:func:`ejk.plugin.varlen_row_ranges`, computed from the offsets in O(T)); both ends are
non-decreasing in ``i``. So a block of query rows sees the key blocks covering
``[lo[first row], hi[last row])``, and the query rows that see a key block form a contiguous range
found by ``searchsorted``: the loops run only over blocks inside the band of the sequences
(block-diagonal, narrowed further by causal masks and windows), with data-dependent bounds, so a
new packing of the same shapes reuses the compiled program.

The forward pass scans over query blocks and, for each, loops over its key blocks with an online
softmax (float32 running max, sum and accumulator; with sinks the running max and sum start at
the sink's logit and ``1``). A ``jax.custom_vjp`` saves the inputs, the output and the row
log-sum-exp (sink included); the backward pass scans over key blocks (accumulating ``dk``,
``dv``) and, for each, loops over the query blocks that see it, adding into a float32 ``dq``
buffer (FlashAttention-2 style). ``d sinks[h] = -Σ_rows e^{sinks[h] - lse} · rowsum(dO · O)``.

Grouped-query attention without repeating ``k`` / ``v``: query blocks are ``[Hkv, G, bq, D]``.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import cdiv, cotangent_like, positive_int, varlen_row_ranges, varying_like

__all__ = ["VarlenAttentionConfig", "config_space", "flash_attention_varlen", "heuristic_config"]


@attrs.frozen(kw_only=True)
class VarlenAttentionConfig:
    """Block sizes of the XLA varlen attention.

    Attributes:
        block_q: Packed query rows per block (clamped to ``Tq``).
        block_k: Packed key rows per block (clamped to ``Tk``).
    """

    block_q: int = attrs.field(validator=positive_int)
    block_k: int = attrs.field(validator=positive_int)


@attrs.frozen
class _Static:
    scale: float
    cap: float | None
    precision: str
    block_q: int
    block_k: int


def _dot(st: _Static, spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    precision = lax.Precision[st.precision.upper()] if a.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=precision)


def _pad_rows(x: jax.Array, rows: int, value: Any = 0) -> jax.Array:
    extra = rows - x.shape[0]
    if extra == 0:
        return x
    return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1), constant_values=value)


def _q_blocks(x: jax.Array, kv_heads: int, block: int) -> jax.Array:
    """``[T, Hq, ...]`` → ``[n, Hkv, G, block, ...]`` (zero-padded)."""
    tokens, heads = x.shape[:2]
    n = cdiv(tokens, block)
    x = _pad_rows(x, n * block).reshape(n, block, kv_heads, heads // kv_heads, *x.shape[2:])
    return jnp.moveaxis(x, 1, 3)


def _from_q_blocks(x: jax.Array, tokens: int) -> jax.Array:
    n, kv_heads, groups, block = x.shape[:4]
    return jnp.moveaxis(x, 3, 1).reshape(n * block, kv_heads * groups, *x.shape[4:])[:tokens]


def _kv_blocks(x: jax.Array, block: int) -> jax.Array:
    """``[T, Hkv, D]`` → ``[n, Hkv, block, D]`` (zero-padded)."""
    n = cdiv(x.shape[0], block)
    return jnp.swapaxes(_pad_rows(x, n * block).reshape(n, block, *x.shape[1:]), 1, 2)


def _from_kv_blocks(x: jax.Array, tokens: int) -> jax.Array:
    n, heads, block, dim = x.shape
    return jnp.swapaxes(x, 1, 2).reshape(n * block, heads, dim)[:tokens]


def _scores(st: _Static, q_blk: jax.Array, k_blk: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """Float32 logits ``[Hkv, G, bq, bk]`` and ``tanh`` of the soft cap (for the backward)."""
    s = _dot(st, "hgqd,hkd->hgqk", q_blk, k_blk) * st.scale
    if st.cap is None:
        return s, None
    tanh = jnp.tanh(s / st.cap)
    return st.cap * tanh, tanh


def _mask(st: _Static, j: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Visibility ``[bq, bk]`` of key block ``j`` for rows with intervals ``lo``, ``hi`` (``[bq]``)."""
    cols = j * st.block_k + jnp.arange(st.block_k, dtype=jnp.int32)
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


def _finite_or_zero(x: jax.Array) -> jax.Array:
    return jnp.where(x == -jnp.inf, 0.0, x)


def _forward(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, lo: jax.Array, hi: jax.Array,
             sinks: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Output ``[Tq, Hq, Dv]`` and the row log-sum-exp ``[nq, Hkv, G, bq]`` (``+inf`` for empty rows)."""
    tq, kv_heads, tk = q.shape[0], k.shape[1], k.shape[0]
    qb, kb, vb = _q_blocks(q, kv_heads, st.block_q), _kv_blocks(k, st.block_k), _kv_blocks(v, st.block_k)
    nq = qb.shape[0]
    lob = _pad_rows(lo, nq * st.block_q, tk).reshape(nq, st.block_q)
    hib = _pad_rows(hi, nq * st.block_q, tk).reshape(nq, st.block_q)
    row_shape = qb.shape[1:4]
    if sinks is None:
        m0, l0 = jnp.full(row_shape, -jnp.inf, jnp.float32), jnp.zeros(row_shape, jnp.float32)
    else:
        sink = sinks.astype(jnp.float32).reshape(kv_heads, -1)[..., None]
        m0, l0 = jnp.broadcast_to(sink, row_shape), jnp.ones(row_shape, jnp.float32)

    def q_step(_: None, xs: tuple[jax.Array, ...]) -> tuple[None, tuple[jax.Array, jax.Array]]:
        q_blk, lo_blk, hi_blk = xs

        def k_step(j: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            m, total, acc = carry
            s, _ = _scores(st, q_blk, kb[j])
            s = jnp.where(_mask(st, j, lo_blk, hi_blk), s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = _finite_or_zero(m_new)
            p = jnp.exp(s - m_safe[..., None])
            alpha = jnp.exp(m - m_safe)
            pv = _dot(st, "hgqk,hkd->hgqd", p.astype(v.dtype), vb[j])
            return m_new, alpha * total + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

        init = varying_like((m0, l0, jnp.zeros((*row_shape, v.shape[2]), jnp.float32)), q_blk, kb, vb, sinks)
        first = lo_blk[0] // st.block_k
        last = jnp.where(hi_blk[-1] > lo_blk[0], (hi_blk[-1] + st.block_k - 1) // st.block_k, first)
        m, total, acc = lax.fori_loop(first, last, k_step, init)
        seen = total > 0
        safe_total = jnp.where(seen, total, 1.0)
        out = acc / safe_total[..., None]
        lse = jnp.where(seen, _finite_or_zero(m) + jnp.log(safe_total), jnp.inf)
        return None, (out.astype(q.dtype), lse)

    _, (out_b, lse) = lax.scan(q_step, None, (qb, lob, hib))
    return _from_q_blocks(out_b, tq), lse


def _backward(st: _Static, residuals: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, lo, hi, sinks, out, lse = residuals
    tq, kv_heads, tk = q.shape[0], k.shape[1], k.shape[0]
    qb, dob = _q_blocks(q, kv_heads, st.block_q), _q_blocks(d_out.astype(q.dtype), kv_heads, st.block_q)
    nq = qb.shape[0]
    rows = nq * st.block_q
    lo_p, hi_p = _pad_rows(lo, rows, tk), _pad_rows(hi, rows, tk)
    lob, hib = lo_p.reshape(nq, st.block_q), hi_p.reshape(nq, st.block_q)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [Tq, Hq]
    deltab = _q_blocks(delta, kv_heads, st.block_q)
    kb, vb = _kv_blocks(k, st.block_k), _kv_blocks(v, st.block_k)
    nk = kb.shape[0]
    starts = jnp.arange(nk, dtype=jnp.int32) * st.block_k
    # Rows that see key block j: hi > start and lo < end, a contiguous range (lo, hi non-decreasing).
    q_first = jnp.searchsorted(hi_p, starts, side="right").astype(jnp.int32) // st.block_q
    q_end = jnp.searchsorted(lo_p, starts + st.block_k, side="left").astype(jnp.int32)
    q_last = jnp.maximum((q_end + st.block_q - 1) // st.block_q, q_first)

    def k_step(dq_buf: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        j, k_blk, v_blk, first, last = xs

        def q_step(i: jax.Array, inner: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            dk, dv, dq_buf = inner
            q_blk, do_blk = qb[i], dob[i]
            s, tanh = _scores(st, q_blk, k_blk)
            s = jnp.where(_mask(st, j, lob[i], hib[i]), s, -jnp.inf)
            p = jnp.exp(s - lse[i][..., None])  # 0 where masked; lse = +inf for empty rows
            dv = dv + _dot(st, "hgqk,hgqd->hkd", p.astype(do_blk.dtype), do_blk)
            dp = _dot(st, "hgqd,hkd->hgqk", do_blk, v_blk)
            ds = p * (dp - deltab[i][..., None])
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)
            ds = (ds * st.scale).astype(q.dtype)
            dq_i = _dot(st, "hgqk,hkd->hgqd", ds, k_blk)
            dk = dk + _dot(st, "hgqk,hgqd->hkd", ds, q_blk)
            return dk, dv, lax.dynamic_update_index_in_dim(dq_buf, dq_buf[i] + dq_i, i, axis=0)

        init = (*varying_like((jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(v_blk.shape, jnp.float32)),
                              qb, k_blk, v_blk, dob, lse), dq_buf)
        dk, dv, dq_buf = lax.fori_loop(first, last, q_step, init)
        return dq_buf, (dk.astype(k.dtype), dv.astype(v.dtype))

    dq0 = varying_like(jnp.zeros(qb.shape, jnp.float32), qb, kb, vb, dob, lse)
    xs = (jnp.arange(nk, dtype=jnp.int32), kb, vb, q_first, q_last)
    dq_buf, (dkb, dvb) = lax.scan(k_step, dq0, xs)
    dq = _from_q_blocks(dq_buf, tq).astype(q.dtype)
    d_sinks = None
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(kv_heads, -1)[None, :, :, None]
        weight = jnp.exp(sink - lse)  # lse includes the sink: finite on every row
        d_sinks = cotangent_like(-jnp.sum(weight * deltab, axis=(0, 3)).reshape(-1).astype(sinks.dtype), sinks)
    return dq, _from_kv_blocks(dkb, tk), _from_kv_blocks(dvb, tk), None, None, d_sinks


def _fa(st: _Static, q: Any, k: Any, v: Any, lo: Any, hi: Any, sinks: Any) -> jax.Array:
    return _forward(st, q, k, v, lo, hi, sinks)[0]


def _fa_fwd(st: _Static, q: Any, k: Any, v: Any, lo: Any, hi: Any, sinks: Any) -> tuple[jax.Array, Any]:
    out, lse = _forward(st, q, k, v, lo, hi, sinks)
    return out, (q, k, v, lo, hi, sinks, out, lse)


_varlen = jax.custom_vjp(_fa, nondiff_argnums=(0,))
_varlen.defvjp(_fa_fwd, _backward)


def flash_attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    sinks: jax.Array | None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    precision: str,
    cfg: VarlenAttentionConfig | None = None,
) -> jax.Array:
    """Packed varlen attention (arguments normalised, see KERNEL_CONTRACT.md); ``max_seqlen_*`` unused.

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del max_seqlen_q, max_seqlen_k
    tq, hq, _ = q.shape
    tk, dv = v.shape[0], v.shape[2]
    if min(tq, hq, tk, dv) == 0:
        return jnp.zeros((tq, hq, dv), q.dtype)
    cfg = heuristic_config(q, k, v) if cfg is None else cfg
    st = _Static(scale=float(softmax_scale), cap=None if logits_soft_cap is None else float(logits_soft_cap),
                 precision=precision, block_q=max(1, min(cfg.block_q, tq)), block_k=max(1, min(cfg.block_k, tk)))
    lo, hi = varlen_row_ranges(cu_seqlens_q, cu_seqlens_k, tq, tk, causal=causal, sliding_window=sliding_window)
    out: jax.Array = _varlen(st, q, k, v, lo, hi, sinks)
    return out


_CPU_CANDIDATES = ((128, 128), (256, 256), (128, 256), (256, 512), (512, 512))
_ACCELERATOR_CANDIDATES = ((512, 512), (1024, 1024), (256, 512), (1024, 512), (512, 1024))


def config_space(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> list[VarlenAttentionConfig]:
    """Autotuning candidates: a few ``(block_q, block_k)`` pairs clamped to the packed lengths."""
    del v
    tq, tk = int(q.shape[0]), int(k.shape[0])
    candidates = _CPU_CANDIDATES if jax.default_backend() == "cpu" else _ACCELERATOR_CANDIDATES
    seen: dict[VarlenAttentionConfig, None] = {}
    for bq, bk in candidates:
        seen.setdefault(VarlenAttentionConfig(block_q=max(1, min(bq, tq)), block_k=max(1, min(bk, tk))), None)
    return list(seen)


def heuristic_config(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> VarlenAttentionConfig:
    """256-row blocks on the CPU, 512 on accelerators (smaller than dense attention's: blocks that
    straddle sequence boundaries compute masked work), clamped to the packed lengths."""
    del v
    block = 256 if jax.default_backend() == "cpu" else 512
    return VarlenAttentionConfig(block_q=max(1, min(block, int(q.shape[0]))),
                                 block_k=max(1, min(block, int(k.shape[0]))))
