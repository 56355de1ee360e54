# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of the chunked linear recurrences (``gla``, ``ssd``), in fla's phases: only the
state recurrence runs chunk after chunk, the rest is parallel over chunks.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).

Layouts (contiguous): q, k ``[R, HQK, K]`` (``R`` = batch x tokens; head ``h`` reads q/k head
``h // (H // HQK)``), v ``[R, H, V]`` (q's dtype), log gates g ``[R, H, K]`` (per channel) or ``[R, H]``
(``SCALAR_GATE``), initial / final states ``[N, H, K, V]`` float32, offsets ``[N+1]`` int32 (``VARLEN``;
else sequence ``n`` is rows ``n·T`` to ``(n+1)·T``). Chunks of ``BT`` tokens start at their sequence's
start and never cross its end; sequence ``n`` starting at row ``bos`` keeps its chunks' states at slots
``bos // BT + n`` on (``[slots, H, K, V]``), and ``seq [slots]`` names each slot's sequence. Offsets are
int64. With ``G`` the running sum of the log gates inside a chunk::

    o     = scale · ((q ⊙ e^G) S + (Σ_k q_ik k_jk e^{G_ik - G_jk})_{j<=i} v)
    S    ← e^{G_last} ⊙ S + (k ⊙ e^{G_last - G})ᵀ v

Products run in the inputs' dtype (16-bit operands, float32 accumulation; ``PREC`` for float32).
"""

from __future__ import annotations

import triton
import triton.language as tl

_NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))


@triton.jit
def _bounds(cu_ptr, n, T: tl.constexpr, VARLEN: tl.constexpr):
    """Sequence ``n``'s first and end rows (int64)."""
    if VARLEN:
        bos = tl.load(cu_ptr + n).to(tl.int64)
        eos = tl.load(cu_ptr + n + 1).to(tl.int64)
    else:
        bos = n * T
        eos = bos + T
    return bos, eos


@triton.jit
def _slot_chunk(seq_ptr, cu_ptr, slot, T: tl.constexpr, BT: tl.constexpr, VARLEN: tl.constexpr):
    """Chunk slot ``slot``'s first row and its sequence's end row (int64): sequence ``n = seq[slot]`` starting
    at row ``bos`` owns slots from ``bos // BT + n`` on. A slot no chunk uses starts at or past the end, so its
    program stores nothing."""
    n = tl.load(seq_ptr + slot).to(tl.int64)
    bos, eos = _bounds(cu_ptr, n, T, VARLEN)
    return bos + (slot - bos // BT - n) * BT, eos


@triton.jit
def _row_scaled(v, rs_ptr, rows, t_ok, H: tl.constexpr, h, ROW_SCALE: tl.constexpr):
    """``v`` with each row times its factor ``rs [R, H]`` (float32), rounded back to ``v``'s dtype (as a
    product formed outside and stored would be), or ``v`` as it is."""
    if ROW_SCALE:
        factor = tl.load(rs_ptr + rows * H + h, mask=t_ok, other=0.0)
        v = (v.to(tl.float32) * factor[:, None]).to(v.dtype)
    return v


@triton.jit
def linear_cumsum(g_ptr, cu_ptr, seq_ptr, gc_ptr,
                  T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                  SCALAR_GATE: tl.constexpr, VARLEN: tl.constexpr):
    """Phase (a), per (chunk slot, head): the chunk-local cumulative log gates (float32)."""
    slot = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    rows = start + tl.arange(0, BT)
    t_ok = rows < eos
    if SCALAR_GATE:
        gate = tl.load(g_ptr + rows * H + h, mask=t_ok, other=0.0).to(tl.float32)
        tl.store(gc_ptr + rows * H + h, tl.cumsum(gate, 0), mask=t_ok)
    else:
        ks = tl.arange(0, BK)
        mask = t_ok[:, None] & (ks < K)[None, :]
        off = (rows[:, None] * H + h) * K + ks[None, :]
        gate = tl.load(g_ptr + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(gc_ptr + off, tl.cumsum(gate, 0), mask=mask)


@triton.jit
def linear_states_fwd(k_ptr, v_ptr, gc_ptr, h0_ptr, cu_ptr, rs_ptr, hs_ptr, ht_ptr,
                      T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR_GATE: tl.constexpr,
                      HAS_H0: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr,
                      ROW_SCALE: tl.constexpr = False):
    """Phase (b), per (sequence·head, K block, V block): the state entering every chunk of the sequence
    (from the chunk-local cumulative gates :func:`linear_cumsum` wrote), then its final state. ``ROW_SCALE``:
    ``v``'s rows times ``rs [R, H]`` (see :func:`_row_scaled`)."""
    nh = tl.program_id(0).to(tl.int64)
    ik = tl.program_id(1)
    iv = tl.program_id(2)
    n = nh // H
    h = nh % H
    hqk = h // (H // HQK)
    bos, eos = _bounds(cu_ptr, n, T, VARLEN)
    dt = k_ptr.dtype.element_ty
    ks = ik * BK + tl.arange(0, BK)
    vs = iv * BV + tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    tile = ks[:, None] * V + vs[None, :]
    tile_mask = k_ok[:, None] & v_ok[None, :]
    if HAS_H0:
        state = tl.load(h0_ptr + nh * K * V + tile, mask=tile_mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros([BK, BV], tl.float32)
    ts = tl.arange(0, BT)
    slot = bos // BT + n  # this sequence's first chunk slot (see _chunk_slots)
    for start in range(bos, eos, BT):
        tl.store(hs_ptr + (slot * H + h) * K * V + tile, state.to(hs_ptr.dtype.element_ty), mask=tile_mask)
        slot += 1
        rows = start + ts
        t_ok = rows < eos
        end = tl.minimum(start + BT, eos) - 1
        qk_mask = t_ok[:, None] & k_ok[None, :]
        k = tl.load(k_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=qk_mask, other=0.0)
        v = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :],
                    other=0.0)
        v = _row_scaled(v, rs_ptr, rows, t_ok, H, h, ROW_SCALE)
        if SCALAR_GATE:
            cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
            last = tl.load(gc_ptr + end * H + h)
            k_out = k.to(tl.float32) * tl.exp(tl.where(t_ok, last - cum, 0.0))[:, None]
            state = state * tl.exp(last)
        else:
            cum = tl.load(gc_ptr + (rows[:, None] * H + h) * K + ks[None, :], mask=qk_mask, other=0.0)
            last = tl.load(gc_ptr + (end * H + h) * K + ks, mask=k_ok, other=0.0)
            k_out = k.to(tl.float32) * tl.exp(tl.where(qk_mask, last[None, :] - cum, 0.0))
            state = state * tl.exp(last)[:, None]
        state += tl.dot(tl.trans(k_out.to(dt)), v.to(dt), input_precision=PREC)
    tl.store(ht_ptr + nh * K * V + tile, state, mask=tile_mask)


@triton.jit
def gla_intra_fwd(q_ptr, k_ptr, gc_ptr, cu_ptr, seq_ptr, a_ptr,
                  T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                  BC: tl.constexpr, BK: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """Per (chunk slot, sub-block of ``BC`` rows, head), per-channel gates: the sub-block's rows of the
    chunk's intra-chunk weights ``A_ij = Σ_k q_ik k_jk e^{G_ik - G_jk}`` (``j <= i``) into ``a [R, H, BT]``
    (float32; row ``i`` of a chunk at token ``i``, column ``j`` at the chunk's ``j``-th token). An earlier
    sub-block through one product whose exponents are split at the row sub-block's first token (both
    factors ``<= 0``); the diagonal sub-block's lower-left quadrant the same way, split at its middle row,
    and its two diagonal quadrants exactly, one key row of each at a time. Entries above the diagonal are
    left unwritten: every reader masks them."""
    slot = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    hqk = h // (H // HQK)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    first = start + i * BC
    if first < eos:
        dt = q_ptr.dtype.element_ty
        ks = tl.arange(0, BK)
        k_ok = ks < K
        cs = tl.arange(0, BC)
        rows = first + cs
        t_ok = rows < eos
        mask = t_ok[:, None] & k_ok[None, :]
        q = tl.load(q_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gc_ptr + (rows[:, None] * H + h) * K + ks[None, :], mask=mask, other=0.0)
        a_rows = (rows[:, None] * H + h) * BT
        ref = tl.load(gc_ptr + (first * H + h) * K + ks, mask=k_ok, other=0.0)
        q_n = (q * tl.exp(tl.where(mask, g - ref[None, :], 0.0))).to(dt)
        for j in range(0, i):
            cols = start + j * BC + cs  # before ``first``, so inside the sequence
            kj = tl.load(k_ptr + (cols[:, None] * HQK + hqk) * K + ks[None, :], mask=k_ok[None, :], other=0.0)
            gj = tl.load(gc_ptr + (cols[:, None] * H + h) * K + ks[None, :], mask=k_ok[None, :], other=0.0)
            k_n = (kj.to(tl.float32) * tl.exp(ref[None, :] - gj)).to(dt)
            block = tl.dot(q_n, tl.trans(k_n), input_precision=PREC)
            tl.store(a_ptr + a_rows + (j * BC + cs)[None, :], block, mask=t_ok[:, None])
        # the lower-left quadrant through one product split at the middle row (both factors <= 0) ...
        HB: tl.constexpr = BC // 2
        mid_row = tl.minimum(first + HB, eos - 1)
        ref_m = tl.load(gc_ptr + (mid_row * H + h) * K + ks, mask=k_ok, other=0.0)
        k_d = tl.load(k_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=mask, other=0.0)
        lower = (cs >= HB)[:, None]
        q_m = tl.where(lower, q * tl.exp(tl.minimum(g - ref_m[None, :], 0.0)), 0.0).to(dt)
        k_m = tl.where(lower, 0.0, k_d.to(tl.float32) * tl.exp(tl.minimum(ref_m[None, :] - g, 0.0))).to(dt)
        quad = tl.dot(q_m, tl.trans(k_m), input_precision=PREC)
        tl.store(a_ptr + a_rows + (i * BC + cs)[None, :], quad,
                 mask=(t_ok & (cs >= HB))[:, None] & (cs < HB)[None, :])
        # ... and the two diagonal quadrants exactly, a key row of each at a time
        hs = tl.arange(0, HB)
        top = first + hs
        bot = first + HB + hs
        top_ok = (top < eos)[:, None] & k_ok[None, :]
        bot_ok = (bot < eos)[:, None] & k_ok[None, :]
        q_t = tl.load(q_ptr + (top[:, None] * HQK + hqk) * K + ks[None, :], mask=top_ok, other=0.0).to(tl.float32)
        g_t = tl.load(gc_ptr + (top[:, None] * H + h) * K + ks[None, :], mask=top_ok, other=0.0)
        q_b = tl.load(q_ptr + (bot[:, None] * HQK + hqk) * K + ks[None, :], mask=bot_ok, other=0.0).to(tl.float32)
        g_b = tl.load(gc_ptr + (bot[:, None] * H + h) * K + ks[None, :], mask=bot_ok, other=0.0)
        col_t = (top * H + h) * BT + i * BC
        col_b = (bot * H + h) * BT + i * BC + HB
        for j in range(0, HB):
            t_row_ok = k_ok & (first + j < eos)
            kt_row = tl.load(k_ptr + ((first + j) * HQK + hqk) * K + ks, mask=t_row_ok, other=0.0).to(tl.float32)
            gt_row = tl.load(gc_ptr + ((first + j) * H + h) * K + ks, mask=t_row_ok, other=0.0)
            kb_row = tl.load(k_ptr + ((first + HB + j) * HQK + hqk) * K + ks, mask=k_ok & (first + HB + j < eos),
                             other=0.0).to(tl.float32)
            gb_row = tl.load(gc_ptr + ((first + HB + j) * H + h) * K + ks, mask=k_ok & (first + HB + j < eos),
                             other=0.0)
            c_t = tl.sum(q_t * kt_row[None, :] * tl.exp(tl.minimum(g_t - gt_row[None, :], 0.0)), 1)
            c_b = tl.sum(q_b * kb_row[None, :] * tl.exp(tl.minimum(g_b - gb_row[None, :], 0.0)), 1)
            tl.store(a_ptr + col_t + j, c_t, mask=(top < eos) & (hs >= j))
            tl.store(a_ptr + col_b + j, c_b, mask=(bot < eos) & (hs >= j))


@triton.jit
def linear_output_fwd(q_ptr, k_ptr, v_ptr, gc_ptr, hs_ptr, a_ptr, cu_ptr, seq_ptr, rs_ptr, skip_ptr, o_ptr,
                      T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr,
                      SCALAR_GATE: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr,
                      ROW_SCALE: tl.constexpr = False, HAS_SKIP: tl.constexpr = False):
    """Phase (c), per (chunk slot, V block, head): the chunk's output from the state entering it and its
    own tokens, ``scale ((q ⊙ e^G) S + A v)``. A scalar gate forms the ``[BT, BT]`` intra-chunk weights
    ``A`` here (``k_ptr`` read, ``a_ptr`` not); per-channel gates read those :func:`gla_intra_fwd` wrote
    (``a_ptr`` read, ``k_ptr`` not). ``ROW_SCALE``: ``v``'s rows times ``rs [R, H]`` (see :func:`_row_scaled`);
    ``HAS_SKIP``: plus ``skip[h]`` times ``v`` as read."""
    slot = tl.program_id(0).to(tl.int64)
    iv = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    hqk = h // (H // HQK)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    dt = q_ptr.dtype.element_ty
    ks = tl.arange(0, BK)
    vs = iv * BV + tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    ts = tl.arange(0, BT)
    rows = start + ts
    t_ok = rows < eos
    qk_off = (rows[:, None] * HQK + hqk) * K + ks[None, :]
    qk_mask = t_ok[:, None] & k_ok[None, :]
    keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
    state = tl.load(hs_ptr + (slot * H + h) * K * V + ks[:, None] * V + vs[None, :],
                    mask=k_ok[:, None] & v_ok[None, :], other=0.0).to(dt)
    q = tl.load(q_ptr + qk_off, mask=qk_mask, other=0.0)
    if SCALAR_GATE:
        k = tl.load(k_ptr + qk_off, mask=qk_mask, other=0.0)
        cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
        weights = tl.dot(q, tl.trans(k), input_precision=PREC) * tl.exp(
            tl.where(keep, cum[:, None] - cum[None, :], _NEG_INF))
        q_in = (q.to(tl.float32) * tl.exp(cum)[:, None]).to(dt)
    else:
        cum = tl.load(gc_ptr + (rows[:, None] * H + h) * K + ks[None, :], mask=qk_mask, other=0.0)
        weights = tl.load(a_ptr + (rows[:, None] * H + h) * BT + ts[None, :], mask=keep, other=0.0)
        q_in = (q.to(tl.float32) * tl.exp(cum)).to(dt)
    v = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :], other=0.0)
    v_in = _row_scaled(v, rs_ptr, rows, t_ok, H, h, ROW_SCALE).to(dt)
    out = (tl.dot(q_in, state, input_precision=PREC) + tl.dot(weights.to(dt), v_in, input_precision=PREC)) * SCALE
    if HAS_SKIP:
        out += tl.load(skip_ptr + h) * v.to(tl.float32)
    tl.store(o_ptr + (rows[:, None] * H + h) * V + vs[None, :], out.to(o_ptr.dtype.element_ty),
             mask=t_ok[:, None] & v_ok[None, :])


@triton.jit
def linear_dstates_bwd(q_ptr, gc_ptr, do_ptr, dht_ptr, cu_ptr, dhs_ptr, dh0_ptr,
                       T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr,
                       SCALAR_GATE: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """The backward's sequential phase, per (sequence·head, K block, V block), chunks in reverse: the
    cotangent of the state leaving every chunk (``dS ← e^{G_last} ⊙ dS + scale (q ⊙ e^G)ᵀ do`` across a
    chunk), from the final state's, then the initial state's. Chunk-local cumulative gates ``[R, H, K]``
    (per channel) or ``[R, H]`` (``SCALAR_GATE``)."""
    nh = tl.program_id(0).to(tl.int64)
    ik = tl.program_id(1)
    iv = tl.program_id(2)
    n = nh // H
    h = nh % H
    hqk = h // (H // HQK)
    bos, eos = _bounds(cu_ptr, n, T, VARLEN)
    dt = q_ptr.dtype.element_ty
    ks = ik * BK + tl.arange(0, BK)
    vs = iv * BV + tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    tile = ks[:, None] * V + vs[None, :]
    tile_mask = k_ok[:, None] & v_ok[None, :]
    d_state = tl.load(dht_ptr + nh * K * V + tile, mask=tile_mask, other=0.0).to(tl.float32)
    ts = tl.arange(0, BT)
    chunks = (eos - bos + BT - 1) // BT
    slot = bos // BT + n + chunks
    for back in range(0, chunks):
        slot -= 1
        tl.store(dhs_ptr + (slot * H + h) * K * V + tile, d_state.to(dhs_ptr.dtype.element_ty), mask=tile_mask)
        first = bos + (chunks - 1 - back) * BT
        rows = first + ts
        t_ok = rows < eos
        qk_mask = t_ok[:, None] & k_ok[None, :]
        q = tl.load(q_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=qk_mask, other=0.0)
        end = tl.minimum(first + BT, eos) - 1
        do = tl.load(do_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :],
                     other=0.0)
        if SCALAR_GATE:
            cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
            last = tl.load(gc_ptr + end * H + h)
            q_in = (q.to(tl.float32) * (tl.exp(cum) * SCALE)[:, None]).to(dt)
            d_state = d_state * tl.exp(last)
        else:
            cum = tl.load(gc_ptr + (rows[:, None] * H + h) * K + ks[None, :], mask=qk_mask, other=0.0)
            last = tl.load(gc_ptr + (end * H + h) * K + ks, mask=k_ok, other=0.0)
            q_in = (q.to(tl.float32) * tl.exp(cum) * SCALE).to(dt)
            d_state = d_state * tl.exp(last)[:, None]
        d_state += tl.dot(tl.trans(q_in), do.to(dt), input_precision=PREC)
    tl.store(dh0_ptr + nh * K * V + tile, d_state, mask=tile_mask)


@triton.jit
def _state_terms(do_ptr, v_ptr, rs_ptr, hs_ptr, dhs_ptr, state_base, rows, t_ok, h, ks, k_ok, with_da,
                 H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 PREC: tl.constexpr, ROW_SCALE: tl.constexpr = False, WITH_SD: tl.constexpr = False):
    """A chunk's ``(do Sᵀ, v dS'ᵀ, do vᵀ, Σ S ⊙ dS')`` (float32; the third only ``with_da``, else zeros; the
    last, summed over the block's rows and every column, only ``WITH_SD``, else 0), V walked in blocks of
    ``BV``, from the state entering it ``S`` and the cotangent of the state leaving it ``dS'`` (``[K, V]`` at
    ``state_base``). ``ROW_SCALE``: ``v``'s rows times ``rs [R, H]`` (see :func:`_row_scaled`)."""
    dt = v_ptr.dtype.element_ty
    d_q = tl.zeros([BT, BK], tl.float32)
    d_k = tl.zeros([BT, BK], tl.float32)
    d_a = tl.zeros([BT, BT], tl.float32)
    sd = tl.zeros([BK, BV], tl.float32)
    for v0 in range(0, V, BV):
        vs = v0 + tl.arange(0, BV)
        v_ok = vs < V
        tv_off = (rows[:, None] * H + h) * V + vs[None, :]
        tv_mask = t_ok[:, None] & v_ok[None, :]
        do = tl.load(do_ptr + tv_off, mask=tv_mask, other=0.0).to(dt)
        v = _row_scaled(tl.load(v_ptr + tv_off, mask=tv_mask, other=0.0).to(dt), rs_ptr, rows, t_ok, H, h,
                        ROW_SCALE)
        state_off = state_base + ks[:, None] * V + vs[None, :]
        state_mask = k_ok[:, None] & v_ok[None, :]
        state = tl.load(hs_ptr + state_off, mask=state_mask, other=0.0)
        d_state = tl.load(dhs_ptr + state_off, mask=state_mask, other=0.0)
        if WITH_SD:
            sd += state.to(tl.float32) * d_state.to(tl.float32)
        d_q += tl.dot(do, tl.trans(state.to(dt)), input_precision=PREC)
        d_k += tl.dot(v, tl.trans(d_state.to(dt)), input_precision=PREC)
        if with_da:
            d_a += tl.dot(do, tl.trans(v), input_precision=PREC)
    return d_q, d_k, d_a, tl.sum(tl.sum(sd, 1), 0)


@triton.jit
def gla_inter_bwd(q_ptr, k_ptr, v_ptr, gc_ptr, do_ptr, hs_ptr, dhs_ptr, cu_ptr, seq_ptr, dq_ptr, dk_ptr, da_ptr,
                  T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr, VARLEN: tl.constexpr,
                  PREC: tl.constexpr):
    """The backward's first parallel phase, per (chunk slot, K block, head), V walked in blocks of ``BV``:
    the state terms ``dq = scale (do Sᵀ) ⊙ e^G`` and ``dk = (v dS'ᵀ) ⊙ e^{G_last - G}`` (float32), and (the
    first K block) the intra-chunk weights' cotangent ``dA = scale do vᵀ`` (causal, ``[R, H, BT]`` float32),
    from the state entering the chunk ``S`` and the cotangent of the state leaving it ``dS'``."""
    slot = tl.program_id(0).to(tl.int64)
    ik = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    end = tl.minimum(start + BT, eos)
    ks = ik * BK + tl.arange(0, BK)
    k_ok = ks < K
    ts = tl.arange(0, BT)
    rows = start + ts
    t_ok = rows < eos
    tk_mask = t_ok[:, None] & k_ok[None, :]
    tk_off = (rows[:, None] * H + h) * K + ks[None, :]
    d_q, d_k, d_a, _ = _state_terms(do_ptr, v_ptr, v_ptr, hs_ptr, dhs_ptr, (slot * H + h) * K * V, rows, t_ok, h,
                                    ks, k_ok, ik == 0, H, V, BT, BK, BV, PREC)
    cum = tl.load(gc_ptr + tk_off, mask=tk_mask, other=0.0)
    last = tl.load(gc_ptr + ((end - 1) * H + h) * K + ks, mask=k_ok & (start < eos), other=0.0)
    tl.store(dq_ptr + tk_off, d_q * SCALE * tl.exp(cum), mask=tk_mask)
    tl.store(dk_ptr + tk_off, d_k * tl.exp(tl.where(tk_mask, last[None, :] - cum, 0.0)), mask=tk_mask)
    if ik == 0:
        keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
        tl.store(da_ptr + (rows[:, None] * H + h) * BT + ts[None, :], tl.where(keep, d_a * SCALE, 0.0),
                 mask=t_ok[:, None])


@triton.jit
def gla_intra_bwd(q_ptr, k_ptr, gc_ptr, da_ptr, cu_ptr, seq_ptr, dq0_ptr, dk0_ptr, dq_ptr, dk_ptr,
                  T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                  BK: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """The backward's intra-chunk terms, per (chunk slot, K block · sub-block of ``BC`` tokens, head), added
    to the state terms ``dq0`` / ``dk0`` :func:`gla_inter_bwd` wrote: ``dq_i += Σ_{j<=i} dA_ij k_j ⊙
    e^{G_i - G_j}`` and ``dk_j += Σ_{i>=j} dA_ij q_i ⊙ e^{G_i - G_j}``: other sub-blocks through products
    whose exponents are split at a row between the two (both factors ``<= 0``); the diagonal sub-block's
    lower-left quadrant the same way, split at its middle row, its two diagonal quadrants exactly, one row at
    a time (added to what the rest stored, after a barrier)."""
    NC: tl.constexpr = BT // BC
    slot = tl.program_id(0).to(tl.int64)
    ik = tl.program_id(1) // NC
    i = tl.program_id(1) % NC
    h = tl.program_id(2).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    first = start + i * BC
    if first < eos:
        dt = q_ptr.dtype.element_ty
        ks = ik * BK + tl.arange(0, BK)
        k_ok = ks < K
        cs = tl.arange(0, BC)
        rows = first + cs
        t_ok = rows < eos
        mask = t_ok[:, None] & k_ok[None, :]
        off = (rows[:, None] * H + h) * K + ks[None, :]
        g = tl.load(gc_ptr + off, mask=mask, other=0.0)
        da_rows = (rows[:, None] * H + h) * BT
        d_q = tl.zeros([BC, BK], tl.float32)
        d_k = tl.zeros([BC, BK], tl.float32)
        # dq from the earlier sub-blocks, split at this one's first row
        ref = tl.load(gc_ptr + (first * H + h) * K + ks, mask=k_ok, other=0.0)
        for j in range(0, i):
            cols = start + j * BC + cs  # before ``first``, so inside the sequence
            c_off = (cols[:, None] * H + h) * K + ks[None, :]
            kj = tl.load(k_ptr + c_off, mask=k_ok[None, :], other=0.0).to(tl.float32)
            gj = tl.load(gc_ptr + c_off, mask=k_ok[None, :], other=0.0)
            k_n = (kj * tl.exp(ref[None, :] - gj)).to(dt)
            da = tl.load(da_ptr + da_rows + (j * BC + cs)[None, :], mask=t_ok[:, None], other=0.0)
            d_q += tl.dot(da.to(dt), k_n, input_precision=PREC)
        d_q *= tl.exp(tl.where(mask, g - ref[None, :], 0.0))
        # dk from the later sub-blocks, split at this one's last row
        mid = tl.minimum(first + BC, eos) - 1
        ref_k = tl.load(gc_ptr + (mid * H + h) * K + ks, mask=k_ok, other=0.0)
        for m in range(i + 1, NC):
            later = start + m * BC + cs
            l_ok = later < eos
            l_mask = l_ok[:, None] & k_ok[None, :]
            l_off = (later[:, None] * H + h) * K + ks[None, :]
            qm = tl.load(q_ptr + l_off, mask=l_mask, other=0.0).to(tl.float32)
            gm = tl.load(gc_ptr + l_off, mask=l_mask, other=0.0)
            q_n = (qm * tl.exp(tl.where(l_mask, gm - ref_k[None, :], 0.0))).to(dt)
            da = tl.load(da_ptr + (later[:, None] * H + h) * BT + (i * BC + cs)[None, :], mask=l_ok[:, None],
                         other=0.0)
            d_k += tl.dot(tl.trans(da.to(dt)), q_n, input_precision=PREC)
        d_k *= tl.exp(tl.where(mask, ref_k[None, :] - g, 0.0))
        # the diagonal sub-block's lower-left quadrant through products split at its middle row (both factors
        # <= 0) ...
        HB: tl.constexpr = BC // 2
        mid_row = tl.minimum(first + HB, eos - 1)
        ref_m = tl.load(gc_ptr + (mid_row * H + h) * K + ks, mask=k_ok, other=0.0)
        lower = (cs >= HB)[:, None]
        q_d = tl.load(q_ptr + off, mask=mask, other=0.0).to(tl.float32)
        k_d = tl.load(k_ptr + off, mask=mask, other=0.0).to(tl.float32)
        da_d = tl.load(da_ptr + da_rows + (i * BC + cs)[None, :], mask=t_ok[:, None], other=0.0)
        da_ll = tl.where(lower & (cs < HB)[None, :], da_d, 0.0).to(dt)
        to_mid = tl.exp(tl.minimum(g - ref_m[None, :], 0.0))  # rows at or after the middle row
        from_mid = tl.exp(tl.minimum(ref_m[None, :] - g, 0.0))  # rows before it
        k_m = tl.where(lower, 0.0, k_d * from_mid).to(dt)
        q_m = tl.where(lower, q_d * to_mid, 0.0).to(dt)
        d_q += tl.where(lower, tl.dot(da_ll, k_m, input_precision=PREC) * to_mid, 0.0)
        d_k += tl.where(lower, 0.0, tl.dot(tl.trans(da_ll), q_m, input_precision=PREC) * from_mid)
        tl.store(dq_ptr + off, tl.load(dq0_ptr + off, mask=mask, other=0.0) + d_q, mask=mask)
        tl.store(dk_ptr + off, tl.load(dk0_ptr + off, mask=mask, other=0.0) + d_k, mask=mask)
        tl.debug_barrier()
        # ... and its two diagonal quadrants exactly, one row of each at a time, added to what was stored
        hs = tl.arange(0, HB)
        for half in tl.static_range(0, 2):
            h_rows = first + half * HB + hs
            h_ok = h_rows < eos
            h_mask = h_ok[:, None] & k_ok[None, :]
            h_off = (h_rows[:, None] * H + h) * K + ks[None, :]
            g_h = tl.load(gc_ptr + h_off, mask=h_mask, other=0.0)
            da_h = (h_rows[:, None] * H + h) * BT + i * BC + half * HB
            dq_h = tl.zeros([HB, BK], tl.float32)
            dk_h = tl.zeros([HB, BK], tl.float32)
            for j in range(0, HB):
                row = first + half * HB + j
                row_ok = k_ok & (row < eos)
                r_off = (row * H + h) * K + ks
                kr = tl.load(k_ptr + r_off, mask=row_ok, other=0.0).to(tl.float32)
                qr = tl.load(q_ptr + r_off, mask=row_ok, other=0.0).to(tl.float32)
                gr = tl.load(gc_ptr + r_off, mask=row_ok, other=0.0)
                da_col = tl.load(da_ptr + da_h + j, mask=h_ok[:, None], other=0.0)  # [HB, 1]: dA[:, j]
                da_row = tl.load(da_ptr + (row * H + h) * BT + i * BC + half * HB + hs, mask=(hs <= j) & (row < eos),
                                 other=0.0)
                later_rows = ((hs >= j) & h_ok)[:, None] & k_ok[None, :]
                earlier_rows = ((hs <= j) & h_ok)[:, None] & k_ok[None, :]
                dq_h += da_col * kr[None, :] * tl.exp(tl.where(later_rows, g_h - gr[None, :], _NEG_INF))
                dk_h += da_row[:, None] * qr[None, :] * tl.exp(tl.where(earlier_rows, gr[None, :] - g_h, _NEG_INF))
            tl.store(dq_ptr + h_off, tl.load(dq_ptr + h_off, mask=h_mask, other=0.0) + dq_h, mask=h_mask)
            tl.store(dk_ptr + h_off, tl.load(dk_ptr + h_off, mask=h_mask, other=0.0) + dk_h, mask=h_mask)


@triton.jit
def gla_dv_bwd(k_ptr, gc_ptr, do_ptr, dhs_ptr, a_ptr, cu_ptr, seq_ptr, dv_ptr,
               T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """Per (chunk slot, V block, head): ``dv = (k ⊙ e^{G_last - G}) dS' + scale Aᵀ do`` (float32), ``A`` the
    intra-chunk weights :func:`gla_intra_fwd` wrote."""
    slot = tl.program_id(0).to(tl.int64)
    iv = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    end = tl.minimum(start + BT, eos)
    dt = k_ptr.dtype.element_ty
    ks = tl.arange(0, BK)
    k_ok = ks < K
    vs = iv * BV + tl.arange(0, BV)
    v_ok = vs < V
    ts = tl.arange(0, BT)
    rows = start + ts
    t_ok = rows < eos
    tk_mask = t_ok[:, None] & k_ok[None, :]
    tk_off = (rows[:, None] * H + h) * K + ks[None, :]
    k = tl.load(k_ptr + tk_off, mask=tk_mask, other=0.0).to(tl.float32)
    cum = tl.load(gc_ptr + tk_off, mask=tk_mask, other=0.0)
    last = tl.load(gc_ptr + ((end - 1) * H + h) * K + ks, mask=k_ok & (start < eos), other=0.0)
    k_out = (k * tl.exp(tl.where(tk_mask, last[None, :] - cum, 0.0))).to(dt)
    d_state = tl.load(dhs_ptr + (slot * H + h) * K * V + ks[:, None] * V + vs[None, :],
                      mask=k_ok[:, None] & v_ok[None, :], other=0.0).to(dt)
    keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
    a = tl.load(a_ptr + (rows[:, None] * H + h) * BT + ts[None, :], mask=keep, other=0.0)
    tv_off = (rows[:, None] * H + h) * V + vs[None, :]
    tv_mask = t_ok[:, None] & v_ok[None, :]
    do = tl.load(do_ptr + tv_off, mask=tv_mask, other=0.0).to(dt)
    d_v = tl.dot(k_out, d_state, input_precision=PREC) + tl.dot(tl.trans((a * SCALE).to(dt)), do,
                                                                 input_precision=PREC)
    tl.store(dv_ptr + tv_off, d_v, mask=tv_mask)


@triton.jit
def scalar_dqk_bwd(q_ptr, k_ptr, v_ptr, gc_ptr, do_ptr, hs_ptr, dhs_ptr, cu_ptr, seq_ptr, rs_ptr, dq_ptr, dk_ptr,
                   dg_ptr, T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr,
                   VARLEN: tl.constexpr, PREC: tl.constexpr, ROW_SCALE: tl.constexpr):
    """A scalar gate's ``dq``, ``dk`` and log-gate gradient per (chunk slot, K block, head), V walked in blocks
    of ``BV`` (float32, ``dq`` / ``dk`` per head ``[R, H, K]``). With ``D_ij = e^{G_i - G_j}`` (``j <= i``) and
    ``dA = scale (do vᵀ) ⊙ D``: ``dq = scale (do Sᵀ) e^G + dA k`` and ``dk = (v dS'ᵀ) e^{G_last - G} + dAᵀ q``,
    from the state entering the chunk ``S`` and the cotangent of the state leaving it ``dS'``; q / k head
    ``h // (H // HQK)``; ``ROW_SCALE``: ``v``'s rows times ``rs [R, H]``.

    The log gate ``g_t`` scales every path from a token ``j < t`` to a reader ``i >= t``, so its gradient is
    the sum over those pairs, written ``dg [R, H, K blocks]`` (this K block's share; no difference of large
    sums): inside the chunk ``Σ_{i >= t > j} M_ij`` with ``M = dA ⊙ (q kᵀ)``; the state entering, read by
    rows ``i >= t`` (``q_i · dq_i``'s state term); the rows ``j < t`` carried out by the state leaving
    (``k_j · dk_j``'s state term); and ``e^{G_last} Σ S ⊙ dS'``, what passes through the whole chunk."""
    slot = tl.program_id(0).to(tl.int64)
    ik = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    if start < eos:
        dt = q_ptr.dtype.element_ty
        hqk = h // (H // HQK)
        ks = ik * BK + tl.arange(0, BK)
        k_ok = ks < K
        ts = tl.arange(0, BT)
        rows = start + ts
        t_ok = rows < eos
        tk_mask = t_ok[:, None] & k_ok[None, :]
        qk_off = (rows[:, None] * HQK + hqk) * K + ks[None, :]
        tk_off = (rows[:, None] * H + h) * K + ks[None, :]
        d_q, d_k, d_a, sd = _state_terms(do_ptr, v_ptr, rs_ptr, hs_ptr, dhs_ptr, (slot * H + h) * K * V, rows, t_ok,
                                         h, ks, k_ok, True, H, V, BT, BK, BV, PREC, ROW_SCALE, True)
        cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
        last = tl.load(gc_ptr + (tl.minimum(start + BT, eos) - 1) * H + h)
        keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
        d_a = d_a * SCALE * tl.exp(tl.where(keep, cum[:, None] - cum[None, :], _NEG_INF))
        q = tl.load(q_ptr + qk_off, mask=tk_mask, other=0.0).to(dt)
        k = tl.load(k_ptr + qk_off, mask=tk_mask, other=0.0).to(dt)
        # the log gates' gradient, by the pairs of tokens each gate lies between
        into = d_q * (SCALE * tl.exp(cum))[:, None]  # dq's state term
        out_of = d_k * tl.exp(tl.where(t_ok, last - cum, 0.0))[:, None]  # dk's state term
        read = tl.sum(into * q.to(tl.float32), 1)  # row i reads the state entering: gates t <= i
        carried = tl.sum(out_of * k.to(tl.float32), 1)  # row j is carried out: gates t > j
        pairs = d_a * tl.dot(q, tl.trans(k), input_precision=PREC)
        before = tl.cumsum(pairs, 1) - pairs  # [i, t]: Σ_{j < t} M_ij
        inside = tl.sum(tl.where(ts[:, None] >= ts[None, :], before, 0.0), 0)
        d_g = (inside + tl.sum(read, 0) - tl.cumsum(read, 0) + read + tl.cumsum(carried, 0) - carried
               + tl.exp(last) * sd)
        tl.store(dg_ptr + (rows * H + h) * tl.num_programs(1) + ik, d_g, mask=t_ok)
        d_a = d_a.to(dt)
        tl.store(dq_ptr + tk_off, into + tl.dot(d_a, k, input_precision=PREC), mask=tk_mask)
        tl.store(dk_ptr + tk_off, out_of + tl.dot(tl.trans(d_a), q, input_precision=PREC), mask=tk_mask)


@triton.jit
def scalar_dx_bwd(q_ptr, k_ptr, x_ptr, gc_ptr, do_ptr, dhs_ptr, cu_ptr, seq_ptr, rs_ptr, skip_ptr, dx_ptr, dr_ptr,
                  dskip_ptr, T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALE: tl.constexpr, VARLEN: tl.constexpr,
                  PREC: tl.constexpr, HAS_SKIP: tl.constexpr):
    """A scalar gate's value cotangent per (chunk slot, V block, head), for values ``v = x ⊙ r`` (``r = rs
    [R, H]`` per row) and, with ``HAS_SKIP``, an output that adds ``skip[h] · x``: ``dv = (k e^{G_last - G}) dS'
    + scale ((q kᵀ) ⊙ D)ᵀ do`` with ``D_ij = e^{G_i - G_j}`` (``j <= i``; q / k head ``h // (H // HQK)``),
    stored as ``dx = dv r + skip[h] do`` (``x``'s dtype) and this V block's shares of ``dr = Σ_v dv x`` and
    of the skip's ``Σ_v do x`` (``[R, H, V blocks]`` float32 each)."""
    slot = tl.program_id(0).to(tl.int64)
    iv = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    start, eos = _slot_chunk(seq_ptr, cu_ptr, slot, T, BT, VARLEN)
    if start < eos:
        dt = k_ptr.dtype.element_ty
        ks = tl.arange(0, BK)
        k_ok = ks < K
        vs = iv * BV + tl.arange(0, BV)
        v_ok = vs < V
        ts = tl.arange(0, BT)
        rows = start + ts
        t_ok = rows < eos
        tk_mask = t_ok[:, None] & k_ok[None, :]
        tk_off = (rows[:, None] * HQK + h // (H // HQK)) * K + ks[None, :]
        q = tl.load(q_ptr + tk_off, mask=tk_mask, other=0.0).to(dt)
        k = tl.load(k_ptr + tk_off, mask=tk_mask, other=0.0)
        cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
        last = tl.load(gc_ptr + (tl.minimum(start + BT, eos) - 1) * H + h)
        keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
        a = tl.dot(q, tl.trans(k.to(dt)), input_precision=PREC) * (
            SCALE * tl.exp(tl.where(keep, cum[:, None] - cum[None, :], _NEG_INF)))
        k_out = (k.to(tl.float32) * tl.exp(tl.where(t_ok, last - cum, 0.0))[:, None]).to(dt)
        d_state = tl.load(dhs_ptr + (slot * H + h) * K * V + ks[:, None] * V + vs[None, :],
                          mask=k_ok[:, None] & v_ok[None, :], other=0.0).to(dt)
        tv_off = (rows[:, None] * H + h) * V + vs[None, :]
        tv_mask = t_ok[:, None] & v_ok[None, :]
        do = tl.load(do_ptr + tv_off, mask=tv_mask, other=0.0).to(dt)
        d_v = tl.dot(k_out, d_state, input_precision=PREC) + tl.dot(tl.trans(a.to(dt)), do, input_precision=PREC)
        x = tl.load(x_ptr + tv_off, mask=tv_mask, other=0.0).to(tl.float32)
        factor = tl.load(rs_ptr + rows * H + h, mask=t_ok, other=0.0)
        d_x = d_v * factor[:, None]
        share = (rows * H + h) * tl.num_programs(1) + iv
        if HAS_SKIP:
            d_x += tl.load(skip_ptr + h) * do.to(tl.float32)
            tl.store(dskip_ptr + share, tl.sum(do.to(tl.float32) * x, 1), mask=t_ok)
        tl.store(dx_ptr + tv_off, d_x.to(dx_ptr.dtype.element_ty), mask=tv_mask)
        tl.store(dr_ptr + share, tl.sum(d_v * x, 1), mask=t_ok)
