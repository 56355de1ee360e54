# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""The Triton kernels of the chunked gated delta rule (see ``_gated_delta_rule`` for the algorithm).

Tokens sit in rows of ``C``-token chunks: row ``r = chunk·C + i`` of a ``[R, H, D]`` array. Inputs
first, outputs last, ``constexpr`` keywords (jax-triton's convention). ``PREC`` is ``tl.dot``'s
``input_precision`` for products of float32 intermediates, ``IN_PREC`` for products of the inputs
(16-bit inputs are multiplied in their dtype, exactly, into float32).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["gdr_dqkw_kernel", "gdr_dv_local_kernel", "gdr_output_kernel", "gdr_prep_kernel", "gdr_prep_t_kernel",
           "gdr_state_bwd_kernel", "gdr_state_kernel", "gdr_state_new_kernel", "gdr_wy_bwd_kernel"]


@triton.jit
def _rows(ptr, c, h, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr, col0):
    """Pointers and mask of chunk ``c``'s ``[C, BD]`` tile of a ``[R, H, D]`` array (columns from ``col0``;
    int64 offsets)."""
    rows = tl.cast(c, tl.int64) * C + tl.arange(0, C)
    cols = col0 + tl.arange(0, BD)
    return ptr + (rows[:, None] * H + h) * D + cols[None, :], (cols < D)[None, :]


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
def _sub(ptr, c, h, j, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr, col0):
    """Pointers and mask of rows ``16·j … 16·j + 15`` of chunk ``c``'s ``[C, BD]`` tile (int64 offsets)."""
    rows = tl.cast(c, tl.int64) * C + j * 16 + tl.arange(0, 16)
    cols = col0 + tl.arange(0, BD)
    return ptr + (rows[:, None] * H + h) * D + cols[None, :], (cols < D)[None, :]


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
def _gates16(g_ptr, b_ptr, gc_ptr, c, h, j, offset, H: tl.constexpr, C: tl.constexpr):
    """Sub-block ``j`` (16 tokens) of a chunk: ``gc`` (stored), ``β`` and the running sum of the log decays."""
    rows = tl.cast(c, tl.int64) * C + j * 16 + tl.arange(0, 16)
    g = tl.load(g_ptr + rows * H + h).to(tl.float32)
    gc = tl.cumsum(g, 0) + offset
    tl.store(gc_ptr + rows * H + h, gc)
    return gc, tl.load(b_ptr + rows * H + h).to(tl.float32), offset + tl.sum(g, 0)


@triton.jit
def _load16(ptr, c, h, j, H: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr):
    p, m = _sub(ptr, c, h, j, H, D, C, BD, 0)
    return tl.load(p, mask=m, other=0.0)


@triton.jit
def _wu_term(t, k_ptr, v_ptr, c, h, j, gc, beta, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LOW: tl.constexpr, PREC: tl.constexpr):
    """``(t β e^gc k_j, t β v_j)`` for block ``t = T_ij`` (``k_j``, ``v_j`` read again: fewer live registers)."""
    kb = (_load16(k_ptr, c, h, j, H, K, C, BK).to(tl.float32) * (beta * tl.exp(gc))[:, None]).to(LOW)
    vb = (_load16(v_ptr, c, h, j, H, V, C, BV).to(tl.float32) * beta[:, None]).to(LOW)
    t = t.to(LOW)
    return tl.dot(t, kb, input_precision=PREC), tl.dot(t, vb, input_precision=PREC)


@triton.jit
def _a_block(k_i, k_j, gc_i, gc_j, beta_i, STRICT: tl.constexpr, IN_PREC: tl.constexpr):
    """Block ``(i, j)`` of ``β k kᵀ Γ`` (``Γ_ij = e^{gc_i − gc_j}``), strictly lower when ``STRICT``."""
    a = tl.dot(k_i, tl.trans(k_j), input_precision=IN_PREC) * beta_i[:, None]
    if STRICT:
        r = tl.arange(0, 16)
        return tl.where(r[:, None] > r[None, :], a * tl.exp(gc_i[:, None] - gc_j[None, :]), 0.0)
    return a * tl.exp(gc_i[:, None] - gc_j[None, :])


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _store_block(w_ptr, u_ptr, t_ptr, c, h, i: tl.constexpr, w, u, t0, t1, t2, t3, H: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, STORE_T: tl.constexpr):
    """Row block ``i`` of ``W`` and ``U`` (in ``w``'s dtype) and, when ``STORE_T``, of ``T`` (blocks ``t0 … t_i``,
    float32, ``[R, H, C]``; the blocks above the diagonal are never stored nor read)."""
    wp, wm = _sub(w_ptr, c, h, i, H, K, C, BK, 0)
    tl.store(wp, w.to(w_ptr.dtype.element_ty), mask=wm)
    up, um = _sub(u_ptr, c, h, i, H, V, C, BV, 0)
    tl.store(up, u.to(u_ptr.dtype.element_ty), mask=um)
    if STORE_T:
        tp, _ = _sub(t_ptr, c, h, i, H, C, C, 16, 0)
        tl.store(tp, t0)
        if i >= 1:
            tl.store(tp + 16, t1)
        if i >= 2:
            tl.store(tp + 32, t2)
        if i >= 3:
            tl.store(tp + 48, t3)


@triton.jit
def _prep(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, t_ptr, H: tl.constexpr, K: tl.constexpr,
          V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
          IN_PREC: tl.constexpr, STORE_T: tl.constexpr):
    c, h = tl.program_id(0), tl.program_id(1)
    LOW: tl.constexpr = w_ptr.dtype.element_ty
    NB: tl.constexpr = C // 16
    k0 = _load16(k_ptr, c, h, 0, H, K, C, BK)
    gc0, b0, off = _gates16(g_ptr, b_ptr, gc_ptr, c, h, 0, 0.0, H, C)
    t00 = _inverse16(_a_block(k0, k0, gc0, gc0, b0, True, IN_PREC))
    w, u = _wu_term(t00, k_ptr, v_ptr, c, h, 0, gc0, b0, H, K, V, C, BK, BV, LOW, PREC)
    _store_block(w_ptr, u_ptr, t_ptr, c, h, 0, w, u, t00, t00, t00, t00, H, K, V, C, BK, BV, STORE_T)
    if NB >= 2:
        k1 = _load16(k_ptr, c, h, 1, H, K, C, BK)
        gc1, b1, off = _gates16(g_ptr, b_ptr, gc_ptr, c, h, 1, off, H, C)
        t11 = _inverse16(_a_block(k1, k1, gc1, gc1, b1, True, IN_PREC))
        t10 = -_mm(t11, _mm(_a_block(k1, k0, gc1, gc0, b1, False, IN_PREC), t00, PREC), PREC)
        w, u = _wu_term(t10, k_ptr, v_ptr, c, h, 0, gc0, b0, H, K, V, C, BK, BV, LOW, PREC)
        w1, u1 = _wu_term(t11, k_ptr, v_ptr, c, h, 1, gc1, b1, H, K, V, C, BK, BV, LOW, PREC)
        _store_block(w_ptr, u_ptr, t_ptr, c, h, 1, w + w1, u + u1, t10, t11, t11, t11, H, K, V, C, BK, BV, STORE_T)
    if NB >= 4:
        k2 = _load16(k_ptr, c, h, 2, H, K, C, BK)
        gc2, b2, off = _gates16(g_ptr, b_ptr, gc_ptr, c, h, 2, off, H, C)
        a20 = _a_block(k2, k0, gc2, gc0, b2, False, IN_PREC)
        a21 = _a_block(k2, k1, gc2, gc1, b2, False, IN_PREC)
        t22 = _inverse16(_a_block(k2, k2, gc2, gc2, b2, True, IN_PREC))
        t21 = -_mm(t22, _mm(a21, t11, PREC), PREC)
        t20 = -_mm(t22, _mm(a20, t00, PREC) + _mm(a21, t10, PREC), PREC)
        w, u = _wu_term(t20, k_ptr, v_ptr, c, h, 0, gc0, b0, H, K, V, C, BK, BV, LOW, PREC)
        w1, u1 = _wu_term(t21, k_ptr, v_ptr, c, h, 1, gc1, b1, H, K, V, C, BK, BV, LOW, PREC)
        w2, u2 = _wu_term(t22, k_ptr, v_ptr, c, h, 2, gc2, b2, H, K, V, C, BK, BV, LOW, PREC)
        _store_block(w_ptr, u_ptr, t_ptr, c, h, 2, w + w1 + w2, u + u1 + u2, t20, t21, t22, t22, H, K, V, C, BK,
                     BV, STORE_T)
        k3 = _load16(k_ptr, c, h, 3, H, K, C, BK)
        gc3, b3, off = _gates16(g_ptr, b_ptr, gc_ptr, c, h, 3, off, H, C)
        a30 = _a_block(k3, k0, gc3, gc0, b3, False, IN_PREC)
        a31 = _a_block(k3, k1, gc3, gc1, b3, False, IN_PREC)
        a32 = _a_block(k3, k2, gc3, gc2, b3, False, IN_PREC)
        t33 = _inverse16(_a_block(k3, k3, gc3, gc3, b3, True, IN_PREC))
        t32 = -_mm(t33, _mm(a32, t22, PREC), PREC)
        t31 = -_mm(t33, _mm(a31, t11, PREC) + _mm(a32, t21, PREC), PREC)
        t30 = -_mm(t33, _mm(a30, t00, PREC) + _mm(a31, t10, PREC) + _mm(a32, t20, PREC), PREC)
        w, u = _wu_term(t30, k_ptr, v_ptr, c, h, 0, gc0, b0, H, K, V, C, BK, BV, LOW, PREC)
        w1, u1 = _wu_term(t31, k_ptr, v_ptr, c, h, 1, gc1, b1, H, K, V, C, BK, BV, LOW, PREC)
        w2, u2 = _wu_term(t32, k_ptr, v_ptr, c, h, 2, gc2, b2, H, K, V, C, BK, BV, LOW, PREC)
        w3, u3 = _wu_term(t33, k_ptr, v_ptr, c, h, 3, gc3, b3, H, K, V, C, BK, BV, LOW, PREC)
        _store_block(w_ptr, u_ptr, t_ptr, c, h, 3, w + w1 + w2 + w3, u + u1 + u2 + u3, t30, t31, t32, t33, H, K,
                     V, C, BK, BV, STORE_T)


@triton.jit
def gdr_prep_kernel(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    IN_PREC: tl.constexpr):
    """Per (chunk, head): ``gc = cumsum(g)``, ``T = (I + strictly_lower(β k kᵀ Γ))⁻¹``, ``W = T β e^gc k`` and
    ``U = T β v`` (stored in ``w``'s dtype).

    ``T`` is built from 16-token blocks: each diagonal block inverted by products (:func:`_inverse16`), the
    blocks below it from ``T_ij = −T_ii Σ_{j≤m<i} A_im T_mj``; ``C`` is 16, 32 or 64.
    """
    _prep(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, gc_ptr, H, K, V, C, BK, BV, PREC, IN_PREC, False)


@triton.jit
def gdr_prep_t_kernel(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, t_ptr, H: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      IN_PREC: tl.constexpr):
    """:func:`gdr_prep_kernel` that also stores ``T`` (float32, lower blocks) for the backward."""
    _prep(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, t_ptr, H, K, V, C, BK, BV, PREC, IN_PREC, True)


@triton.jit
def _state_tile(ptr, idx, h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, col0):
    """Pointers and mask of the ``[BK, BV]`` tile (columns from ``col0``) of state ``idx`` of ``[·, H, K, V]``
    (int64 offsets)."""
    ik = tl.arange(0, BK)
    iv = col0 + tl.arange(0, BV)
    offsets = ((tl.cast(idx, tl.int64) * H + h) * K + ik[:, None]) * V + iv[None, :]
    return ptr + offsets, (ik < K)[:, None] & (iv < V)[None, :]


@triton.jit
def _states(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, n_ptr, H: tl.constexpr,
            K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            HAS_INIT: tl.constexpr, PREC: tl.constexpr, STORE_NEW: tl.constexpr):
    col0 = tl.program_id(1) * BV
    n, h = tl.program_id(0) // H, tl.program_id(0) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    low = w_ptr.dtype.element_ty
    sp, sm = _state_tile(init_ptr, n, h, H, K, V, BK, BV, col0)
    state = tl.zeros((BK, BV), tl.float32)
    if HAS_INIT:
        state = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
    for c in range(c0, c1):
        hp, hm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, col0)
        tl.store(hp, state.to(h_ptr.dtype.element_ty), mask=hm)
        wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
        up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
        kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
        new = (tl.load(up, mask=um, other=0.0).to(tl.float32)
               - tl.dot(tl.load(wp, mask=wm, other=0.0), state.to(low), input_precision=PREC))
        if STORE_NEW:
            np_, nm = _rows(n_ptr, c, h, H, V, C, BV, col0)
            tl.store(np_, new.to(n_ptr.dtype.element_ty), mask=nm)
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        new = (new * tl.exp(g_end - gc)[:, None]).to(low)
        state = state * tl.exp(g_end) + tl.dot(tl.trans(tl.load(kp, mask=km, other=0.0).to(low)), new,
                                               input_precision=PREC)
    fp, fm = _state_tile(final_ptr, n, h, H, K, V, BK, BV, col0)
    tl.store(fp, state, mask=fm)


@triton.jit
def gdr_state_kernel(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, H: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_INIT: tl.constexpr, PREC: tl.constexpr):
    """Per (sequence·head, V block): the states entering each chunk of the sequence (stored in ``h``'s
    dtype), then its final state (float32).

    ``S ← e^{gc_C} S + kᵀ (N e^{gc_C − gc})`` with ``N = U − W S``, from ``init`` (or zeros) on the sequence's
    first chunk; the products take the stored dtype (16-bit inputs: 16-bit operands, float32 sums) and ``S``
    is kept in float32.
    """
    _states(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, h_ptr, H, K, V, C, BK, BV,
            HAS_INIT, PREC, False)


@triton.jit
def gdr_state_new_kernel(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, n_ptr,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, HAS_INIT: tl.constexpr, PREC: tl.constexpr):
    """:func:`gdr_state_kernel` that also stores every chunk's ``N = U − W S`` (for the backward)."""
    _states(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, n_ptr, H, K, V, C, BK, BV,
            HAS_INIT, PREC, True)


@triton.jit
def gdr_output_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, h_ptr, o_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (chunk, head, V block): ``o = scale (e^gc ⊙ (q S) + lower(q kᵀ Γ) (U − W S))``."""
    c, h, col0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BV
    low = w_ptr.dtype.element_ty
    qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    q = tl.load(qp, mask=qm, other=0.0)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    attn = tl.dot(q, tl.trans(tl.load(kp, mask=km, other=0.0)), input_precision=IN_PREC) * _decay(gc, C, False)
    hp, hm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, col0)
    state = tl.load(hp, mask=hm, other=0.0)
    wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
    up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
    new = tl.load(up, mask=um, other=0.0).to(tl.float32) - tl.dot(tl.load(wp, mask=wm, other=0.0), state,
                                                                   input_precision=PREC)
    o = tl.dot(q.to(low), state, input_precision=PREC) * tl.exp(gc)[:, None]
    o = SCALE * (o + tl.dot(attn.to(low), new.to(low), input_precision=PREC))
    op, om = _rows(o_ptr, c, h, H, V, C, BV, col0)
    tl.store(op, o.to(o_ptr.dtype.element_ty), mask=om)


@triton.jit
def gdr_dv_local_kernel(q_ptr, k_ptr, gc_ptr, do_ptr, dvl_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        IN_PREC: tl.constexpr):
    """Per (chunk, head, V block): the part of ``dN`` the chunk's own outputs give, ``scale Pᵀ dO`` with
    ``P = lower(q kᵀ Γ)`` (stored in ``dvl``'s dtype)."""
    c, h, col0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BV
    qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    p = tl.dot(tl.load(qp, mask=qm, other=0.0), tl.trans(tl.load(kp, mask=km, other=0.0)),
               input_precision=IN_PREC) * _decay(gc, C, False)
    dp, dm = _rows(do_ptr, c, h, H, V, C, BV, col0)
    d_o = tl.load(dp, mask=dm, other=0.0)
    dvl = SCALE * tl.dot(tl.trans(p.to(d_o.dtype)), d_o, input_precision=IN_PREC)
    op, om = _rows(dvl_ptr, c, h, H, V, C, BV, col0)
    tl.store(op, dvl.to(dvl_ptr.dtype.element_ty), mask=om)


@triton.jit
def gdr_state_bwd_kernel(q_ptr, k_ptr, w_ptr, gc_ptr, do_ptr, dvl_ptr, dfinal_ptr, cstart_ptr, dh_ptr, dn_ptr,
                         dinit_ptr, SCALE: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Per (sequence·head, V block), chunks in reverse: the gradient ``dS'`` of the state leaving each chunk
    (stored in ``dh``'s dtype) and the chunk's ``dN`` (in ``dn``'s).

    ``dN = dvl + k̃ dS'`` with ``k̃ = k e^{gc_C − gc}``, and the state entering the chunk gets
    ``dS = scale qᵀ (e^gc ⊙ dO) + e^{gc_C} dS' − Wᵀ dN``; the first chunk's is the initial state's (float32).
    """
    col0 = tl.program_id(1) * BV
    n, h = tl.program_id(0) // H, tl.program_id(0) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    low = w_ptr.dtype.element_ty
    fp, fm = _state_tile(dfinal_ptr, n, h, H, K, V, BK, BV, col0)
    grad = tl.load(fp, mask=fm, other=0.0)
    for i in range(0, c1 - c0):
        c = c1 - 1 - i
        hp, hm = _state_tile(dh_ptr, c, h, H, K, V, BK, BV, col0)
        tl.store(hp, grad.to(dh_ptr.dtype.element_ty), mask=hm)
        qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
        kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
        wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
        dp, dm = _rows(do_ptr, c, h, H, V, C, BV, col0)
        lp, lm = _rows(dvl_ptr, c, h, H, V, C, BV, col0)
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        k_dec = (tl.load(kp, mask=km, other=0.0).to(tl.float32) * tl.exp(g_end - gc)[:, None]).to(low)
        d_new = tl.load(lp, mask=lm, other=0.0).to(tl.float32) + tl.dot(k_dec, grad.to(low), input_precision=PREC)
        np_, nm = _rows(dn_ptr, c, h, H, V, C, BV, col0)
        tl.store(np_, d_new.to(dn_ptr.dtype.element_ty), mask=nm)
        d_o = (tl.load(dp, mask=dm, other=0.0).to(tl.float32) * tl.exp(gc)[:, None]).to(low)
        grad = (grad * tl.exp(g_end)
                + SCALE * tl.dot(tl.trans(tl.load(qp, mask=qm, other=0.0).to(low)), d_o, input_precision=PREC)
                - tl.dot(tl.trans(tl.load(wp, mask=wm, other=0.0)), d_new.to(low), input_precision=PREC))
    ip, im = _state_tile(dinit_ptr, n, h, H, K, V, BK, BV, col0)
    tl.store(ip, grad, mask=im)


@triton.jit
def gdr_dqkw_kernel(q_ptr, k_ptr, n_ptr, gc_ptr, h_ptr, dh_ptr, do_ptr, dn_ptr, dq_ptr, dk_ptr, dw_ptr, dgc_ptr,
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
    qp, qm = _rows(q_ptr, c, h, H, K, C, BK, k0)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, k0)
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
        dop, dom = _rows(do_ptr, c, h, H, V, C, BV, col0)
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
    dqp, _ = _rows(dq_ptr, c, h, H, K, C, BK, k0)
    tl.store(dqp, d_q.to(dq_ptr.dtype.element_ty), mask=qm)
    dkp, _ = _rows(dk_ptr, c, h, H, K, C, BK, k0)
    tl.store(dkp, d_k, mask=km)
    dwp, _ = _rows(dw_ptr, c, h, H, K, C, BK, k0)
    tl.store(dwp, d_w.to(dw_ptr.dtype.element_ty), mask=qm)
    tl.store(dgc_ptr + (kb * tl.num_programs(1) * C + rows) * H + h, d_gc)


@triton.jit
def gdr_wy_bwd_kernel(k_ptr, v_ptr, b_ptr, gc_ptr, t_ptr, dw_ptr, dn_ptr, dkp_ptr, dk_ptr, dv_ptr, db_ptr, dgc_ptr,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (chunk, head): the gradients through ``W = T β e^gc k``, ``U = T β v`` and ``T = (I + A)⁻¹``.

    ``dU = dN``; ``dT = dW (β e^gc k)ᵀ + dU (β v)ᵀ``, ``dA = −strictly_lower(Tᵀ dT Tᵀ)``; ``dk`` adds to the
    partial ``dkp``; ``dv``, ``dβ`` and the ``gc`` gradient of these terms. The products take the inputs'
    dtype (16-bit inputs: 16-bit operands, float32 sums). ``V`` is walked in blocks.
    """
    c, h = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, C)
    rows = tl.cast(c, tl.int64) * C + i
    low = k_ptr.dtype.element_ty
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    k = tl.load(kp, mask=km, other=0.0)
    kf = k.to(tl.float32)
    beta = tl.load(b_ptr + rows * H + h).to(tl.float32)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    e_gc = tl.exp(gc)
    tm = (i[None, :] // 16) <= (i[:, None] // 16)
    t = tl.load(t_ptr + (rows[:, None] * H + h) * C + i[None, :], mask=tm, other=0.0).to(low)
    dwp, _ = _rows(dw_ptr, c, h, H, K, C, BK, 0)
    d_w = tl.load(dwp, mask=km, other=0.0).to(low)
    d_t = tl.dot(d_w, tl.trans((kf * (beta * e_gc)[:, None]).to(low)), input_precision=PREC)
    d_kb = tl.dot(tl.trans(t), d_w, input_precision=PREC)
    d_beta = tl.sum(d_kb * kf, 1) * e_gc
    d_gc = d_beta * beta
    for vb in range(0, tl.cdiv(V, BV)):
        col0 = vb * BV
        vp, vm = _rows(v_ptr, c, h, H, V, C, BV, col0)
        v = tl.load(vp, mask=vm, other=0.0).to(tl.float32)
        np_, nm = _rows(dn_ptr, c, h, H, V, C, BV, col0)
        d_u = tl.load(np_, mask=nm, other=0.0).to(low)
        d_t += tl.dot(d_u, tl.trans((v * beta[:, None]).to(low)), input_precision=PREC)
        d_vb = tl.dot(tl.trans(t), d_u, input_precision=PREC)
        dvp, dvm = _rows(dv_ptr, c, h, H, V, C, BV, col0)
        tl.store(dvp, (d_vb * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=dvm)
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
    d_k = (tl.load(pp, mask=km, other=0.0) + d_kb * (beta * e_gc)[:, None]
           + tl.dot((m + tl.trans(m)).to(low), k, input_precision=PREC))
    dkp2, _ = _rows(dk_ptr, c, h, H, K, C, BK, 0)
    tl.store(dkp2, d_k.to(dk_ptr.dtype.element_ty), mask=km)
    tl.store(db_ptr + rows * H + h, d_beta)
    tl.store(dgc_ptr + rows * H + h, d_gc)
