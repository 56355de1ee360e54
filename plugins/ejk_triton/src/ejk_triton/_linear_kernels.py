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
def linear_recurrence_fwd(q_ptr, k_ptr, v_ptr, g_ptr, h0_ptr, cu_ptr, o_ptr, ht_ptr,
                          T: tl.constexpr, H: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr,
                          SCALE: tl.constexpr, SCALAR_GATE: tl.constexpr, HAS_H0: tl.constexpr,
                          VARLEN: tl.constexpr):
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
    for start in range(bos, eos, BT):
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
