# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of packed variable-length flash attention, forward and backward.

Imported only when a kernel is launched (this module imports triton). The same source runs
compiled on an NVIDIA GPU (through jax-triton) and under Triton's interpreter on the CPU.

Layouts (contiguous): q ``[TQ, HQ, D]``, k ``[TK, HKV, D]``, v ``[TK, HKV, DV]``, out / d_out
``[TQ, HQ, DV]``, lse / delta ``[HQ, TQ]`` float32, the row intervals ``lo`` / ``hi`` ``[TQ]`` int32
(packed row ``i`` sees keys ``lo[i] <= j < hi[i]``, both non-decreasing in ``i``), the query range
of each key block ``q_lo`` / ``q_hi`` ``[cdiv(TK, BLOCK_N)]`` int32, ``sinks`` ``[HQ]`` float32, and with
``HAS_SEG`` segment ids ``qseg [TQ]`` / ``kseg [TK]`` int32: a key is then visible iff it is in the row's
interval *and* has the row's segment id (``ejk.flash_attention`` with segment ids, batch folded into the
packed axis; the intervals are then the hull of the row's segment intersected with its causal / window band).

Each loop over blocks is split in three: masked edge blocks, then the blocks every row (every key, in the
dk/dv kernel) sees whole, which need neither the interval mask nor bounds checks, then masked edge blocks
again. With segment ids every block is masked.

Numerics: base-2 logits (``exp2``); the saved log-sum-exp is base 2, includes the sink, and is
``+inf`` for rows that see no key when there is no sink (their probabilities and gradients are then
0). The running max is replaced by 0 while it is ``-inf``, so no ``inf - inf`` is formed.
"""

from __future__ import annotations

import triton
import triton.language as tl

_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
_NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
_POS_INF: tl.constexpr = tl.constexpr(float("inf"))


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^{2x} + 1): exact limits at ±inf, no libdevice.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * _LOG2E)) + 1.0)


@triton.jit
def _logits2(qk, SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr):
    """Base-2 logits and ``tanh`` of the soft cap (``qk`` itself without a cap)."""
    if HAS_CAP:
        t = _tanh(qk * (SCALE / CAP))
        s = t * (CAP * _LOG2E)
    else:
        t = qk
        s = qk * (SCALE * _LOG2E)
    return s, t


@triton.jit
def _load(ptrs, ok, dim_ok, MASKED: tl.constexpr):
    """``ptrs`` loaded with the head-dim mask, and the row / column mask ``ok`` on masked blocks only."""
    if MASKED:  # noqa: SIM108 (a static branch of a Triton kernel)
        x = tl.load(ptrs, mask=ok & dim_ok, other=0.0)
    else:
        x = tl.load(ptrs, mask=dim_ok, other=0.0)
    return x


@triton.jit
def _interior(lo_max, hi_min, first, last, BLOCK: tl.constexpr, HAS_SEG: tl.constexpr):
    """``[mid_lo, mid_hi)``: the blocks of ``[first, last)`` inside ``[lo_max, hi_min)`` (none with segment ids)."""
    if HAS_SEG:
        mid_lo = last
        mid_hi = last
    else:
        mid_lo = tl.minimum(tl.maximum((lo_max + BLOCK - 1) // BLOCK * BLOCK, first), last)
        mid_hi = tl.maximum(tl.minimum(hi_min // BLOCK * BLOCK, last), mid_lo)
        mid_hi = mid_lo + (mid_hi - mid_lo) // BLOCK * BLOCK
    return mid_lo, mid_hi


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, start, end,
              TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
              HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
              BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        col_ok = cols < TK
        kt = _load(k_base + cols[None, :] * K_STRIDE + offs_d[:, None], col_ok[None, :], offs_d[:, None] < D, MASKED)
        v = _load(v_base + cols[:, None] * V_STRIDE + offs_dv[None, :], col_ok[:, None], offs_dv[None, :] < DV, MASKED)
        s, _t = _logits2(tl.dot(q, kt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if MASKED:
            seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            if HAS_SEG:
                kseg = tl.load(kseg_ptr + cols, mask=col_ok, other=0)
                seen = seen & (qseg[:, None] == kseg[None, :])
            s = tl.where(seen, s, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def varlen_fwd_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, qseg_ptr, kseg_ptr, sinks_ptr, out_ptr, lse_ptr,
                      TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                      D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                      HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (block of packed query rows, q head): online softmax over the keys it sees."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // GROUP
    HKV: tl.constexpr = HQ // GROUP
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < TQ
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=TK)
    hi = tl.load(hi_ptr + rows, mask=row_ok, other=TK)
    qseg = lo
    if HAS_SEG:
        qseg = tl.load(qseg_ptr + rows, mask=row_ok, other=0)
    q = tl.load(q_ptr + rows[:, None] * (HQ * D) + head * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], tl.float32) + _NEG_INF
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    first = tl.min(lo, 0) // BLOCK_N * BLOCK_N
    last = tl.max(hi, 0)
    mid_lo, mid_hi = _interior(tl.max(lo, 0), tl.min(hi, 0), first, last, BLOCK_N, HAS_SEG)
    k_base = k_ptr + kv_head * D
    v_base = v_ptr + kv_head * DV
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, TK, HKV * D,
                              HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, True,
                              BLOCK_N)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_lo, mid_hi, TK, HKV * D,
                              HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, False,
                              BLOCK_N)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_hi, last, TK, HKV * D,
                              HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, True,
                              BLOCK_N)
    nonzero = l_i > 0.0
    out = acc / tl.where(nonzero, l_i, 1.0)[:, None]
    lse = tl.where(nonzero, tl.where(m_i == _NEG_INF, 0.0, m_i) + tl.log2(tl.where(nonzero, l_i, 1.0)), _POS_INF)
    tl.store(out_ptr + rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    tl.store(lse_ptr + head * TQ + rows, lse, mask=row_ok)


@triton.jit
def _dkdv_loop(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, head, start, end,
               TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
               HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
               BLOCK_M: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        row_ok = rows < TQ
        qt = _load(q_ptr + rows[None, :] * (HQ * D) + head * D + offs_d[:, None], row_ok[None, :],
                   offs_d[:, None] < D, MASKED)
        do = _load(do_ptr + rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :], row_ok[:, None],
                   offs_dv[None, :] < DV, MASKED)
        if MASKED:
            lse = tl.load(lse_ptr + head * TQ + rows, mask=row_ok, other=_POS_INF)
            delta = tl.load(delta_ptr + head * TQ + rows, mask=row_ok, other=0.0)
        else:
            lse = tl.load(lse_ptr + head * TQ + rows)
            delta = tl.load(delta_ptr + head * TQ + rows)
        st, t = _logits2(tl.dot(k, qt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)  # [BLOCK_N, BLOCK_M]
        pt = tl.exp2(st - lse[None, :])
        if MASKED:
            lo = tl.load(lo_ptr + rows, mask=row_ok, other=TK)
            hi = tl.load(hi_ptr + rows, mask=row_ok, other=TK)
            seen = (cols[:, None] >= lo[None, :]) & (cols[:, None] < hi[None, :])
            if HAS_SEG:
                qseg = tl.load(qseg_ptr + rows, mask=row_ok, other=0)
                seen = seen & (kseg[:, None] == qseg[None, :])
            pt = tl.where(seen, pt, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        if HAS_CAP:
            dst = dst * (1.0 - t * t)
        dk = tl.dot((dst * SCALE).to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def varlen_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, qseg_ptr, kseg_ptr, q_lo_ptr, q_hi_ptr, full_lo_ptr,
                           full_hi_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                           TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                           D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                           SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr,
                           DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (key block, kv head): loops over the q heads of its group and the rows that see it
    (``[q_lo, q_hi)``; rows ``[full_lo, full_hi)`` see the whole block)."""
    block_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    HKV: tl.constexpr = HQ // GROUP
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < TK
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    k = tl.load(k_ptr + cols[:, None] * (HKV * D) + kv_head * D + offs_d[None, :],
                mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(v_ptr + cols[:, None] * (HKV * DV) + kv_head * DV + offs_dv[None, :],
                mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    kseg = cols
    if HAS_SEG:
        kseg = tl.load(kseg_ptr + cols, mask=col_ok, other=0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], tl.float32)
    first = tl.load(q_lo_ptr + block_n)
    last = tl.load(q_hi_ptr + block_n)
    mid_lo, mid_hi = _interior(tl.load(full_lo_ptr + block_n), tl.load(full_hi_ptr + block_n), first, last, BLOCK_M,
                               HAS_SEG)
    for g in range(GROUP):
        head = kv_head * GROUP + g
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, head,
                            first, mid_lo, TQ, TK, HQ, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG,
                            DOT_PREC, True, BLOCK_M)
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, head,
                            mid_lo, mid_hi, TQ, TK, HQ, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG,
                            DOT_PREC, False, BLOCK_M)
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, head,
                            mid_hi, last, TQ, TK, HQ, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG,
                            DOT_PREC, True, BLOCK_M)
    tl.store(dk_ptr + cols[:, None] * (HKV * D) + kv_head * D + offs_d[None, :], dk.to(dk_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < D))
    tl.store(dv_ptr + cols[:, None] * (HKV * DV) + kv_head * DV + offs_dv[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, start, end,
             TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
             HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
             HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
             BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        col_ok = cols < TK
        k = _load(k_base + cols[:, None] * K_STRIDE + offs_d[None, :], col_ok[:, None], offs_d[None, :] < D, MASKED)
        vt = _load(v_base + cols[None, :] * V_STRIDE + offs_dv[:, None], col_ok[None, :], offs_dv[:, None] < DV, MASKED)
        s, t = _logits2(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            if HAS_SEG:
                kseg = tl.load(kseg_ptr + cols, mask=col_ok, other=0)
                seen = seen & (qseg[:, None] == kseg[None, :])
            p = tl.where(seen, p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if HAS_CAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot((ds * SCALE).to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def varlen_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, qseg_ptr, kseg_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                         TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                         D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                         SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr,
                         DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (block of packed query rows, q head): ``dq`` over the keys its rows see."""
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1)
    kv_head = head // GROUP
    HKV: tl.constexpr = HQ // GROUP
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < TQ
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=TK)
    hi = tl.load(hi_ptr + rows, mask=row_ok, other=TK)
    qseg = lo
    if HAS_SEG:
        qseg = tl.load(qseg_ptr + rows, mask=row_ok, other=0)
    q = tl.load(q_ptr + rows[:, None] * (HQ * D) + head * D + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(do_ptr + rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(lse_ptr + head * TQ + rows, mask=row_ok, other=_POS_INF)
    delta = tl.load(delta_ptr + head * TQ + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first = tl.min(lo, 0) // BLOCK_N * BLOCK_N
    last = tl.max(hi, 0)
    mid_lo, mid_hi = _interior(tl.max(lo, 0), tl.min(hi, 0), first, last, BLOCK_N, HAS_SEG)
    k_base = k_ptr + kv_head * D
    v_base = v_ptr + kv_head * DV
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, TK, HKV * D, HKV * DV,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, True, BLOCK_N)
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_lo, mid_hi, TK, HKV * D, HKV * DV,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, False, BLOCK_N)
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_hi, last, TK, HKV * D, HKV * DV,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, HAS_SEG, DOT_PREC, True, BLOCK_N)
    tl.store(dq_ptr + rows[:, None] * (HQ * D) + head * D + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))
