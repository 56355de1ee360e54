# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` forward kernel of the chunked linear recurrences (``gla``, ``ssd``).

Imported only when the kernel is launched (this module imports triton; see ``_env.import_triton``).

Layouts (contiguous): q, k ``[R, HQK, K]`` (``R`` = batch x tokens; head ``h`` reads q/k head
``h // (H // HQK)``), v ``[R, H, V]``, log gates g ``[R, H, K]`` (per channel) or ``[R, H]``
(``SCALAR_GATE``), initial states ``[N, H, K, V]`` float32, offsets ``[N+1]`` int32 (``VARLEN``).
Outputs: o ``[R, H, V]`` and the final states ``[N, H, K, V]`` float32.

One program runs one sequence (a batch row, or a packed sequence) of one head over ``BV`` columns
of the state, chunk after chunk of ``BT`` tokens, the state ``[K, BV]`` in float32 registers; a
chunk never crosses its sequence's end. Per chunk, with ``G`` the running sum of the log gates
inside it (``<= 0``)::

    o     = scale · ((q ⊙ e^G) S + (Σ_k q_ik k_jk e^{G_ik - G_jk})_{j<=i} v)
    S    ← e^{G_last} ⊙ S + (k ⊙ e^{G_last - G})ᵀ v

The intra-chunk weights are formed exactly (every exponent ``<= 0``): ``[BT, BT]`` for a scalar
gate, ``[BT, BT, BKS]`` per slice of ``BKS`` channels for per-channel gates.
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
def linear_states_fwd(k_ptr, v_ptr, g_ptr, h0_ptr, cu_ptr, gc_ptr, hs_ptr, ht_ptr,
                      T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR_GATE: tl.constexpr,
                      HAS_H0: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """Phases (a) and (b), per (sequence·head, K block, V block): the chunk-local cumulative gates (written
    by the first V block) and the state entering every chunk of the sequence, then its final state."""
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
    write_gates = iv == 0
    if SCALAR_GATE:
        write_gates = write_gates & (ik == 0)
    ts = tl.arange(0, BT)
    slot = bos // BT + n  # this sequence's first chunk slot (see _chunk_slots)
    for start in range(bos, eos, BT):
        tl.store(hs_ptr + (slot * H + h) * K * V + tile, state.to(hs_ptr.dtype.element_ty), mask=tile_mask)
        slot += 1
        rows = start + ts
        t_ok = rows < eos
        qk_mask = t_ok[:, None] & k_ok[None, :]
        k = tl.load(k_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=qk_mask, other=0.0)
        v = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :],
                    other=0.0)
        if SCALAR_GATE:
            gate = tl.load(g_ptr + rows * H + h, mask=t_ok, other=0.0).to(tl.float32)
            cum = tl.cumsum(gate, 0)
            tl.store(gc_ptr + rows * H + h, cum, mask=t_ok & write_gates)
            last = tl.sum(gate, 0)
            k_out = k.to(tl.float32) * tl.exp(last - cum)[:, None]
            state = state * tl.exp(last)
        else:
            g_off = (rows[:, None] * H + h) * K + ks[None, :]
            gate = tl.load(g_ptr + g_off, mask=qk_mask, other=0.0).to(tl.float32)
            cum = tl.cumsum(gate, 0)
            tl.store(gc_ptr + g_off, cum, mask=qk_mask & write_gates)
            last = tl.sum(gate, 0)
            k_out = k.to(tl.float32) * tl.exp(last[None, :] - cum)
            state = state * tl.exp(last)[:, None]
        state += tl.dot(tl.trans(k_out.to(dt)), v.to(dt), input_precision=PREC)
    tl.store(ht_ptr + nh * K * V + tile, state, mask=tile_mask)


@triton.jit
def linear_output_fwd(q_ptr, k_ptr, v_ptr, gc_ptr, hs_ptr, cu_ptr, seq_ptr, o_ptr,
                      T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
                      SCALE: tl.constexpr, SCALAR_GATE: tl.constexpr, VARLEN: tl.constexpr, PREC: tl.constexpr):
    """Phase (c), per (chunk slot, V block, head): the chunk's output from the state entering it and its
    own tokens. A scalar gate forms the ``[BT, BT]`` intra-chunk weights at once; per-channel gates go by
    sub-blocks of ``BC`` tokens: the earlier sub-blocks through one product whose exponents are split at
    the sub-block's first token (both factors ``<= 0``), the diagonal sub-block exactly."""
    slot = tl.program_id(0).to(tl.int64)
    iv = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    n = tl.load(seq_ptr + slot).to(tl.int64)
    hqk = h // (H // HQK)
    bos, eos = _bounds(cu_ptr, n, T, VARLEN)
    start = bos + (slot - bos // BT - n) * BT  # at or past eos for a slot no chunk uses: nothing is stored
    dt = q_ptr.dtype.element_ty
    ks = tl.arange(0, BK)
    vs = iv * BV + tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    state = tl.load(hs_ptr + (slot * H + h) * K * V + ks[:, None] * V + vs[None, :],
                    mask=k_ok[:, None] & v_ok[None, :], other=0.0).to(dt)
    if SCALAR_GATE:
        ts = tl.arange(0, BT)
        rows = start + ts
        t_ok = rows < eos
        qk_off = (rows[:, None] * HQK + hqk) * K + ks[None, :]
        qk_mask = t_ok[:, None] & k_ok[None, :]
        q = tl.load(q_ptr + qk_off, mask=qk_mask, other=0.0)
        k = tl.load(k_ptr + qk_off, mask=qk_mask, other=0.0)
        v = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :],
                    other=0.0)
        cum = tl.load(gc_ptr + rows * H + h, mask=t_ok, other=0.0)
        keep = (ts[:, None] >= ts[None, :]) & t_ok[:, None]
        scores = tl.dot(q, tl.trans(k), input_precision=PREC) * tl.exp(
            tl.where(keep, cum[:, None] - cum[None, :], _NEG_INF))
        q_in = (q.to(tl.float32) * tl.exp(cum)[:, None]).to(dt)
        out = tl.dot(q_in, state, input_precision=PREC) + tl.dot(scores.to(dt), v.to(dt), input_precision=PREC)
        tl.store(o_ptr + (rows[:, None] * H + h) * V + vs[None, :], (out * SCALE).to(o_ptr.dtype.element_ty),
                 mask=t_ok[:, None] & v_ok[None, :])
    else:
        cs = tl.arange(0, BC)
        diag = cs[:, None] >= cs[None, :]
        for i in tl.static_range(0, BT // BC):
            first = start + i * BC
            rows = first + cs
            t_ok = rows < eos
            qk_mask = t_ok[:, None] & k_ok[None, :]
            tk_off = (rows[:, None] * H + h) * K + ks[None, :]
            q = tl.load(q_ptr + (rows[:, None] * HQK + hqk) * K + ks[None, :], mask=qk_mask, other=0.0).to(tl.float32)
            cum = tl.load(gc_ptr + tk_off, mask=qk_mask, other=0.0)
            out = tl.dot((q * tl.exp(cum)).to(dt), state, input_precision=PREC)
            if i > 0:  # the chunk's earlier sub-blocks, split at this one's first token
                ref = tl.load(gc_ptr + ((first - 1) * H + h) * K + ks, mask=k_ok & (first - 1 < eos), other=0.0)
                prev = start + tl.arange(0, BT)
                p_ok = (prev < first) & (prev < eos)
                p_mask = p_ok[:, None] & k_ok[None, :]
                kp = tl.load(k_ptr + (prev[:, None] * HQK + hqk) * K + ks[None, :], mask=p_mask, other=0.0)
                gp = tl.load(gc_ptr + (prev[:, None] * H + h) * K + ks[None, :], mask=p_mask, other=0.0)
                q_n = q * tl.exp(tl.where(qk_mask, cum - ref[None, :], 0.0))
                k_n = kp.to(tl.float32) * tl.exp(tl.where(p_mask, ref[None, :] - gp, 0.0))
                scores = tl.dot(q_n.to(dt), tl.trans(k_n.to(dt)), input_precision=PREC)
                vp = tl.load(v_ptr + (prev[:, None] * H + h) * V + vs[None, :], mask=p_ok[:, None] & v_ok[None, :],
                             other=0.0)
                out += tl.dot(scores.to(dt), vp.to(dt), input_precision=PREC)
            own = tl.zeros([BC, BC], tl.float32)
            keep = (diag & t_ok[:, None])[:, :, None]
            for kk in tl.static_range(0, BK, BKS):
                part = kk + tl.arange(0, BKS)
                part_mask = t_ok[:, None] & (part < K)[None, :]
                qp = tl.load(q_ptr + (rows[:, None] * HQK + hqk) * K + part[None, :], mask=part_mask,
                             other=0.0).to(tl.float32)
                kp2 = tl.load(k_ptr + (rows[:, None] * HQK + hqk) * K + part[None, :], mask=part_mask,
                              other=0.0).to(tl.float32)
                gp2 = tl.load(gc_ptr + (rows[:, None] * H + h) * K + part[None, :], mask=part_mask, other=0.0)
                weights = tl.exp(tl.where(keep, gp2[:, None, :] - gp2[None, :, :], _NEG_INF))
                own += tl.sum(qp[:, None, :] * kp2[None, :, :] * weights, axis=2)
            vi = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=t_ok[:, None] & v_ok[None, :],
                         other=0.0)
            out += tl.dot(own.to(dt), vi.to(dt), input_precision=PREC)
            tl.store(o_ptr + (rows[:, None] * H + h) * V + vs[None, :], (out * SCALE).to(o_ptr.dtype.element_ty),
                     mask=t_ok[:, None] & v_ok[None, :])

@triton.jit
def gla_bwd(q_ptr, k_ptr, v_ptr, g_ptr, do_ptr, dht_ptr, hs_ptr, cu_ptr,
            dq_ptr, dk_ptr, dv_ptr, dh0_ptr,
            T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BT: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
            SCALE: tl.constexpr, VARLEN: tl.constexpr):
    """``gla``'s backward (per-channel gates): one program per (head, sequence) walks the chunks in
    reverse with the state's cotangent ``dS [K, V]`` (all of V: ``BV >= V``) in float32 registers,
    reading the state entering each chunk from the forward's ``hs``. Writes ``dq``, ``dk``, ``dv``
    (float32) and ``dh0``; the gates' gradient follows from them (see ``_linear_attention``)."""
    h = tl.program_id(1)
    n = tl.program_id(2)
    if VARLEN:
        bos = tl.load(cu_ptr + n).to(tl.int32)
        eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    else:
        bos = n * T
        eos = bos + T
    ks = tl.arange(0, BK)
    vs = tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    state_mask = k_ok[:, None] & v_ok[None, :]
    d_state = tl.load(dht_ptr + ((n * H + h) * K + ks[:, None]) * V + vs[None, :], mask=state_mask,
                      other=0.0).to(tl.float32)
    ts = tl.arange(0, BT)
    causal = ts[:, None] >= ts[None, :]
    slot = bos // BT + n
    chunks = tl.cdiv(eos - bos, BT)
    for back in range(0, chunks):
        c = chunks - 1 - back
        start = bos + c * BT
        rows = start + ts
        t_ok = rows < eos
        tk_off = (rows[:, None] * H + h) * K + ks[None, :]
        tk_mask = t_ok[:, None] & k_ok[None, :]
        tv_off = (rows[:, None] * H + h) * V + vs[None, :]
        tv_mask = t_ok[:, None] & v_ok[None, :]
        q = tl.load(q_ptr + tk_off, mask=tk_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + tk_off, mask=tk_mask, other=0.0).to(tl.float32)
        gate = tl.load(g_ptr + tk_off, mask=tk_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + tv_off, mask=tv_mask, other=0.0).to(tl.float32)
        do = tl.load(do_ptr + tv_off, mask=tv_mask, other=0.0).to(tl.float32)
        state = tl.load(hs_ptr + (((slot + c) * H + h) * K + ks[:, None]) * V + vs[None, :], mask=state_mask,
                        other=0.0)
        cum = tl.cumsum(gate, 0)
        total = tl.sum(gate, 0)
        q_in = q * tl.exp(cum)
        k_out = k * tl.exp(total[None, :] - cum)
        d_scores = tl.where(causal, tl.dot(do, tl.trans(v)), 0.0) * SCALE  # dA_ij = scale do_i . v_j
        scores = tl.zeros([BT, BT], tl.float32)
        for kk in tl.static_range(0, BK, BKS):
            part = kk + tl.arange(0, BKS)
            part_mask = t_ok[:, None] & (part < K)[None, :]
            part_off = (rows[:, None] * H + h) * K + part[None, :]
            qp = tl.load(q_ptr + part_off, mask=part_mask, other=0.0).to(tl.float32)
            kp = tl.load(k_ptr + part_off, mask=part_mask, other=0.0).to(tl.float32)
            cp = tl.cumsum(tl.load(g_ptr + part_off, mask=part_mask, other=0.0).to(tl.float32), 0)
            weights = tl.exp(tl.where(causal[:, :, None], cp[:, None, :] - cp[None, :, :], _NEG_INF))
            scores += tl.sum(qp[:, None, :] * kp[None, :, :] * weights, axis=2)
            dqp = tl.sum(d_scores[:, :, None] * kp[None, :, :] * weights, axis=1)
            dkp = tl.sum(d_scores[:, :, None] * qp[:, None, :] * weights, axis=0)
            tl.store(dq_ptr + part_off, dqp, mask=part_mask)
            tl.store(dk_ptr + part_off, dkp, mask=part_mask)
        dq_inter = tl.dot(do, tl.trans(state)) * tl.exp(cum) * SCALE
        dk_inter = tl.dot(v, tl.trans(d_state)) * tl.exp(total[None, :] - cum)
        tl.debug_barrier()
        dq = tl.load(dq_ptr + tk_off, mask=tk_mask, other=0.0) + dq_inter
        dk = tl.load(dk_ptr + tk_off, mask=tk_mask, other=0.0) + dk_inter
        tl.store(dq_ptr + tk_off, dq, mask=tk_mask)
        tl.store(dk_ptr + tk_off, dk, mask=tk_mask)
        dv = tl.dot(tl.trans(scores), do) * SCALE + tl.dot(k_out, d_state)
        tl.store(dv_ptr + tv_off, dv, mask=tv_mask)
        d_state = tl.exp(total)[:, None] * d_state + tl.dot(tl.trans(q_in), do) * SCALE
    tl.store(dh0_ptr + ((n * H + h) * K + ks[:, None]) * V + vs[None, :], d_state, mask=state_mask)
