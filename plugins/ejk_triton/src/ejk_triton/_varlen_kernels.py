# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of packed variable-length flash attention, forward and backward.

Imported only when a kernel is launched (this module imports triton). The same source runs
compiled on an NVIDIA GPU (through jax-triton) and under Triton's interpreter on the CPU.

Layouts (contiguous): q ``[TQ, HQ, D]``, k ``[TK, HKV, D]``, v ``[TK, HKV, DV]``, out / d_out
``[TQ, HQ, DV]``, lse / delta ``[HQ, TQ]`` float32, the row intervals ``lo`` / ``hi`` ``[TQ]`` int32
(packed row ``i`` sees keys ``lo[i] <= j < hi[i]``) and their non-decreasing hulls ``hull_lo <= lo``,
``hull_hi >= hi`` and inner bounds ``inner_lo >= lo``, ``inner_hi <= hi`` ``[TQ]`` int32 (a block of rows
reads its key range from them, four scalar loads, instead of reducing over its rows; all four are
``lo`` / ``hi`` themselves without segment ids), per key block (``[cdiv(TK, BLOCK_N)]`` int32) the rows
that see it ``[q_lo, q_hi)`` and those that see it whole ``[full_lo, full_hi)``, ``sinks`` ``[HQ]``
float32. With ``HAS_SEG``, segment ids ``qseg [TQ]`` / ``kseg [TK]`` int32: a key is then visible iff it
is in the row's interval *and* carries the row's id (``ejk.flash_attention`` with segment ids, batch
folded into the packed axis; the intervals are then the hull of the row's segment intersected with its
causal / window band), plus which rows' intervals are exact, hold keys of the row's own id only
(contiguous segments, the packed case): ``inexact [TQ + 1]``, the running count of the other rows
(forward, dq), and per key block a flag ``kexact`` (dk/dv). A block of exact rows (keys) runs
the loops of a call without segment ids (its intervals alone are exact), any other one a single loop
over its whole range, masked with the ids: packed segments cost what the same packing without segment
ids does.

The kernels mirror ejk-triton's dense flash kernels (``_attention_kernels``) step for step: each loop
over blocks is split in three, masked edge blocks, then the blocks every row (every key, in the dk/dv
kernel) sees whole, which need neither the interval mask nor bounds checks, then masked edge blocks
again; loads carry a head-dim mask only when the head dim is padded; ``SCALE`` multiplies dk and dq
once, at the end. Grids are 1-D with the heads varying fastest (the programs of one block of rows, all
heads, run together and share its keys in L2); with ``REVERSE`` (causal or windowed calls) row blocks
run last-first, so in every sequence the longest programs start first.

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
def _load(ptrs, first_ok, second_ok, CHECK_FIRST: tl.constexpr, CHECK_SECOND: tl.constexpr):
    """Load with only the masks that are needed (both broadcast to ``ptrs``), zeros outside."""
    if CHECK_FIRST:
        if CHECK_SECOND:
            x = tl.load(ptrs, mask=first_ok & second_ok, other=0.0)
        else:
            x = tl.load(ptrs, mask=first_ok, other=0.0)
    else:
        if CHECK_SECOND:  # noqa: SIM108 (static branches of a Triton kernel)
            x = tl.load(ptrs, mask=second_ok, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _interior(lo_max, hi_min, first, last, whole, BLOCK: tl.constexpr, CHECK_WHOLE: tl.constexpr):
    """``(seg_first, first, mid_lo, mid_hi)``: ``[mid_lo, mid_hi)`` are the whole blocks of ``[first, last)``
    inside ``[lo_max, hi_min)``, the loops ``[first, mid_lo)``, ``[mid_lo, mid_hi)``, ``[mid_hi, last)`` compare
    no segment ids and ``[seg_first, last)`` is masked with them. With ``CHECK_WHOLE`` and ``whole`` false (a
    runtime flag: the intervals are not exact), only that last loop runs, over every block of ``[first, last)``;
    otherwise it is empty.

    All are multiples of ``BLOCK`` (as ``first`` is), computed so that the compiler can tell: loops that
    start there index rows (lse, delta, intervals) with vector loads."""
    top = (last + BLOCK - 1) // BLOCK * BLOCK  # past ``last``, the loops that end there do nothing more
    mid_lo = tl.minimum(tl.maximum((lo_max + BLOCK - 1) // BLOCK * BLOCK, first), top)
    mid_hi = tl.maximum(tl.minimum(hi_min // BLOCK * BLOCK, top), mid_lo)
    seg_first = top
    if CHECK_WHOLE:
        seg_first = tl.where(whole, top, first)
        first = tl.where(whole, first, top)
        mid_lo = tl.where(whole, mid_lo, top)
        mid_hi = tl.where(whole, mid_hi, top)
    return seg_first, first, mid_lo, mid_hi


@triton.jit
def _row_bounds(hull_lo_ptr, hull_hi_ptr, inner_lo_ptr, inner_hi_ptr, inexact_ptr, start_m, TQ: tl.constexpr,
                HAS_SEG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For rows ``[start_m, start_m + BLOCK_M)``: ``(first, last, lo_max, hi_min, whole)``, read from the
    non-decreasing hulls (``first`` rounded down to a key block) rather than reduced over the rows: keys
    ``[first, last)`` hold every visible one, rows see ``[lo_max, hi_min)`` whole, and ``whole`` (with
    ``HAS_SEG``) says that their intervals alone are exact."""
    end = tl.minimum(start_m + BLOCK_M, TQ)
    first = tl.load(hull_lo_ptr + start_m) // BLOCK_N * BLOCK_N
    last = tl.load(hull_hi_ptr + end - 1)
    lo_max = tl.load(inner_lo_ptr + end - 1)
    hi_min = tl.load(inner_hi_ptr + start_m)
    whole = True
    if HAS_SEG:
        whole = tl.load(inexact_ptr + end) == tl.load(inexact_ptr + start_m)
    return first, last, lo_max, hi_min, whole


@triton.jit
def _row_block(HQ: tl.constexpr, REVERSE: tl.constexpr):
    """``(block, head)`` of this program in a 1-D grid of ``blocks * HQ`` programs, heads fastest."""
    pid = tl.program_id(0)
    head = pid % HQ
    block = pid // HQ
    if REVERSE:
        block = tl.num_programs(0) // HQ - 1 - block
    return block, head


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, start, end,
              TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
              HAS_CAP: tl.constexpr, SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
              BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)  # loop bounds are block-aligned
        cols = start_n + offs_n
        kt = _load(k_base + cols[None, :] * K_STRIDE + offs_d[:, None], cols[None, :] < TK, offs_d[:, None] < D,
                   MASKED, HEAD_DIM != D)
        v = _load(v_base + cols[:, None] * V_STRIDE + offs_dv[None, :], cols[:, None] < TK, offs_dv[None, :] < DV,
                  MASKED, HEAD_DIM_V != DV)
        s, _t = _logits2(tl.dot(q, kt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if MASKED:
            seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            if SEG:
                kseg = tl.load(kseg_ptr + cols, mask=cols < TK, other=0)
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
def _fwd_block(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, mid_hi, last,
               TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
               HAS_CAP: tl.constexpr, SEG: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr):
    """The three loops of one block of rows: masked edge, interior, masked edge."""
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, TK, K_STRIDE,
                              V_STRIDE, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, True, BLOCK_N)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_lo, mid_hi, TK, K_STRIDE,
                              V_STRIDE, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, False, BLOCK_N)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_hi, last, TK, K_STRIDE,
                              V_STRIDE, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, True, BLOCK_N)
    return acc, l_i, m_i


@triton.jit
def varlen_fwd_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, hull_lo_ptr, hull_hi_ptr, inner_lo_ptr, inner_hi_ptr,
                      qseg_ptr, kseg_ptr, inexact_ptr, sinks_ptr, out_ptr, lse_ptr,
                      TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                      D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                      HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr, REVERSE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (block of packed query rows, q head): online softmax over the keys it sees.

    Grid ``(cdiv(TQ, BLOCK_M) * HQ,)``."""
    block, head = _row_block(HQ, REVERSE)
    kv_head = head // GROUP
    HKV: tl.constexpr = HQ // GROUP
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < TQ
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    ragged_q: tl.constexpr = TQ % BLOCK_M != 0
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=TK)
    hi = tl.load(hi_ptr + rows, mask=row_ok, other=TK)
    q = _load(q_ptr + rows[:, None] * (HQ * D) + head * D + offs_d[None, :], row_ok[:, None], offs_d[None, :] < D,
              ragged_q, HEAD_DIM != D)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], tl.float32) + _NEG_INF
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    qseg = lo
    first, last, lo_max, hi_min, whole = _row_bounds(hull_lo_ptr, hull_hi_ptr, inner_lo_ptr, inner_hi_ptr, inexact_ptr,
                                                     block * BLOCK_M, TQ, HAS_SEG, BLOCK_M, BLOCK_N)
    if HAS_SEG:
        qseg = tl.load(qseg_ptr + rows, mask=row_ok, other=0)
    seg_first, first, mid_lo, mid_hi = _interior(lo_max, hi_min, first, last, whole, BLOCK_N, HAS_SEG)
    k_base = k_ptr + kv_head * D
    v_base = v_ptr + kv_head * DV
    if HAS_SEG:
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, seg_first, last, TK,
                                  HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, True, DOT_PREC,
                                  True, BLOCK_N)
    acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, mid_hi, last,
                               TK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, False,
                               DOT_PREC, BLOCK_N)
    nonzero = l_i > 0.0
    l_safe = tl.where(nonzero, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonzero, tl.where(m_i == _NEG_INF, 0.0, m_i) + tl.log2(l_safe), _POS_INF)
    tl.store(out_ptr + rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    tl.store(lse_ptr + head * TQ + rows, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@triton.jit
def varlen_bwd_preprocess_kernel(out_ptr, do_ptr, delta_ptr, TQ: tl.constexpr, HQ: tl.constexpr, DV: tl.constexpr,
                                 HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(d_out · out)`` in float32, ``[HQ, TQ]``. Grid ``(cdiv(TQ, BLOCK_M) * HQ,)``."""
    block, head = _row_block(HQ, False)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    offs = rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :]
    mask = (rows[:, None] < TQ) & (offs_dv[None, :] < DV)
    o = tl.load(out_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + head * TQ + rows, tl.sum(o * do, 1), mask=rows < TQ)


@triton.jit
def _dkdv_loop(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, lo_ptr, hi_ptr, qseg_ptr, start, end,
               TQ: tl.constexpr, Q_STRIDE: tl.constexpr, DO_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
               HAS_CAP: tl.constexpr, SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
               BLOCK_M: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)  # loop bounds are block-aligned
        rows = start_m + offs_m
        q = _load(q_base + rows[:, None] * Q_STRIDE + offs_d[None, :], rows[:, None] < TQ, offs_d[None, :] < D,
                  MASKED, HEAD_DIM != D)
        do = _load(do_base + rows[:, None] * DO_STRIDE + offs_dv[None, :], rows[:, None] < TQ, offs_dv[None, :] < DV,
                   MASKED, HEAD_DIM_V != DV)
        if MASKED:
            lse = tl.load(lse_base + rows, mask=rows < TQ, other=_POS_INF)
            delta = tl.load(delta_base + rows, mask=rows < TQ, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        st, tt = _logits2(tl.dot(k, tl.trans(q), input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)  # [BLOCK_N, BLOCK_M]
        if MASKED:
            lo = tl.load(lo_ptr + rows, mask=rows < TQ, other=0)
            hi = tl.load(hi_ptr + rows, mask=rows < TQ, other=0)
            seen = (cols[:, None] >= lo[None, :]) & (cols[:, None] < hi[None, :])
            if SEG:
                qseg = tl.load(qseg_ptr + rows, mask=rows < TQ, other=0)
                seen = seen & (kseg[:, None] == qseg[None, :])
            st = tl.where(seen, st, _NEG_INF)
        pt = tl.exp2(st - lse[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        if HAS_CAP:
            dst = dst * (1.0 - tt * tt)
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _dkdv_heads(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, kv_head,
                seg_first, first, mid_lo, mid_hi, last, TQ: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr,
                DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr):
    """Every q head of the group, each over its loops (:func:`_interior`): masked with ids (``HAS_SEG``),
    masked edge, interior, masked edge."""
    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = q_ptr + head * D
        do_base = do_ptr + head * DV
        lse_base = lse_ptr + head * TQ
        delta_base = delta_ptr + head * TQ
        if HAS_SEG:
            dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, lo_ptr, hi_ptr,
                                qseg_ptr, seg_first, last, TQ, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE,
                                CAP, HAS_CAP, True, DOT_PREC, True, BLOCK_M)
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, lo_ptr, hi_ptr, qseg_ptr,
                            first, mid_lo, TQ, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, False,
                            DOT_PREC, True, BLOCK_M)
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, lo_ptr, hi_ptr, qseg_ptr,
                            mid_lo, mid_hi, TQ, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP,
                            False, DOT_PREC, False, BLOCK_M)
        dk, dv = _dkdv_loop(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, lo_ptr, hi_ptr, qseg_ptr,
                            mid_hi, last, TQ, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, False,
                            DOT_PREC, True, BLOCK_M)
    return dk, dv


@triton.jit
def varlen_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, qseg_ptr, kseg_ptr, kexact_ptr, q_lo_ptr, q_hi_ptr,
                           full_lo_ptr, full_hi_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                           TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                           D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                           SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr,
                           DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (key block, kv head): loops over the q heads of its group and the rows that see it
    (``[q_lo, q_hi)``; rows ``[full_lo, full_hi)`` see the whole block). Grid ``(cdiv(TK, BLOCK_N) * HKV,)``,
    kv heads fastest; each key block's dk / dv is written once (no atomics)."""
    HKV: tl.constexpr = HQ // GROUP
    block_n, kv_head = _row_block(HKV, False)
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    ragged_k: tl.constexpr = TK % BLOCK_N != 0
    k_offs = cols[:, None] * (HKV * D) + kv_head * D + offs_d[None, :]
    v_offs = cols[:, None] * (HKV * DV) + kv_head * DV + offs_dv[None, :]
    k = _load(k_ptr + k_offs, cols[:, None] < TK, offs_d[None, :] < D, ragged_k, HEAD_DIM != D)
    v = _load(v_ptr + v_offs, cols[:, None] < TK, offs_dv[None, :] < DV, ragged_k, HEAD_DIM_V != DV)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], tl.float32)
    first = tl.load(q_lo_ptr + block_n) // BLOCK_M * BLOCK_M  # a multiple already; now provably
    last = tl.load(q_hi_ptr + block_n)
    kseg = cols
    whole = True
    if HAS_SEG:
        kseg = tl.load(kseg_ptr + cols, mask=cols < TK, other=0)
        whole = tl.load(kexact_ptr + block_n) > 0  # every row that sees the block: its interval alone is exact
    seg_first, first, mid_lo, mid_hi = _interior(tl.load(full_lo_ptr + block_n), tl.load(full_hi_ptr + block_n),
                                                 first, last, whole, BLOCK_M, HAS_SEG)
    dk, dv = _dkdv_heads(dk, dv, k, v, kseg, cols, q_ptr, do_ptr, lse_ptr, delta_ptr, lo_ptr, hi_ptr, qseg_ptr, kv_head,
                         seg_first, first, mid_lo, mid_hi, last, TQ, HQ, GROUP, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP,
                         HAS_CAP, HAS_SEG, DOT_PREC, BLOCK_M)
    dk = dk * SCALE
    tl.store(dk_ptr + k_offs, dk.to(dk_ptr.dtype.element_ty), mask=(cols[:, None] < TK) & (offs_d[None, :] < D))
    tl.store(dv_ptr + v_offs, dv.to(dv_ptr.dtype.element_ty), mask=(cols[:, None] < TK) & (offs_dv[None, :] < DV))


@triton.jit
def _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, start, end,
             TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
             HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
             HAS_CAP: tl.constexpr, SEG: tl.constexpr, DOT_PREC: tl.constexpr, MASKED: tl.constexpr,
             BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)  # loop bounds are block-aligned
        cols = start_n + offs_n
        kt = _load(k_base + cols[None, :] * K_STRIDE + offs_d[:, None], cols[None, :] < TK, offs_d[:, None] < D,
                   MASKED, HEAD_DIM != D)
        vt = _load(v_base + cols[None, :] * V_STRIDE + offs_dv[:, None], cols[None, :] < TK, offs_dv[:, None] < DV,
                   MASKED, HEAD_DIM_V != DV)
        s, t = _logits2(tl.dot(q, kt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if MASKED:
            seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            if SEG:
                kseg = tl.load(kseg_ptr + cols, mask=cols < TK, other=0)
                seen = seen & (qseg[:, None] == kseg[None, :])
            s = tl.where(seen, s, _NEG_INF)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if HAS_CAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _dq_block(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, mid_hi, last,
              TK: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, SCALE: tl.constexpr, CAP: tl.constexpr,
              HAS_CAP: tl.constexpr, SEG: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_N: tl.constexpr):
    """The three loops of one block of rows: masked edge, interior, masked edge."""
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, TK, K_STRIDE, V_STRIDE,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, True, BLOCK_N)
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_lo, mid_hi, TK, K_STRIDE, V_STRIDE,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, False, BLOCK_N)
    dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, mid_hi, last, TK, K_STRIDE, V_STRIDE,
                  D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, SEG, DOT_PREC, True, BLOCK_N)
    return dq


@triton.jit
def varlen_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, lo_ptr, hi_ptr, hull_lo_ptr, hull_hi_ptr, inner_lo_ptr, inner_hi_ptr,
                         qseg_ptr, kseg_ptr, inexact_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                         TQ: tl.constexpr, TK: tl.constexpr, HQ: tl.constexpr, GROUP: tl.constexpr,
                         D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                         SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SEG: tl.constexpr,
                         DOT_PREC: tl.constexpr, REVERSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (block of packed query rows, q head): ``dq`` over the keys its rows see.

    Grid ``(cdiv(TQ, BLOCK_M) * HQ,)``."""
    block, head = _row_block(HQ, REVERSE)
    kv_head = head // GROUP
    HKV: tl.constexpr = HQ // GROUP
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < TQ
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    ragged_q: tl.constexpr = TQ % BLOCK_M != 0
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=TK)
    hi = tl.load(hi_ptr + rows, mask=row_ok, other=TK)
    q_offs = rows[:, None] * (HQ * D) + head * D + offs_d[None, :]
    q = _load(q_ptr + q_offs, row_ok[:, None], offs_d[None, :] < D, ragged_q, HEAD_DIM != D)
    do = _load(do_ptr + rows[:, None] * (HQ * DV) + head * DV + offs_dv[None, :], row_ok[:, None],
               offs_dv[None, :] < DV, ragged_q, HEAD_DIM_V != DV)
    lse = tl.load(lse_ptr + head * TQ + rows, mask=row_ok, other=_POS_INF)
    delta = tl.load(delta_ptr + head * TQ + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qseg = lo
    first, last, lo_max, hi_min, whole = _row_bounds(hull_lo_ptr, hull_hi_ptr, inner_lo_ptr, inner_hi_ptr, inexact_ptr,
                                                     block * BLOCK_M, TQ, HAS_SEG, BLOCK_M, BLOCK_N)
    if HAS_SEG:
        qseg = tl.load(qseg_ptr + rows, mask=row_ok, other=0)
    seg_first, first, mid_lo, mid_hi = _interior(lo_max, hi_min, first, last, whole, BLOCK_N, HAS_SEG)
    k_base = k_ptr + kv_head * D
    v_base = v_ptr + kv_head * DV
    if HAS_SEG:
        dq = _dq_loop(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, seg_first, last, TK, HKV * D,
                      HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, True, DOT_PREC, True, BLOCK_N)
    dq = _dq_block(dq, q, do, lse, delta, qseg, lo, hi, k_base, v_base, kseg_ptr, first, mid_lo, mid_hi, last, TK,
                   HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, SCALE, CAP, HAS_CAP, False, DOT_PREC, BLOCK_N)
    dq = dq * SCALE
    tl.store(dq_ptr + q_offs, dq.to(dq_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
