# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of flash attention (FlashAttention-2 style), forward and backward.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).
The same source runs compiled on an NVIDIA GPU (through jax-triton) and under Triton's
interpreter on the CPU (``EJK_TRITON_INTERPRET=1``).

Layouts (all contiguous): q ``[B, Sq, Hq, D]``, k ``[B, Sk, Hkv, D]``, v ``[B, Sk, Hkv, Dv]``,
out / d_out ``[B, Sq, Hq, Dv]``, lse / delta ``[B, Hq, Sq]`` float32, segment ids ``[B, S]`` int32,
bias ``[Bb, Hb, Sqb, Skb]`` addressed through strides that are 0 along its broadcast dims, and
the bias gradient buffer ``[B, Hq, Sq, Sk]`` float32. Every size and stride is a ``constexpr``.

Numerics: logits are kept in base 2 (``s2 = log2(e) · logits``) so the softmax uses ``exp2``;
the saved log-sum-exp is base 2 too, ``+inf`` for rows that see no key (their probabilities
and gradients are then exactly 0). Masked logits are ``-inf``; the running max is replaced by
0 while it is ``-inf`` so no ``inf - inf`` is formed.

Masks: query ``i`` sits at position ``i + Sk - Sq``; key ``j`` is visible iff it is in range,
``j <= i + Sk - Sq`` (causal) and ``-left <= j - (i + Sk - Sq) <= right`` (window), and
segment ids match. Each program computes the range of blocks it can see (blocks outside are
never loaded) and splits it into masked edge blocks and interior blocks that need no
position mask (only the segment-id compare, when there are segment ids).
"""

from __future__ import annotations

import triton
import triton.language as tl

_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
_NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
_POS_INF: tl.constexpr = tl.constexpr(float("inf"))


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits ±1 at ±inf, no libdevice needed.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * _LOG2E)) + 1.0)


@triton.jit
def _load(ptrs, first_ok, second_ok, CHECK_FIRST: tl.constexpr, CHECK_SECOND: tl.constexpr, other):
    """Load with only the masks that are needed (both masks broadcast to ``ptrs``)."""
    if CHECK_FIRST:
        if CHECK_SECOND:
            x = tl.load(ptrs, mask=first_ok & second_ok, other=other)
        else:
            x = tl.load(ptrs, mask=first_ok, other=other)
    else:
        if CHECK_SECOND:  # noqa: SIM108 (static branches of a Triton kernel)
            x = tl.load(ptrs, mask=second_ok, other=other)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _visible(rows, cols, SQ: tl.constexpr, SK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
             WIN_L: tl.constexpr, WIN_R: tl.constexpr):
    """Position mask of the contract (``rows`` and ``cols`` broadcast against each other)."""
    ok = (cols < SK) & (rows < SQ)
    rel = cols - (rows + (SK - SQ))
    if CAUSAL:
        ok = ok & (rel <= 0)
    if WINDOW:
        ok = ok & (rel >= -WIN_L) & (rel <= WIN_R)
    return ok


@triton.jit
def _logits2(qk, SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr):
    """Base-2 logits before bias and masks, and ``tanh`` of the soft cap (``qk`` when no cap)."""
    if HAS_CAP:
        t = _tanh(qk * (SCALE / CAP))
        s = t * (CAP * _LOG2E)
    else:
        t = qk
        s = qk * (SCALE * _LOG2E)
    return s, t


@triton.jit
def _ceil_to(x, block: tl.constexpr):
    """Smallest multiple of ``block`` >= ``x`` (0 for negative ``x``)."""
    return (tl.maximum(x, 0) + block - 1) // block * block


@triton.jit
def _floor_to(x, block: tl.constexpr):
    """Largest multiple of ``block`` <= ``x`` (0 for negative ``x``)."""
    return tl.maximum(x, 0) // block * block


@triton.jit
def _kv_range(start_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr):
    """Key blocks that query rows ``[start_m, start_m + BLOCK_M)`` can see: ``lo <= mid_lo <= mid_hi <= hi``.

    Blocks in ``[mid_lo, mid_hi)`` are fully visible by position for every row in range.
    """
    offset: tl.constexpr = SK - SQ
    row_hi = tl.minimum(start_m + BLOCK_M, SQ) - 1
    lo = start_m * 0
    hi = lo + SK
    mid_hi = lo + SK // BLOCK_N * BLOCK_N
    if WINDOW:
        lo = tl.maximum(start_m + offset - WIN_L, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(row_hi + offset + WIN_R + 1, SK)
        mid_lo = _ceil_to(row_hi + offset - WIN_L, BLOCK_N)
        mid_hi = tl.minimum(mid_hi, _floor_to(start_m + offset + WIN_R + 1, BLOCK_N))
    elif CAUSAL:
        hi = tl.minimum(row_hi + offset + 1, SK)
        mid_lo = lo
        mid_hi = tl.minimum(mid_hi, _floor_to(start_m + offset + 1, BLOCK_N))
    else:
        mid_lo = lo
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = tl.maximum(tl.minimum(mid_hi, hi), mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _q_range(start_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
             CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr):
    """Query blocks that see keys ``[start_n, start_n + BLOCK_N)``: ``lo <= mid_lo <= mid_hi <= hi``.

    Blocks in ``[mid_lo, mid_hi)`` are full (no row past ``Sq``) and see every key of the block.
    """
    offset: tl.constexpr = SK - SQ
    col_hi = tl.minimum(start_n + BLOCK_N, SK) - 1
    lo = start_n * 0
    hi = lo + SQ
    mid_lo = lo
    mid_hi = lo + SQ // BLOCK_M * BLOCK_M
    if WINDOW:
        lo = tl.maximum(start_n - offset - WIN_R, 0) // BLOCK_M * BLOCK_M
        hi = tl.minimum(col_hi - offset + WIN_L + 1, SQ)
        mid_lo = _ceil_to(start_n + BLOCK_N - 1 - offset - WIN_R, BLOCK_M)
        mid_hi = tl.minimum(mid_hi, _floor_to(start_n - offset + WIN_L + 1, BLOCK_M))
    elif CAUSAL:
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        mid_lo = _ceil_to(start_n + BLOCK_N - 1 - offset, BLOCK_M)
    if SK % BLOCK_N != 0:
        mid_hi = tl.where(start_n + BLOCK_N > SK, mid_lo, mid_hi)  # a ragged key block is masked throughout
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = tl.maximum(tl.minimum(mid_hi, hi), mid_lo)
    return lo, mid_lo, mid_hi, hi


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, q_seg, rows, k_base, v_base, kseg_base, bias_base, lo, hi,
               SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
               K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BIAS_SQ: tl.constexpr, BIAS_SK: tl.constexpr,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
               HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
               MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)  # loop bounds are block-aligned
        cols = start_n + offs_n
        kt = _load(k_base + cols[None, :] * K_STRIDE + offs_d[:, None], cols[None, :] < SK, offs_d[:, None] < D,
                   MASKED, HEAD_DIM != D, 0.0)
        v = _load(v_base + cols[:, None] * V_STRIDE + offs_dv[None, :], cols[:, None] < SK, offs_dv[None, :] < DV,
                  MASKED, HEAD_DIM_V != DV, 0.0)
        s, _t = _logits2(tl.dot(q, kt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if HAS_BIAS:
            bias = _load(bias_base + rows[:, None] * BIAS_SQ + cols[None, :] * BIAS_SK, rows[:, None] < SQ,
                         cols[None, :] < SK, True, MASKED, 0.0)
            s += bias.to(tl.float32) * _LOG2E
        if MASKED:
            ok = _visible(rows[:, None], cols[None, :], SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
            if HAS_SEG:
                kseg = tl.load(kseg_base + cols, mask=cols < SK, other=-1)
                ok = ok & (q_seg[:, None] == kseg[None, :])
            s = tl.where(ok, s, _NEG_INF)
        elif HAS_SEG:
            kseg = tl.load(kseg_base + cols)
            s = tl.where(q_seg[:, None] == kseg[None, :], s, _NEG_INF)
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
def flash_fwd_kernel(Q, K, V, QSeg, KSeg, Bias, Sinks, Out, Lse,
                     SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
                     HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                     HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BIAS_SB: tl.constexpr, BIAS_SH: tl.constexpr, BIAS_SQ: tl.constexpr, BIAS_SK: tl.constexpr,
                     CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
                     HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
                     HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_M`` query rows of one (batch, q head). Grid ``(cdiv(Sq, BLOCK_M), B * Hq)``.

    ``Sinks`` (with ``HAS_SINKS``): ``[B, Hq]`` float32 sink logits; each row that sees a key adds
    ``e^sink`` to its denominator (and its lse) once, after the key loop."""
    HKV: tl.constexpr = HQ // GROUP
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows first
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_bh = tl.program_id(1)
    b = (off_bh // HQ).to(tl.int64)
    h = off_bh % HQ
    hk = h // GROUP
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)

    q_ptrs = Q + b * (SQ * HQ * D) + h * D + rows[:, None] * (HQ * D) + offs_d[None, :]
    q = _load(q_ptrs, rows[:, None] < SQ, offs_d[None, :] < D, SQ % BLOCK_M != 0, HEAD_DIM != D, 0.0)
    k_base = K + b * (SK * HKV * D) + hk * D
    v_base = V + b * (SK * HKV * DV) + hk * DV
    q_seg = rows
    kseg_base = KSeg
    if HAS_SEG:
        q_seg = tl.load(QSeg + b * SQ + rows, mask=rows < SQ, other=-2)
        kseg_base = KSeg + b * SK
    bias_base = Bias
    if HAS_BIAS:
        bias_base = Bias + b * BIAS_SB + h.to(tl.int64) * BIAS_SH

    m_i = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    lo, mid_lo, mid_hi, hi = _kv_range(start_m, BLOCK_M, BLOCK_N, SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, q_seg, rows, k_base, v_base, kseg_base, bias_base, lo, mid_lo,
                               SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                               CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, True, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, q_seg, rows, k_base, v_base, kseg_base, bias_base, mid_lo, mid_hi,
                               SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                               CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, False, BLOCK_N)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, q_seg, rows, k_base, v_base, kseg_base, bias_base, mid_hi, hi,
                               SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                               CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, True, BLOCK_N)

    seen = l_i > 0.0
    if HAS_SINKS:
        sink = tl.load(Sinks + off_bh).to(tl.float32) * 1.4426950408889634  # base 2, as m_i
        m_sink = tl.where(seen, tl.maximum(m_i, sink), 0.0)
        alpha = tl.where(seen, tl.exp2(m_i - m_sink), 1.0)
        l_i = tl.where(seen, alpha * l_i + tl.exp2(sink - m_sink), l_i)
        acc = acc * alpha[:, None]
        m_i = tl.where(seen, m_sink, m_i)
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, m_i + tl.log2(l_safe), _POS_INF)
    tl.store(Lse + off_bh.to(tl.int64) * SQ + rows, lse, mask=rows < SQ)
    o_ptrs = Out + b * (SQ * HQ * DV) + h * DV + rows[:, None] * (HQ * DV) + offs_dv[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows[:, None] < SQ) & (offs_dv[None, :] < DV))


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------


@triton.jit
def flash_bwd_preprocess_kernel(Out, DOut, Delta, SQ: tl.constexpr, HQ: tl.constexpr, DV: tl.constexpr,
                                HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(d_out · out)`` in float32. Grid ``(cdiv(Sq, BLOCK_M), B * Hq)``."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_bh = tl.program_id(1)
    b = (off_bh // HQ).to(tl.int64)
    h = off_bh % HQ
    offs_dv = tl.arange(0, HEAD_DIM_V)
    offs = b * (SQ * HQ * DV) + h * DV + rows[:, None] * (HQ * DV) + offs_dv[None, :]
    mask = (rows[:, None] < SQ) & (offs_dv[None, :] < DV)
    o = tl.load(Out + offs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DOut + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + off_bh.to(tl.int64) * SQ + rows, tl.sum(o * do, 1), mask=rows < SQ)


@triton.jit
def _dkdv_inner(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, qseg_base, bias_base, lo, hi,
                SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
                Q_STRIDE: tl.constexpr, DO_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BIAS_SQ: tl.constexpr, BIAS_SK: tl.constexpr,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
                HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
               MASKED: tl.constexpr, BLOCK_M: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)  # loop bounds are block-aligned
        rows = start_m + offs_m
        q = _load(q_base + rows[:, None] * Q_STRIDE + offs_d[None, :], rows[:, None] < SQ, offs_d[None, :] < D,
                  MASKED, HEAD_DIM != D, 0.0)
        do = _load(do_base + rows[:, None] * DO_STRIDE + offs_dv[None, :], rows[:, None] < SQ,
                   offs_dv[None, :] < DV, MASKED, HEAD_DIM_V != DV, 0.0)
        if MASKED:
            lse = tl.load(lse_base + rows, mask=rows < SQ, other=_POS_INF)
            delta = tl.load(delta_base + rows, mask=rows < SQ, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        st, tt = _logits2(tl.dot(k, tl.trans(q), input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)  # [BLOCK_N, BLOCK_M]
        if HAS_BIAS:
            bias = _load(bias_base + rows[None, :] * BIAS_SQ + cols[:, None] * BIAS_SK, rows[None, :] < SQ,
                         cols[:, None] < SK, MASKED, MASKED, 0.0)
            st += bias.to(tl.float32) * _LOG2E
        if MASKED:
            ok = _visible(rows[None, :], cols[:, None], SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
            if HAS_SEG:
                qseg = tl.load(qseg_base + rows, mask=rows < SQ, other=-2)
                ok = ok & (kseg[:, None] == qseg[None, :])
            st = tl.where(ok, st, _NEG_INF)
        elif HAS_SEG:
            qseg = tl.load(qseg_base + rows)
            st = tl.where(kseg[:, None] == qseg[None, :], st, _NEG_INF)
        pt = tl.exp2(st - lse[None, :])
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        if HAS_CAP:
            dst = dst * (1.0 - tt * tt)
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(Q, K, V, QSeg, KSeg, Bias, DOut, Lse, Delta, DK, DVout,
                          SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
                          HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                          HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                          BIAS_SB: tl.constexpr, BIAS_SH: tl.constexpr, BIAS_SQ: tl.constexpr,
                          BIAS_SK: tl.constexpr,
                          CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
                          HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_N`` keys of one (batch, kv head), over every q head of its group.

    Grid ``(cdiv(Sk, BLOCK_N), B * Hkv)``; each key block's dk / dv is written once (no atomics).
    """
    HKV: tl.constexpr = HQ // GROUP
    start_n = tl.program_id(0) * BLOCK_N
    off_bh = tl.program_id(1)
    b = (off_bh // HKV).to(tl.int64)
    hk = off_bh % HKV
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    k_offs = b * (SK * HKV * D) + hk * D + cols[:, None] * (HKV * D) + offs_d[None, :]
    v_offs = b * (SK * HKV * DV) + hk * DV + cols[:, None] * (HKV * DV) + offs_dv[None, :]
    ragged_k: tl.constexpr = SK % BLOCK_N != 0
    k = _load(K + k_offs, cols[:, None] < SK, offs_d[None, :] < D, ragged_k, HEAD_DIM != D, 0.0)
    v = _load(V + v_offs, cols[:, None] < SK, offs_dv[None, :] < DV, ragged_k, HEAD_DIM_V != DV, 0.0)
    kseg = cols
    if HAS_SEG:
        kseg = tl.load(KSeg + b * SK + cols, mask=cols < SK, other=-1)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], tl.float32)
    lo, mid_lo, mid_hi, hi = _q_range(start_n, BLOCK_M, BLOCK_N, SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b * (SQ * HQ * D) + h * D
        do_base = DOut + b * (SQ * HQ * DV) + h * DV
        lse_base = Lse + (b * HQ + h) * SQ
        delta_base = Delta + (b * HQ + h) * SQ
        qseg_base = QSeg
        if HAS_SEG:
            qseg_base = QSeg + b * SQ
        bias_base = Bias
        if HAS_BIAS:
            bias_base = Bias + b * BIAS_SB + h.to(tl.int64) * BIAS_SH
        dk, dv = _dkdv_inner(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, qseg_base, bias_base,
                             lo, mid_lo, SCALE, CAP, SQ, SK, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V,
                             BIAS_SQ, BIAS_SK, CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC,
                             True, BLOCK_M)
        dk, dv = _dkdv_inner(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, qseg_base, bias_base,
                             mid_lo, mid_hi, SCALE, CAP, SQ, SK, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V,
                             BIAS_SQ, BIAS_SK, CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC,
                             False, BLOCK_M)
        dk, dv = _dkdv_inner(dk, dv, k, v, kseg, cols, q_base, do_base, lse_base, delta_base, qseg_base, bias_base,
                             mid_hi, hi, SCALE, CAP, SQ, SK, HQ * D, HQ * DV, D, DV, HEAD_DIM, HEAD_DIM_V,
                             BIAS_SQ, BIAS_SK, CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC,
                             True, BLOCK_M)
    dk = dk * SCALE
    tl.store(DK + k_offs, dk.to(DK.dtype.element_ty), mask=(cols[:, None] < SK) & (offs_d[None, :] < D))
    tl.store(DVout + v_offs, dv.to(DVout.dtype.element_ty), mask=(cols[:, None] < SK) & (offs_dv[None, :] < DV))


@triton.jit
def _store_dbias(dbias_base, ds, rows, cols, SQ: tl.constexpr, SK: tl.constexpr, DBIAS_SQ: tl.constexpr,
                 DBIAS_SK: tl.constexpr, ATOMIC: tl.constexpr):
    """Add the logits gradient of one block into the bias gradient (stride 0 along a broadcast dim).

    Rows / keys the bias broadcasts over are summed in the block first; several programs (heads,
    query blocks) or loop steps then meet on one element, hence the atomics. ``ds`` is 0 outside
    the visible range, so the sums need no mask.
    """
    if DBIAS_SQ == 0:
        if DBIAS_SK == 0:
            tl.atomic_add(dbias_base, tl.sum(tl.sum(ds, 1), 0))
        else:
            tl.atomic_add(dbias_base + cols * DBIAS_SK, tl.sum(ds, 0), mask=cols < SK)
    elif DBIAS_SK == 0:
        tl.atomic_add(dbias_base + rows * DBIAS_SQ, tl.sum(ds, 1), mask=rows < SQ)
    else:
        ptrs = dbias_base + rows[:, None] * DBIAS_SQ + cols[None, :] * DBIAS_SK
        mask = (rows[:, None] < SQ) & (cols[None, :] < SK)
        if ATOMIC:
            tl.atomic_add(ptrs, ds, mask=mask)
        else:
            tl.store(ptrs, ds, mask=mask)


@triton.jit
def _dq_inner(dq, q, do, lse, delta, q_seg, rows, k_base, v_base, kseg_base, bias_base, dbias_base, lo, hi,
              SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
              K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BIAS_SQ: tl.constexpr, BIAS_SK: tl.constexpr,
              DBIAS_SQ: tl.constexpr, DBIAS_SK: tl.constexpr, DBIAS_ATOMIC: tl.constexpr,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
              HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
               MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)  # loop bounds are block-aligned
        cols = start_n + offs_n
        kt = _load(k_base + cols[None, :] * K_STRIDE + offs_d[:, None], cols[None, :] < SK, offs_d[:, None] < D,
                   MASKED, HEAD_DIM != D, 0.0)
        vt = _load(v_base + cols[None, :] * V_STRIDE + offs_dv[:, None], cols[None, :] < SK,
                   offs_dv[:, None] < DV, MASKED, HEAD_DIM_V != DV, 0.0)
        s, t = _logits2(tl.dot(q, kt, input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if HAS_BIAS:
            bias = _load(bias_base + rows[:, None] * BIAS_SQ + cols[None, :] * BIAS_SK, rows[:, None] < SQ,
                         cols[None, :] < SK, True, MASKED, 0.0)
            s += bias.to(tl.float32) * _LOG2E
        if MASKED:
            ok = _visible(rows[:, None], cols[None, :], SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
            if HAS_SEG:
                kseg = tl.load(kseg_base + cols, mask=cols < SK, other=-1)
                ok = ok & (q_seg[:, None] == kseg[None, :])
            s = tl.where(ok, s, _NEG_INF)
        elif HAS_SEG:
            kseg = tl.load(kseg_base + cols)
            s = tl.where(q_seg[:, None] == kseg[None, :], s, _NEG_INF)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if HAS_BIAS:
            _store_dbias(dbias_base, ds, rows, cols, SQ, SK, DBIAS_SQ, DBIAS_SK, DBIAS_ATOMIC)
        if HAS_CAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def flash_bwd_dq_kernel(Q, K, V, QSeg, KSeg, Bias, DOut, Lse, Delta, DQ, DBias,
                        SCALE: tl.constexpr, CAP: tl.constexpr, SQ: tl.constexpr, SK: tl.constexpr,
                        HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                        HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                        BIAS_SB: tl.constexpr, BIAS_SH: tl.constexpr, BIAS_SQ: tl.constexpr, BIAS_SK: tl.constexpr,
                        DBIAS_SB: tl.constexpr, DBIAS_SH: tl.constexpr, DBIAS_SQ: tl.constexpr,
                        DBIAS_SK: tl.constexpr, DBIAS_ATOMIC: tl.constexpr,
                        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, WIN_L: tl.constexpr, WIN_R: tl.constexpr,
                        HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SEG: tl.constexpr, DOT_PREC: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: ``BLOCK_M`` query rows of one (batch, q head); also the logits gradient for the bias.

    Grid ``(cdiv(Sq, BLOCK_M), B * Hq)``; ``DBias`` is ``[B, Hb, Sqb, Skb]`` float32, zeroed (the
    bias's own shape with its full batch; a placeholder without bias): heads, rows and keys the bias
    broadcasts over are summed into it here, its batch by the caller.
    """
    HKV: tl.constexpr = HQ // GROUP
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_bh = tl.program_id(1)
    b = (off_bh // HQ).to(tl.int64)
    h = off_bh % HQ
    hk = h // GROUP
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    ragged_q: tl.constexpr = SQ % BLOCK_M != 0
    q_offs = b * (SQ * HQ * D) + h * D + rows[:, None] * (HQ * D) + offs_d[None, :]
    q = _load(Q + q_offs, rows[:, None] < SQ, offs_d[None, :] < D, ragged_q, HEAD_DIM != D, 0.0)
    do = _load(DOut + b * (SQ * HQ * DV) + h * DV + rows[:, None] * (HQ * DV) + offs_dv[None, :],
               rows[:, None] < SQ, offs_dv[None, :] < DV, ragged_q, HEAD_DIM_V != DV, 0.0)
    row_base = off_bh.to(tl.int64) * SQ
    lse = tl.load(Lse + row_base + rows, mask=rows < SQ, other=_POS_INF)
    delta = tl.load(Delta + row_base + rows, mask=rows < SQ, other=0.0)
    k_base = K + b * (SK * HKV * D) + hk * D
    v_base = V + b * (SK * HKV * DV) + hk * DV
    q_seg = rows
    kseg_base = KSeg
    if HAS_SEG:
        q_seg = tl.load(QSeg + b * SQ + rows, mask=rows < SQ, other=-2)
        kseg_base = KSeg + b * SK
    bias_base = Bias
    dbias_base = DBias
    if HAS_BIAS:
        bias_base = Bias + b * BIAS_SB + h.to(tl.int64) * BIAS_SH
        dbias_base = DBias + b * DBIAS_SB + h.to(tl.int64) * DBIAS_SH

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    lo, mid_lo, mid_hi, hi = _kv_range(start_m, BLOCK_M, BLOCK_N, SQ, SK, CAUSAL, WINDOW, WIN_L, WIN_R)
    dq = _dq_inner(dq, q, do, lse, delta, q_seg, rows, k_base, v_base, kseg_base, bias_base, dbias_base, lo, mid_lo,
                   SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                   DBIAS_SQ, DBIAS_SK, DBIAS_ATOMIC,
                   CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, True, BLOCK_N)
    dq = _dq_inner(dq, q, do, lse, delta, q_seg, rows, k_base, v_base, kseg_base, bias_base, dbias_base, mid_lo,
                   mid_hi, SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                   DBIAS_SQ, DBIAS_SK, DBIAS_ATOMIC,
                   CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, False, BLOCK_N)
    dq = _dq_inner(dq, q, do, lse, delta, q_seg, rows, k_base, v_base, kseg_base, bias_base, dbias_base, mid_hi, hi,
                   SCALE, CAP, SQ, SK, HKV * D, HKV * DV, D, DV, HEAD_DIM, HEAD_DIM_V, BIAS_SQ, BIAS_SK,
                   DBIAS_SQ, DBIAS_SK, DBIAS_ATOMIC,
                   CAUSAL, WINDOW, WIN_L, WIN_R, HAS_CAP, HAS_BIAS, HAS_SEG, DOT_PREC, True, BLOCK_N)
    dq = dq * SCALE
    tl.store(DQ + q_offs, dq.to(DQ.dtype.element_ty), mask=(rows[:, None] < SQ) & (offs_d[None, :] < D))
