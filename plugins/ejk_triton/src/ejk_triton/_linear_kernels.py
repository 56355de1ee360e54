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
def linear_recurrence_fwd(q_ptr, k_ptr, v_ptr, g_ptr, h0_ptr, cu_ptr, o_ptr, ht_ptr, hs_ptr,
                          T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
                          SCALE: tl.constexpr, SCALAR_GATE: tl.constexpr, HAS_H0: tl.constexpr,
                          VARLEN: tl.constexpr, STORE_STATES: tl.constexpr):
    iv = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.program_id(2)
    hqk = h // (H // HQK)
    if VARLEN:
        bos = tl.load(cu_ptr + n).to(tl.int32)
        eos = tl.load(cu_ptr + n + 1).to(tl.int32)
    else:
        bos = n * T
        eos = bos + T
    ks = tl.arange(0, BK)
    vs = iv * BV + tl.arange(0, BV)
    k_ok = ks < K
    v_ok = vs < V
    state_off = ((n * H + h) * K + ks[:, None]) * V + vs[None, :]
    state_mask = k_ok[:, None] & v_ok[None, :]
    if HAS_H0:
        state = tl.load(h0_ptr + state_off, mask=state_mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros([BK, BV], tl.float32)
    ts = tl.arange(0, BT)
    causal = ts[:, None] >= ts[None, :]
    slot = bos // BT + n  # this sequence's first chunk among every sequence's (see _chunk_slot)
    for start in range(bos, eos, BT):
        if STORE_STATES:
            chunk = slot + (start - bos) // BT
            tl.store(hs_ptr + ((chunk * H + h) * K + ks[:, None]) * V + vs[None, :], state, mask=state_mask)
        rows = start + ts
        t_ok = rows < eos
        qk_off = (rows[:, None] * HQK + hqk) * K + ks[None, :]
        qk_mask = t_ok[:, None] & k_ok[None, :]
        q = tl.load(q_ptr + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + qk_off, mask=qk_mask, other=0.0).to(tl.float32)
        v_mask = t_ok[:, None] & v_ok[None, :]
        v = tl.load(v_ptr + (rows[:, None] * H + h) * V + vs[None, :], mask=v_mask, other=0.0).to(tl.float32)
        if SCALAR_GATE:
            gate = tl.load(g_ptr + rows * H + h, mask=t_ok, other=0.0).to(tl.float32)
            cum = tl.cumsum(gate, 0)
            total = tl.sum(gate, 0)
            decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], _NEG_INF))
            scores = tl.dot(q, tl.trans(k)) * decay
            q_in = q * tl.exp(cum)[:, None]
            k_out = k * tl.exp(total - cum)[:, None]
            carry = tl.exp(total)
        else:
            gate = tl.load(g_ptr + (rows[:, None] * H + h) * K + ks[None, :], mask=qk_mask, other=0.0).to(tl.float32)
            cum = tl.cumsum(gate, 0)
            total = tl.sum(gate, 0)
            q_in = q * tl.exp(cum)
            k_out = k * tl.exp(total[None, :] - cum)
            carry = tl.exp(total)[:, None]
            scores = tl.zeros([BT, BT], tl.float32)
            for kk in tl.static_range(0, BK, BKS):
                part = kk + tl.arange(0, BKS)
                part_mask = t_ok[:, None] & (part < K)[None, :]
                part_off = (rows[:, None] * HQK + hqk) * K + part[None, :]
                qp = tl.load(q_ptr + part_off, mask=part_mask, other=0.0).to(tl.float32)
                kp = tl.load(k_ptr + part_off, mask=part_mask, other=0.0).to(tl.float32)
                gp = tl.load(g_ptr + (rows[:, None] * H + h) * K + part[None, :], mask=part_mask,
                             other=0.0).to(tl.float32)
                cp = tl.cumsum(gp, 0)
                weights = tl.exp(tl.where(causal[:, :, None], cp[:, None, :] - cp[None, :, :], _NEG_INF))
                scores += tl.sum(qp[:, None, :] * kp[None, :, :] * weights, axis=2)
        out = tl.dot(q_in, state) + tl.dot(scores, v)
        tl.store(o_ptr + (rows[:, None] * H + h) * V + vs[None, :], (out * SCALE).to(o_ptr.dtype.element_ty),
                 mask=v_mask)
        state = carry * state + tl.dot(tl.trans(k_out), v)
    tl.store(ht_ptr + state_off, state, mask=state_mask)


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
