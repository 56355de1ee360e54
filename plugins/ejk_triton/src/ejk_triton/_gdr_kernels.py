# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""The Triton kernels of the chunked gated delta rule (see ``_gated_delta_rule`` for the algorithm).

The inputs (``q, k, v, g, β``), the output and their gradients keep the caller's tokens (``[N_tok, H, D]``,
sequences one after another); a chunk is the ``n ≤ C`` tokens from ``t0`` (``_chunk_tokens``: per-chunk
kernels read both from ``tok``; per-sequence kernels count ``t0 = bos + j·C`` from the sequence's bounds
``seq``), the rows past ``n`` masked (zeros: they leave the state unchanged). Everything between kernels sits
in rows of ``C``-token chunks: row ``r = chunk·C + i`` of a ``[R, H, D]`` array. Inputs first, outputs
last, ``constexpr`` keywords (jax-triton's convention). ``PREC`` is ``tl.dot``'s ``input_precision`` for
products of float32 intermediates, ``IN_PREC`` for products of the inputs (16-bit inputs are multiplied in
their dtype, exactly, into float32).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["gdr_dqkw_kernel", "gdr_dv_local_kernel", "gdr_output_kernel", "gdr_prep_kernel", "gdr_state_bwd_kernel",
           "gdr_state_kernel", "gdr_wy_bwd_kernel"]


@triton.jit
def _rows(ptr, c, h, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr, col0):
    """Pointers and mask of chunk ``c``'s ``[C, BD]`` tile of a ``[R, H, D]`` array (columns from ``col0``;
    int64 offsets)."""
    rows = tl.cast(c, tl.int64) * C + tl.arange(0, C)
    cols = col0 + tl.arange(0, BD)
    return ptr + (rows[:, None] * H + h) * D + cols[None, :], (cols < D)[None, :]


@triton.jit
def _toks(ptr, t0, n, h, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr, col0):
    """Pointers and mask of the ``[C, BD]`` tile of the ``n`` tokens from ``t0`` of a ``[N_tok, H, D]`` array
    (columns from ``col0``; rows past ``n`` masked; int64 offsets)."""
    i = tl.arange(0, C)
    cols = col0 + tl.arange(0, BD)
    return (ptr + ((t0 + i)[:, None] * H + h) * D + cols[None, :]), (i < n)[:, None] & (cols < D)[None, :]


@triton.jit
def _tok_vec(ptr, t0, n, h, H: tl.constexpr, C: tl.constexpr):
    """Pointers and mask of the ``[C]`` values of the ``n`` tokens from ``t0`` of a ``[N_tok, H]`` array."""
    i = tl.arange(0, C)
    return ptr + (t0 + i) * H + h, i < n


@triton.jit
def _chunk_tokens(tok_ptr, c):
    """Chunk ``c``'s first token (int64) and token count, from ``tok [2 · chunks]``."""
    return tl.load(tok_ptr + 2 * c).to(tl.int64), tl.load(tok_ptr + 2 * c + 1)


@triton.jit
def _gates(gc_ptr, c, h, H: tl.constexpr, C: tl.constexpr):
    """The chunk's cumulative log decays ``[C]`` and their last value."""
    rows = tl.cast(c, tl.int64) * C + tl.arange(0, C)
    gc = tl.load(gc_ptr + rows * H + h)
    return gc, tl.load(gc_ptr + (tl.cast(c, tl.int64) * C + C - 1) * H + h)


@triton.jit
def _decay(gc, C: tl.constexpr, STRICT: tl.constexpr):
    """``exp(gc_i − gc_j)`` below the diagonal (on it too unless ``STRICT``), zeros above."""
    i = tl.arange(0, C)
    keep = (i[:, None] > i[None, :]) if STRICT else (i[:, None] >= i[None, :])
    return tl.exp(tl.where(keep, gc[:, None] - gc[None, :], float("-inf")))


@triton.jit
def _inverse16(a):
    """``(I + a)⁻¹`` of a strictly lower-triangular ``[16, 16]`` ``a`` as ``(I − a)(I + a²)(I + a⁴)(I + a⁸)``
    (``a¹⁶ = 0``), with float32 products."""
    i = tl.arange(0, 16)
    x = tl.where(i[:, None] == i[None, :], 1.0, 0.0) - a
    p = tl.dot(a, a, input_precision="ieee")
    x += tl.dot(x, p, input_precision="ieee")
    p = tl.dot(p, p, input_precision="ieee")
    x += tl.dot(x, p, input_precision="ieee")
    p = tl.dot(p, p, input_precision="ieee")
    return x + tl.dot(x, p, input_precision="ieee")


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _block16(t_ptr, c, h, i: tl.constexpr, j: tl.constexpr, H: tl.constexpr, C: tl.constexpr):
    """Pointers of block ``(i, j)`` (16 x 16) of chunk ``c``'s ``[C, C]`` matrix in a ``[R, H, C]`` array."""
    rows = tl.cast(c, tl.int64) * C + i * 16 + tl.arange(0, 16)
    return t_ptr + (rows[:, None] * H + h) * C + j * 16 + tl.arange(0, 16)[None, :]


@triton.jit
def gdr_prep_kernel(k_ptr, v_ptr, g_ptr, b_ptr, tok_ptr, w_ptr, u_ptr, gc_ptr, t_ptr, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    IN_PREC: tl.constexpr):
    """Per (chunk, head): ``gc = cumsum(g)``, ``T = (I + A)⁻¹`` with ``A = strictly_lower(β k kᵀ Γ)`` (float32,
    ``[R, H, C]``, zeros above the diagonal blocks), ``W = T β e^gc k`` and ``U = T β v`` (in ``w``'s dtype).

    Three phases through ``t`` (the program's own rows, re-read after a barrier): ``A`` as one product; ``T``
    from 16-token blocks, each diagonal block inverted by products (:func:`_inverse16`), the blocks below it
    from ``T_ij = −T_ii Σ_{j≤m<i} A_im T_mj``; then ``W`` and ``U`` as ``[C, C] x [C, D]`` products.
    ``C`` is 16, 32 or 64.
    """
    c, h = tl.program_id(0), tl.program_id(1)
    LOW: tl.constexpr = w_ptr.dtype.element_ty
    NB: tl.constexpr = C // 16
    i = tl.arange(0, C)
    rows = tl.cast(c, tl.int64) * C + i
    t0, n = _chunk_tokens(tok_ptr, c)
    gp, gm = _tok_vec(g_ptr, t0, n, h, H, C)
    gc = tl.cumsum(tl.load(gp, mask=gm, other=0.0).to(tl.float32), 0)
    tl.store(gc_ptr + rows * H + h, gc)
    bp, _ = _tok_vec(b_ptr, t0, n, h, H, C)
    beta = tl.load(bp, mask=gm, other=0.0).to(tl.float32)
    kp, km = _toks(k_ptr, t0, n, h, H, K, C, BK, 0)
    k = tl.load(kp, mask=km, other=0.0)
    tp = t_ptr + (rows[:, None] * H + h) * C + i[None, :]
    tl.store(tp, tl.dot(k, tl.trans(k), input_precision=IN_PREC) * beta[:, None] * _decay(gc, C, True))
    tl.debug_barrier()  # A stored: read back as 16 x 16 blocks
    t00 = _inverse16(tl.load(_block16(t_ptr, c, h, 0, 0, H, C)))
    if NB >= 2:
        a10 = tl.load(_block16(t_ptr, c, h, 1, 0, H, C))
        a11 = tl.load(_block16(t_ptr, c, h, 1, 1, H, C))
    if NB >= 4:
        a20 = tl.load(_block16(t_ptr, c, h, 2, 0, H, C))
        a21 = tl.load(_block16(t_ptr, c, h, 2, 1, H, C))
        a22 = tl.load(_block16(t_ptr, c, h, 2, 2, H, C))
        a30 = tl.load(_block16(t_ptr, c, h, 3, 0, H, C))
        a31 = tl.load(_block16(t_ptr, c, h, 3, 1, H, C))
        a32 = tl.load(_block16(t_ptr, c, h, 3, 2, H, C))
        a33 = tl.load(_block16(t_ptr, c, h, 3, 3, H, C))
    tl.debug_barrier()  # every block of A read: T overwrites it
    tl.store(_block16(t_ptr, c, h, 0, 0, H, C), t00)
    if NB >= 2:
        t11 = _inverse16(a11)
        t10 = -_mm(t11, _mm(a10, t00, PREC), PREC)
        tl.store(_block16(t_ptr, c, h, 1, 0, H, C), t10)
        tl.store(_block16(t_ptr, c, h, 1, 1, H, C), t11)
    if NB >= 4:
        t22 = _inverse16(a22)
        t21 = -_mm(t22, _mm(a21, t11, PREC), PREC)
        t20 = -_mm(t22, _mm(a20, t00, PREC) + _mm(a21, t10, PREC), PREC)
        tl.store(_block16(t_ptr, c, h, 2, 0, H, C), t20)
        tl.store(_block16(t_ptr, c, h, 2, 1, H, C), t21)
        tl.store(_block16(t_ptr, c, h, 2, 2, H, C), t22)
        t33 = _inverse16(a33)
        t32 = -_mm(t33, _mm(a32, t22, PREC), PREC)
        t31 = -_mm(t33, _mm(a31, t11, PREC) + _mm(a32, t21, PREC), PREC)
        t30 = -_mm(t33, _mm(a30, t00, PREC) + _mm(a31, t10, PREC) + _mm(a32, t20, PREC), PREC)
        tl.store(_block16(t_ptr, c, h, 3, 0, H, C), t30)
        tl.store(_block16(t_ptr, c, h, 3, 1, H, C), t31)
        tl.store(_block16(t_ptr, c, h, 3, 2, H, C), t32)
        tl.store(_block16(t_ptr, c, h, 3, 3, H, C), t33)
    tl.debug_barrier()  # T stored: W and U as products of the whole chunk
    t = tl.load(tp, mask=(i[None, :] // 16) <= (i[:, None] // 16), other=0.0).to(LOW)
    k = tl.load(kp, mask=km, other=0.0).to(tl.float32)
    w = tl.dot(t, (k * (beta * tl.exp(gc))[:, None]).to(LOW), input_precision=PREC)
    wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
    tl.store(wp, w.to(w_ptr.dtype.element_ty), mask=wm)
    vp, vm = _toks(v_ptr, t0, n, h, H, V, C, BV, 0)
    v = tl.load(vp, mask=vm, other=0.0).to(tl.float32)
    u = tl.dot(t, (v * beta[:, None]).to(LOW), input_precision=PREC)
    up, um = _rows(u_ptr, c, h, H, V, C, BV, 0)
    tl.store(up, u.to(u_ptr.dtype.element_ty), mask=um)


@triton.jit
def _state_tile(ptr, idx, h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, k0, col0):
    """Pointers and mask of the ``[BK, BV]`` tile (rows from ``k0``, columns from ``col0``) of state ``idx`` of
    ``[·, H, K, V]`` (int64 offsets)."""
    ik = k0 + tl.arange(0, BK)
    iv = col0 + tl.arange(0, BV)
    offsets = ((tl.cast(idx, tl.int64) * H + h) * K + ik[:, None]) * V + iv[None, :]
    return ptr + offsets, (ik < K)[:, None] & (iv < V)[None, :]


@triton.jit
def _k_cols(ptr, t0, n, h, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, HK: tl.constexpr, k0):
    """Pointers and mask of the ``[HK, C]`` tile ``kᵀ`` (rows ``k0 …`` of ``K``) of the ``n`` tokens from ``t0``
    of a ``[N_tok, H, K]`` array."""
    i = tl.arange(0, C)
    ik = k0 + tl.arange(0, HK)
    return ptr + ((t0 + i)[None, :] * H + h) * K + ik[:, None], (ik < K)[:, None] & (i < n)[None, :]


@triton.jit
def gdr_state_kernel(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, seq_ptr, order_ptr, h_ptr, final_ptr, n_ptr,
                     H: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_INIT: tl.constexpr, PREC: tl.constexpr):
    """Per (V block, sequence·head; the sequences in ``order``): the states entering each chunk of the sequence
    (stored in ``h``'s dtype), every chunk's ``N = U − W S`` (in ``n``'s dtype), then the final state (float32).

    ``S ← e^{gc_C} S + kᵀ (N e^{gc_C − gc})`` from ``init`` (or zeros) on the sequence's first chunk, the
    state held as two halves of ``K`` rows (``BK ≥ 32``: two independent products per half-step); the
    products take the stored dtype (16-bit inputs: 16-bit operands, float32 sums) and ``S`` stays float32.
    """
    col0 = tl.program_id(0) * BV
    n, h = tl.load(order_ptr + tl.program_id(1) // H), tl.program_id(1) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    bos, eos = tl.load(seq_ptr + n).to(tl.int64), tl.load(seq_ptr + n + 1).to(tl.int64)
    low = w_ptr.dtype.element_ty
    SPLIT: tl.constexpr = BK >= 32
    HK: tl.constexpr = BK // 2 if SPLIT else BK
    s1 = tl.zeros((HK, BV), tl.float32)
    s2 = tl.zeros((HK, BV), tl.float32)
    if HAS_INIT:
        ip, im = _state_tile(init_ptr, n, h, H, K, V, HK, BV, 0, col0)
        s1 = tl.load(ip, mask=im, other=0.0).to(tl.float32)
        if SPLIT:
            ip, im = _state_tile(init_ptr, n, h, H, K, V, HK, BV, HK, col0)
            s2 = tl.load(ip, mask=im, other=0.0).to(tl.float32)
    for c in range(c0, c1):
        hp, hm = _state_tile(h_ptr, c, h, H, K, V, HK, BV, 0, col0)
        tl.store(hp, s1.to(h_ptr.dtype.element_ty), mask=hm)
        wp, wm = _rows(w_ptr, c, h, H, K, C, HK, 0)
        ws = tl.dot(tl.load(wp, mask=wm, other=0.0), s1.to(low), input_precision=PREC)
        if SPLIT:
            hp, hm = _state_tile(h_ptr, c, h, H, K, V, HK, BV, HK, col0)
            tl.store(hp, s2.to(h_ptr.dtype.element_ty), mask=hm)
            wp, wm = _rows(w_ptr, c, h, H, K, C, HK, HK)
            ws = tl.dot(tl.load(wp, mask=wm, other=0.0), s2.to(low), ws, input_precision=PREC)
        up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
        new = tl.load(up, mask=um, other=0.0).to(tl.float32) - ws
        np_, nm = _rows(n_ptr, c, h, H, V, C, BV, col0)
        tl.store(np_, new.to(n_ptr.dtype.element_ty), mask=nm)
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        new = (new * tl.exp(g_end - gc)[:, None]).to(low)
        decay = tl.exp(g_end)
        t0 = bos + (c - c0) * C
        kp, km = _k_cols(k_ptr, t0, eos - t0, h, H, K, C, HK, 0)
        s1 = tl.dot(tl.load(kp, mask=km, other=0.0).to(low), new, s1 * decay, input_precision=PREC)
        if SPLIT:
            kp, km = _k_cols(k_ptr, t0, eos - t0, h, H, K, C, HK, HK)
            s2 = tl.dot(tl.load(kp, mask=km, other=0.0).to(low), new, s2 * decay, input_precision=PREC)
    fp, fm = _state_tile(final_ptr, n, h, H, K, V, HK, BV, 0, col0)
    tl.store(fp, s1, mask=fm)
    if SPLIT:
        fp, fm = _state_tile(final_ptr, n, h, H, K, V, HK, BV, HK, col0)
        tl.store(fp, s2, mask=fm)


@triton.jit
def gdr_output_kernel(q_ptr, k_ptr, n_ptr, gc_ptr, h_ptr, tok_ptr, o_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (chunk, head, V block): ``o = scale (e^gc ⊙ (q S) + lower(q kᵀ Γ) N)``, ``K`` walked in blocks of
    ``BK`` (``q S`` and ``q kᵀ`` accumulated, the loads pipelined)."""
    c, h, col0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BV
    low = n_ptr.dtype.element_ty
    t0, n = _chunk_tokens(tok_ptr, c)
    o = tl.zeros((C, BV), tl.float32)
    attn = tl.zeros((C, C), tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        qp, qm = _toks(q_ptr, t0, n, h, H, K, C, BK, kb * BK)
        kp, _ = _toks(k_ptr, t0, n, h, H, K, C, BK, kb * BK)
        q = tl.load(qp, mask=qm, other=0.0)
        attn = tl.dot(q, tl.trans(tl.load(kp, mask=qm, other=0.0)), attn, input_precision=IN_PREC)
        hp, hm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, kb * BK, col0)
        o = tl.dot(q.to(low), tl.load(hp, mask=hm, other=0.0), o, input_precision=PREC)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    attn = attn * _decay(gc, C, False)
    np_, nm = _rows(n_ptr, c, h, H, V, C, BV, col0)
    new = tl.load(np_, mask=nm, other=0.0)
    o = SCALE * (o * tl.exp(gc)[:, None] + tl.dot(attn.to(low), new, input_precision=PREC))
    op, om = _toks(o_ptr, t0, n, h, H, V, C, BV, col0)
    tl.store(op, o.to(o_ptr.dtype.element_ty), mask=om)


@triton.jit
def gdr_dv_local_kernel(q_ptr, k_ptr, gc_ptr, do_ptr, tok_ptr, dvl_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        IN_PREC: tl.constexpr):
    """Per (chunk, head, V block): the part of ``dN`` the chunk's own outputs give, ``scale Pᵀ dO`` with
    ``P = lower(q kᵀ Γ)`` (stored in ``dvl``'s dtype)."""
    c, h, col0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BV
    t0, n = _chunk_tokens(tok_ptr, c)
    qp, qm = _toks(q_ptr, t0, n, h, H, K, C, BK, 0)
    kp, km = _toks(k_ptr, t0, n, h, H, K, C, BK, 0)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    p = tl.dot(tl.load(qp, mask=qm, other=0.0), tl.trans(tl.load(kp, mask=km, other=0.0)),
               input_precision=IN_PREC) * _decay(gc, C, False)
    dp, dm = _toks(do_ptr, t0, n, h, H, V, C, BV, col0)
    d_o = tl.load(dp, mask=dm, other=0.0)
    dvl = SCALE * tl.dot(tl.trans(p.to(d_o.dtype)), d_o, input_precision=IN_PREC)
    op, om = _rows(dvl_ptr, c, h, H, V, C, BV, col0)
    tl.store(op, dvl.to(dvl_ptr.dtype.element_ty), mask=om)


@triton.jit
def _state_bwd_half(grad, q_ptr, w_ptr, d_o, neg_d_new, g_end, t0, n, c, h, H: tl.constexpr, K: tl.constexpr,
                    C: tl.constexpr, HK: tl.constexpr, k0, PREC: tl.constexpr):
    """Rows ``k0 … k0 + HK`` of the gradient of the state entering the chunk, ``e^{gc_C} dS' + qᵀ d_o − Wᵀ dN``
    (``d_o = scale e^gc ⊙ dO``, ``neg_d_new = −dN``)."""
    low = w_ptr.dtype.element_ty
    qp, qm = _k_cols(q_ptr, t0, n, h, H, K, C, HK, k0)
    wp, wm = _rows(w_ptr, c, h, H, K, C, HK, k0)
    grad = tl.dot(tl.load(qp, mask=qm, other=0.0).to(low), d_o, grad * tl.exp(g_end), input_precision=PREC)
    return tl.dot(tl.trans(tl.load(wp, mask=wm, other=0.0)), neg_d_new, grad, input_precision=PREC)


@triton.jit
def gdr_state_bwd_kernel(q_ptr, k_ptr, w_ptr, gc_ptr, do_ptr, dvl_ptr, dfinal_ptr, cstart_ptr, seq_ptr, order_ptr,
                         dh_ptr, dn_ptr, dinit_ptr, SCALE: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                         V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Per (V block, sequence·head; the sequences in ``order``), chunks in reverse: the gradient ``dS'`` of the
    state leaving each chunk (stored in ``dh``'s dtype) and the chunk's ``dN`` (in ``dn``'s).

    ``dN = dvl + e^{gc_C − gc} ⊙ (k dS')`` (the decay applied to the product's rows), and the state entering
    the chunk gets ``dS = scale qᵀ (e^gc ⊙ dO) + e^{gc_C} dS' − Wᵀ dN``; the first chunk's is the initial
    state's (float32).
    The gradient is held as two halves of ``K`` rows (``BK ≥ 32``), as the forward's state kernel holds ``S``.
    """
    col0 = tl.program_id(0) * BV
    n, h = tl.load(order_ptr + tl.program_id(1) // H), tl.program_id(1) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    bos, eos = tl.load(seq_ptr + n).to(tl.int64), tl.load(seq_ptr + n + 1).to(tl.int64)
    low = w_ptr.dtype.element_ty
    SPLIT: tl.constexpr = BK >= 32
    HK: tl.constexpr = BK // 2 if SPLIT else BK
    fp, fm = _state_tile(dfinal_ptr, n, h, H, K, V, HK, BV, 0, col0)
    g1 = tl.load(fp, mask=fm, other=0.0)
    g2 = tl.zeros((HK, BV), tl.float32)
    if SPLIT:
        fp, fm = _state_tile(dfinal_ptr, n, h, H, K, V, HK, BV, HK, col0)
        g2 = tl.load(fp, mask=fm, other=0.0)
    for i in range(0, c1 - c0):
        c = c1 - 1 - i
        t0 = bos + (c - c0) * C
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        k_decay = tl.exp(g_end - gc)
        hp, hm = _state_tile(dh_ptr, c, h, H, K, V, HK, BV, 0, col0)
        tl.store(hp, g1.to(dh_ptr.dtype.element_ty), mask=hm)
        kp, km = _toks(k_ptr, t0, eos - t0, h, H, K, C, HK, 0)
        k_ds = tl.dot(tl.load(kp, mask=km, other=0.0).to(low), g1.to(low), input_precision=PREC)
        if SPLIT:
            hp, hm = _state_tile(dh_ptr, c, h, H, K, V, HK, BV, HK, col0)
            tl.store(hp, g2.to(dh_ptr.dtype.element_ty), mask=hm)
            kp, km = _toks(k_ptr, t0, eos - t0, h, H, K, C, HK, HK)
            k_ds = tl.dot(tl.load(kp, mask=km, other=0.0).to(low), g2.to(low), k_ds, input_precision=PREC)
        lp, lm = _rows(dvl_ptr, c, h, H, V, C, BV, col0)
        d_new = k_ds * k_decay[:, None] + tl.load(lp, mask=lm, other=0.0).to(tl.float32)
        np_, nm = _rows(dn_ptr, c, h, H, V, C, BV, col0)
        tl.store(np_, d_new.to(dn_ptr.dtype.element_ty), mask=nm)
        dp, dm = _toks(do_ptr, t0, eos - t0, h, H, V, C, BV, col0)
        d_o = (tl.load(dp, mask=dm, other=0.0).to(tl.float32) * (SCALE * tl.exp(gc))[:, None]).to(low)
        neg_d_new = (-d_new).to(low)  # negated in float32 (the interpreter holds bfloat16 as raw bits)
        g1 = _state_bwd_half(g1, q_ptr, w_ptr, d_o, neg_d_new, g_end, t0, eos - t0, c, h, H, K, C, HK, 0, PREC)
        if SPLIT:
            g2 = _state_bwd_half(g2, q_ptr, w_ptr, d_o, neg_d_new, g_end, t0, eos - t0, c, h, H, K, C, HK, HK, PREC)
    ip, im = _state_tile(dinit_ptr, n, h, H, K, V, HK, BV, 0, col0)
    tl.store(ip, g1, mask=im)
    if SPLIT:
        ip, im = _state_tile(dinit_ptr, n, h, H, K, V, HK, BV, HK, col0)
        tl.store(ip, g2, mask=im)


@triton.jit
def gdr_dqkw_kernel(q_ptr, k_ptr, n_ptr, gc_ptr, h_ptr, dh_ptr, do_ptr, dn_ptr, tok_ptr, dq_ptr, dk_ptr, dw_ptr,
                    dgc_ptr,
                    SCALE: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (K block, chunk, head): ``dq``, the ``k`` gradient through ``P`` and ``S'`` (float32), ``dW = −dN Sᵀ``
    (in ``dw``'s dtype) and this K block's part of the ``gc`` gradient (``dgc [K blocks, R, H]``; the ``gc_C``
    terms on the last row).

    With ``dP = scale dO Nᵀ ⊙ lower(Γ)``: ``dq = scale e^gc ⊙ (dO Sᵀ) + dP k``, ``dk = dPᵀ q + e^{gc_C − gc} ⊙
    (N dS'ᵀ)``. ``V`` is walked in blocks.
    """
    kb, c, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k0 = kb * BK
    i = tl.arange(0, C)
    low = q_ptr.dtype.element_ty
    t0, n = _chunk_tokens(tok_ptr, c)
    qp, qm = _toks(q_ptr, t0, n, h, H, K, C, BK, k0)
    kp, km = _toks(k_ptr, t0, n, h, H, K, C, BK, k0)
    q = tl.load(qp, mask=qm, other=0.0)
    k = tl.load(kp, mask=km, other=0.0)
    gc, g_end = _gates(gc_ptr, c, h, H, C)
    d_qs = tl.zeros((C, BK), tl.float32)
    d_kd = tl.zeros((C, BK), tl.float32)
    d_w = tl.zeros((C, BK), tl.float32)
    d_p = tl.zeros((C, C), tl.float32)
    d_end = tl.sum(tl.zeros((C,), tl.float32), 0)
    for vb in range(0, tl.cdiv(V, BV)):
        col0 = vb * BV
        ik = k0 + tl.arange(0, BK)
        iv = col0 + tl.arange(0, BV)
        sm = (ik < K)[:, None] & (iv < V)[None, :]
        offs = ((tl.cast(c, tl.int64) * H + h) * K + ik[:, None]) * V + iv[None, :]
        state = tl.load(h_ptr + offs, mask=sm, other=0.0)
        d_state = tl.load(dh_ptr + offs, mask=sm, other=0.0)
        np_, nm = _rows(n_ptr, c, h, H, V, C, BV, col0)
        new = tl.load(np_, mask=nm, other=0.0)
        dop, dom = _toks(do_ptr, t0, n, h, H, V, C, BV, col0)
        d_o = tl.load(dop, mask=dom, other=0.0).to(low)
        dnp, dnm = _rows(dn_ptr, c, h, H, V, C, BV, col0)
        d_new = tl.load(dnp, mask=dnm, other=0.0)
        d_qs += tl.dot(d_o, tl.trans(state), input_precision=PREC)
        d_p += tl.dot(d_o, tl.trans(new), input_precision=PREC)
        d_kd += tl.dot(new, tl.trans(d_state), input_precision=PREC)
        d_w -= tl.dot(d_new, tl.trans(state), input_precision=PREC)
        d_end += tl.sum(tl.sum(d_state.to(tl.float32) * state.to(tl.float32), 1), 0)
    e_gc = tl.exp(gc)
    k_decay = tl.exp(g_end - gc)
    lower = _decay(gc, C, False)
    d_p = SCALE * d_p * lower  # zero above the diagonal
    d_qs = SCALE * d_qs * e_gc[:, None]
    qf, kf = q.to(tl.float32), k.to(tl.float32)
    d_q = d_qs + tl.dot(d_p.to(low), k, input_precision=IN_PREC)
    d_k = tl.dot(tl.trans(d_p.to(low)), q, input_precision=IN_PREC) + d_kd * k_decay[:, None]
    z = d_p * tl.dot(q, tl.trans(k), input_precision=IN_PREC)
    r = tl.sum(d_kd * kf, 1) * k_decay
    d_gc = tl.sum(d_qs * qf, 1) + tl.sum(z, 1) - tl.sum(z, 0) - r
    d_gc += tl.where(i == C - 1, tl.sum(r, 0) + d_end * tl.exp(g_end), 0.0)
    rows = tl.cast(c, tl.int64) * C + i
    dqp, _ = _toks(dq_ptr, t0, n, h, H, K, C, BK, k0)
    tl.store(dqp, d_q.to(dq_ptr.dtype.element_ty), mask=qm)
    dkp, rm = _rows(dk_ptr, c, h, H, K, C, BK, k0)
    tl.store(dkp, d_k, mask=rm)
    dwp, _ = _rows(dw_ptr, c, h, H, K, C, BK, k0)
    tl.store(dwp, d_w.to(dw_ptr.dtype.element_ty), mask=rm)
    tl.store(dgc_ptr + (kb * tl.num_programs(1) * C + rows) * H + h, d_gc)


@triton.jit
def gdr_wy_bwd_kernel(k_ptr, v_ptr, b_ptr, gc_ptr, t_ptr, dw_ptr, dn_ptr, dkp_ptr, dgc_ptr, tok_ptr, dk_ptr, dv_ptr,
                      db_ptr, dg_ptr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr, PREC: tl.constexpr,
                      IN_PREC: tl.constexpr):
    """Per (chunk, head): the gradients through ``W = T β e^gc k``, ``U = T β v`` and ``T = (I + A)⁻¹``.

    ``dU = dN``; ``dT = dW (β e^gc k)ᵀ + dU (β v)ᵀ``, ``dA = −strictly_lower(Tᵀ dT Tᵀ)``; ``dk`` adds to the
    partial ``dkp``; ``dv``, ``dβ``, and ``dg``: the ``gc`` gradient of these terms plus the ``KB`` partial
    ones of ``dgc [KB, R, H]``, summed backwards over the chunk (``gc`` is the chunk's cumulative sum). The
    products take the inputs' dtype (16-bit inputs: 16-bit operands, float32 sums). ``V`` is walked in blocks.
    """
    c, h = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, C)
    rows = tl.cast(c, tl.int64) * C + i
    low = k_ptr.dtype.element_ty
    t0, n = _chunk_tokens(tok_ptr, c)
    kp, km = _toks(k_ptr, t0, n, h, H, K, C, BK, 0)
    k = tl.load(kp, mask=km, other=0.0)
    kf = k.to(tl.float32)
    bp, bm = _tok_vec(b_ptr, t0, n, h, H, C)
    beta = tl.load(bp, mask=bm, other=0.0).to(tl.float32)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    e_gc = tl.exp(gc)
    tm = (i[None, :] // 16) <= (i[:, None] // 16)
    t = tl.load(t_ptr + (rows[:, None] * H + h) * C + i[None, :], mask=tm, other=0.0).to(low)
    dwp, rm = _rows(dw_ptr, c, h, H, K, C, BK, 0)
    d_w = tl.load(dwp, mask=rm, other=0.0).to(low)
    d_t = tl.dot(d_w, tl.trans((kf * (beta * e_gc)[:, None]).to(low)), input_precision=PREC)
    d_kb = tl.dot(tl.trans(t), d_w, input_precision=PREC)
    d_beta = tl.sum(d_kb * kf, 1) * e_gc
    d_gc = d_beta * beta
    for vb in range(0, tl.cdiv(V, BV)):
        col0 = vb * BV
        vp, vm = _toks(v_ptr, t0, n, h, H, V, C, BV, col0)
        v = tl.load(vp, mask=vm, other=0.0).to(tl.float32)
        np_, nm = _rows(dn_ptr, c, h, H, V, C, BV, col0)
        d_u = tl.load(np_, mask=nm, other=0.0).to(low)
        d_t += tl.dot(d_u, tl.trans((v * beta[:, None]).to(low)), input_precision=PREC)
        d_vb = tl.dot(tl.trans(t), d_u, input_precision=PREC)
        dvp = _toks(dv_ptr, t0, n, h, H, V, C, BV, col0)[0]
        tl.store(dvp, (d_vb * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=vm)
        d_beta += tl.sum(d_vb * v, 1)
    strict = _decay(gc, C, True)
    d_a = -tl.dot(tl.dot(tl.trans(t), d_t.to(low), input_precision=PREC).to(low), tl.trans(t), input_precision=PREC)
    kk = tl.dot(k, tl.trans(k), input_precision=IN_PREC)
    d_kk = d_a * strict  # zero on and above the diagonal
    y = d_kk * kk
    d_beta += tl.sum(y, 1)
    y = y * beta[:, None]  # dA ⊙ A
    d_gc += tl.sum(y, 1) - tl.sum(y, 0)
    m = d_kk * beta[:, None]
    pp, _ = _rows(dkp_ptr, c, h, H, K, C, BK, 0)
    d_k = (tl.load(pp, mask=rm, other=0.0) + d_kb * (beta * e_gc)[:, None]
           + tl.dot((m + tl.trans(m)).to(low), k, input_precision=PREC))
    dkp2, _ = _toks(dk_ptr, t0, n, h, H, K, C, BK, 0)
    tl.store(dkp2, d_k.to(dk_ptr.dtype.element_ty), mask=km)
    dbp, _ = _tok_vec(db_ptr, t0, n, h, H, C)
    tl.store(dbp, d_beta.to(db_ptr.dtype.element_ty), mask=bm)
    for kb in range(0, KB):
        d_gc += tl.load(dgc_ptr + (kb * tl.num_programs(0) * C + rows) * H + h)
    dgp, _ = _tok_vec(dg_ptr, t0, n, h, H, C)
    tl.store(dgp, (tl.sum(d_gc, 0) - tl.cumsum(d_gc, 0) + d_gc).to(dg_ptr.dtype.element_ty), mask=bm)

