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

__all__ = ["gdr_local_bwd_kernel", "gdr_output_kernel", "gdr_prep_kernel", "gdr_state_bwd_kernel", "gdr_state_kernel"]


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
def _inverse(a, C: tl.constexpr):
    """``(I + a)⁻¹`` of a strictly lower-triangular ``[C, C]`` ``a``, by forward substitution row by row."""
    i = tl.arange(0, C)
    inv = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    for r in range(1, C):  # inv_r = e_r − Σ_{j<r} a_rj inv_j
        a_r = tl.sum(tl.where(i[:, None] == r, a, 0.0), 0)
        inv = tl.where(i[:, None] == r, inv - tl.sum(a_r[:, None] * inv, 0)[None, :], inv)
    return inv


@triton.jit
def gdr_prep_kernel(k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, gc_ptr, H: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    IN_PREC: tl.constexpr):
    """Per (chunk, head): ``gc = cumsum(g)``, ``T = (I + strictly_lower(β k kᵀ Γ))⁻¹``, ``W = T β e^gc k`` and
    ``U = T β v``."""
    c, h = tl.program_id(0), tl.program_id(1)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    k = tl.load(kp, mask=km, other=0.0)
    vp, vm = _rows(v_ptr, c, h, H, V, C, BV, 0)
    v = tl.load(vp, mask=vm, other=0.0).to(tl.float32)
    rows = tl.cast(c, tl.int64) * C + tl.arange(0, C)
    g = tl.load(g_ptr + rows * H + h).to(tl.float32)
    beta = tl.load(b_ptr + rows * H + h).to(tl.float32)
    gc = tl.cumsum(g, 0)
    tl.store(gc_ptr + rows * H + h, gc)
    a = tl.dot(k, tl.trans(k), input_precision=IN_PREC) * _decay(gc, C, True) * beta[:, None]
    inv = _inverse(a, C)
    kf = k.to(tl.float32) * (beta * tl.exp(gc))[:, None]
    wp, _ = _rows(w_ptr, c, h, H, K, C, BK, 0)
    tl.store(wp, tl.dot(inv, kf, input_precision=PREC), mask=km)
    up, _ = _rows(u_ptr, c, h, H, V, C, BV, 0)
    tl.store(up, tl.dot(inv, v * beta[:, None], input_precision=PREC), mask=vm)


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
def gdr_state_kernel(w_ptr, u_ptr, k_ptr, gc_ptr, init_ptr, cstart_ptr, h_ptr, final_ptr, H: tl.constexpr,
                     K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_INIT: tl.constexpr, PREC: tl.constexpr):
    """Per (sequence·head, V block): the states entering each chunk of the sequence, then its final state.

    ``S ← e^{gc_C} S + (k e^{gc_C − gc})ᵀ (U − W S)``, from ``init`` (or zeros) on the sequence's first chunk.
    """
    col0 = tl.program_id(1) * BV
    n, h = tl.program_id(0) // H, tl.program_id(0) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    sp, sm = _state_tile(init_ptr, n, h, H, K, V, BK, BV, col0)
    state = tl.zeros((BK, BV), tl.float32)
    if HAS_INIT:
        state = tl.load(sp, mask=sm, other=0.0).to(tl.float32)
    for c in range(c0, c1):
        hp, hm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, col0)
        tl.store(hp, state, mask=hm)
        wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
        up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
        kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
        new = tl.load(up, mask=um, other=0.0) - tl.dot(tl.load(wp, mask=wm, other=0.0), state, input_precision=PREC)
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        k_dec = tl.load(kp, mask=km, other=0.0).to(tl.float32) * tl.exp(g_end - gc)[:, None]
        state = state * tl.exp(g_end) + tl.dot(tl.trans(k_dec), new, input_precision=PREC)
    fp, fm = _state_tile(final_ptr, n, h, H, K, V, BK, BV, col0)
    tl.store(fp, state, mask=fm)


@triton.jit
def gdr_output_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, h_ptr, o_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (chunk, head, V block): ``o = scale (e^gc q S + lower(q kᵀ Γ) (U − W S))``."""
    c, h, col0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BV
    qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    q = tl.load(qp, mask=qm, other=0.0)
    gc, _ = _gates(gc_ptr, c, h, H, C)
    attn = tl.dot(q, tl.trans(tl.load(kp, mask=km, other=0.0)), input_precision=IN_PREC) * _decay(gc, C, False)
    hp, hm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, col0)
    state = tl.load(hp, mask=hm, other=0.0)
    wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
    up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
    new = tl.load(up, mask=um, other=0.0) - tl.dot(tl.load(wp, mask=wm, other=0.0), state, input_precision=PREC)
    qd = q.to(tl.float32) * tl.exp(gc)[:, None]
    o = SCALE * (tl.dot(qd, state, input_precision=PREC) + tl.dot(attn, new, input_precision=PREC))
    op, om = _rows(o_ptr, c, h, H, V, C, BV, col0)
    tl.store(op, o.to(o_ptr.dtype.element_ty), mask=om)


@triton.jit
def gdr_state_bwd_kernel(q_ptr, k_ptr, w_ptr, gc_ptr, do_ptr, dfinal_ptr, cstart_ptr, dh_ptr, dinit_ptr,
                         SCALE: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (sequence·head, V block), chunks in reverse: the gradient of the state leaving each chunk.

    With ``dS'`` that of the state leaving chunk c (the final state's cotangent for the last):
    ``dN = scale lower(q kᵀ Γ)ᵀ dO + k e^{gc_C − gc} dS'`` and the state entering it gets
    ``dS = scale (e^gc q)ᵀ dO + e^{gc_C} dS' − Wᵀ dN``; the first chunk's is the initial state's.
    """
    col0 = tl.program_id(1) * BV
    n, h = tl.program_id(0) // H, tl.program_id(0) % H
    c0, c1 = tl.load(cstart_ptr + n), tl.load(cstart_ptr + n + 1)
    fp, fm = _state_tile(dfinal_ptr, n, h, H, K, V, BK, BV, col0)
    grad = tl.load(fp, mask=fm, other=0.0)
    for i in range(0, c1 - c0):
        c = c1 - 1 - i
        hp, hm = _state_tile(dh_ptr, c, h, H, K, V, BK, BV, col0)
        tl.store(hp, grad, mask=hm)
        qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
        kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
        wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
        dp, dm = _rows(do_ptr, c, h, H, V, C, BV, col0)
        q = tl.load(qp, mask=qm, other=0.0)
        k = tl.load(kp, mask=km, other=0.0)
        d_o = tl.load(dp, mask=dm, other=0.0).to(tl.float32)
        gc, g_end = _gates(gc_ptr, c, h, H, C)
        attn = tl.dot(q, tl.trans(k), input_precision=IN_PREC) * _decay(gc, C, False)
        k_dec = k.to(tl.float32) * tl.exp(g_end - gc)[:, None]
        d_new = SCALE * tl.dot(tl.trans(attn), d_o, input_precision=PREC) + tl.dot(k_dec, grad, input_precision=PREC)
        qd = q.to(tl.float32) * tl.exp(gc)[:, None]
        grad = (SCALE * tl.dot(tl.trans(qd), d_o, input_precision=PREC) + grad * tl.exp(g_end)
                - tl.dot(tl.trans(tl.load(wp, mask=wm, other=0.0)), d_new, input_precision=PREC))
    ip, im = _state_tile(dinit_ptr, n, h, H, K, V, BK, BV, col0)
    tl.store(ip, grad, mask=im)


@triton.jit
def gdr_local_bwd_kernel(q_ptr, k_ptr, v_ptr, b_ptr, gc_ptr, w_ptr, u_ptr, h_ptr, dh_ptr, do_ptr,
                         dq_ptr, dk_ptr, dv_ptr, db_ptr, dg_ptr, SCALE: tl.constexpr, H: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         PREC: tl.constexpr, IN_PREC: tl.constexpr):
    """Per (chunk, head): the gradients of the chunk's ``q, k, v, β`` and ``g`` (float32).

    Given the state entering the chunk ``S`` (``h``), the gradient of the state leaving it ``dS'``
    (``dh``) and ``dO``, with ``N = U − W S``, ``P = lower(q kᵀ Γ)``, ``k̃ = k e^{gc_C − gc}``:
    ``dN = scale Pᵀ dO + k̃ dS'``, ``dW = −dN Sᵀ``, ``[dR_k | dR_v] = Tᵀ [dW | dN]`` and
    ``dA = −strictly_lower(dR_k Wᵀ + dR_v Uᵀ)``, then the chain rule through ``P``, ``A``, ``R`` and the
    decays; ``dg`` is the reverse cumulative sum of the gradient of ``gc``. ``V`` is walked in blocks.
    """
    c, h = tl.program_id(0), tl.program_id(1)
    i = tl.arange(0, C)
    rows = tl.cast(c, tl.int64) * C + i
    qp, qm = _rows(q_ptr, c, h, H, K, C, BK, 0)
    kp, km = _rows(k_ptr, c, h, H, K, C, BK, 0)
    q = tl.load(qp, mask=qm, other=0.0)
    k = tl.load(kp, mask=km, other=0.0)
    qf, kf = q.to(tl.float32), k.to(tl.float32)
    beta = tl.load(b_ptr + rows * H + h).to(tl.float32)
    gc, g_end = _gates(gc_ptr, c, h, H, C)
    e_gc = tl.exp(gc)
    lower, strict = _decay(gc, C, False), _decay(gc, C, True)
    p = tl.dot(q, tl.trans(k), input_precision=IN_PREC) * lower
    kk = tl.dot(k, tl.trans(k), input_precision=IN_PREC)
    a = kk * strict * beta[:, None]
    inv = _inverse(a, C)
    wp, wm = _rows(w_ptr, c, h, H, K, C, BK, 0)
    w = tl.load(wp, mask=wm, other=0.0)
    k_decay = tl.exp(g_end - gc)
    k_dec = kf * k_decay[:, None]
    d_qd = tl.zeros((C, BK), tl.float32)
    d_kd = tl.zeros((C, BK), tl.float32)
    d_w = tl.zeros((C, BK), tl.float32)
    d_p = tl.zeros((C, C), tl.float32)
    d_a = tl.zeros((C, C), tl.float32)
    d_beta = tl.zeros((C,), tl.float32)
    d_end = tl.sum(tl.zeros((C,), tl.float32), 0)
    for vb in range(0, tl.cdiv(V, BV)):
        col0 = vb * BV
        sp, sm = _state_tile(h_ptr, c, h, H, K, V, BK, BV, col0)
        state = tl.load(sp, mask=sm, other=0.0)
        dsp, dsm = _state_tile(dh_ptr, c, h, H, K, V, BK, BV, col0)
        d_state = tl.load(dsp, mask=dsm, other=0.0)
        up, um = _rows(u_ptr, c, h, H, V, C, BV, col0)
        u = tl.load(up, mask=um, other=0.0)
        dop, dom = _rows(do_ptr, c, h, H, V, C, BV, col0)
        d_o = tl.load(dop, mask=dom, other=0.0).to(tl.float32)
        vp, vm = _rows(v_ptr, c, h, H, V, C, BV, col0)
        v = tl.load(vp, mask=vm, other=0.0).to(tl.float32)
        new = u - tl.dot(w, state, input_precision=PREC)
        d_qd += tl.dot(d_o, tl.trans(state), input_precision=PREC)
        d_p += tl.dot(d_o, tl.trans(new), input_precision=PREC)
        d_kd += tl.dot(new, tl.trans(d_state), input_precision=PREC)
        d_new = SCALE * tl.dot(tl.trans(p), d_o, input_precision=PREC) + tl.dot(k_dec, d_state, input_precision=PREC)
        d_w -= tl.dot(d_new, tl.trans(state), input_precision=PREC)
        d_rv = tl.dot(tl.trans(inv), d_new, input_precision=PREC)
        dvp, dvm = _rows(dv_ptr, c, h, H, V, C, BV, col0)
        tl.store(dvp, d_rv * beta[:, None], mask=dvm)
        d_beta += tl.sum(d_rv * v, 1)
        d_a -= tl.dot(d_rv, tl.trans(u), input_precision=PREC)
        d_end += tl.sum(tl.sum(d_state * state, 1), 0)
    d_qd *= SCALE
    d_p = tl.where(i[:, None] >= i[None, :], d_p * SCALE, 0.0)
    d_rk = tl.dot(tl.trans(inv), d_w, input_precision=PREC)
    d_a = tl.where(i[:, None] > i[None, :], d_a - tl.dot(d_rk, tl.trans(w), input_precision=PREC), 0.0)
    d_pg = d_p * lower
    m = d_a * strict * beta[:, None]
    d_q = d_qd * e_gc[:, None] + tl.dot(d_pg, kf, input_precision=PREC)
    d_k = (tl.dot(tl.trans(d_pg), qf, input_precision=PREC) + d_kd * k_decay[:, None]
           + d_rk * (beta * e_gc)[:, None] + tl.dot(m + tl.trans(m), kf, input_precision=PREC))
    d_beta += tl.sum(d_rk * kf * e_gc[:, None], 1) + tl.sum(d_a * kk * strict, 1)
    t = d_p * p + d_a * a
    r = tl.sum(d_kd * k_dec, 1)
    d_gc = (tl.sum(d_qd * qf, 1) * e_gc + tl.sum(d_rk * kf, 1) * beta * e_gc + tl.sum(t, 1) - tl.sum(t, 0) - r)
    d_end = d_end * tl.exp(g_end) + tl.sum(r, 0)
    d_gc += tl.where(i == C - 1, d_end, 0.0)
    d_g = tl.sum(d_gc, 0) - tl.cumsum(d_gc, 0) + d_gc
    dqp, _ = _rows(dq_ptr, c, h, H, K, C, BK, 0)
    tl.store(dqp, d_q, mask=qm)
    dkp, _ = _rows(dk_ptr, c, h, H, K, C, BK, 0)
    tl.store(dkp, d_k, mask=km)
    tl.store(db_ptr + rows * H + h, d_beta)
    tl.store(dg_ptr + rows * H + h, d_g)
