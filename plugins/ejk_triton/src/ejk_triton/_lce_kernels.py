# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of the fused linear cross-entropy: the logits tile never leaves the chip.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).

Both kernels compute a ``[BLOCK_T, BLOCK_V]`` tile of logits ``x @ w`` in float32 registers
(``tl.dot`` over ``BLOCK_H`` steps of the hidden dim) and use it at once:

- ``forward_kernel``: program ``(t, s)`` walks the vocabulary columns of split ``s`` for its tokens
  and folds each tile into an online log-sum-exp (running max and sum), the label's logit and the
  logits' sum; the splits' partial statistics ``[SPLITS, T]`` are merged outside (a few vectors).
- ``grad_logits_kernel``: program ``(t, v)`` of one vocabulary chunk recomputes its tile and turns
  it into the logits' cotangent ``d_lse · softmax + d_z_label · onehot(label) + d_z_sum`` (times
  the soft cap's derivative), stored in the operands' dtype as the chunk's ``dz [T, CHUNK]``; the
  two gradient products of the chunk (``dz @ w_chunkᵀ``, ``xᵀ @ dz``) are left to the GEMM library.

Soft cap: ``CAP > 0`` means ``z = CAP · tanh(u / CAP)``. Offsets are int32 (the gate bounds sizes).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tanh(u):
    """``tanh`` from ``exp`` (no overflow: the exponent is never positive)."""
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0, -t, t)


@triton.jit
def _logits(x_ptr, w_ptr, rows, cols, rows_ok, cols_ok, H: tl.constexpr, V: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, CAP: tl.constexpr,
            DOT_PREC: tl.constexpr):
    """The soft-capped float32 logits of tokens ``rows`` against columns ``cols``."""
    acc = tl.zeros((BLOCK_T, BLOCK_V), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hs_ok = hs < H
        xt = tl.load(x_ptr + rows[:, None] * H + hs[None, :], mask=rows_ok[:, None] & hs_ok[None, :], other=0.0)
        wt = tl.load(w_ptr + hs[:, None] * V + cols[None, :], mask=hs_ok[:, None] & cols_ok[None, :], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=DOT_PREC)
    if CAP > 0:
        acc = CAP * _tanh(acc / CAP)
    return acc


@triton.jit
def forward_kernel(x_ptr, w_ptr, labels_ptr, top_ptr, total_ptr, z_label_ptr, z_sum_ptr,
                   T: tl.constexpr, H: tl.constexpr, V: tl.constexpr, SPLIT_V: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, CAP: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    pid_t = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rows_ok = rows < T
    label = tl.load(labels_ptr + rows, mask=rows_ok, other=-1)
    top = tl.full((BLOCK_T,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_T,), dtype=tl.float32)
    z_label = tl.zeros((BLOCK_T,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_T,), dtype=tl.float32)
    first = split * SPLIT_V
    last = tl.minimum(first + SPLIT_V, V)
    for v0 in range(first, last, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        cols_ok = cols < last
        z = _logits(x_ptr, w_ptr, rows, cols, rows_ok, cols_ok, H, V, BLOCK_T, BLOCK_V, BLOCK_H, CAP, DOT_PREC)
        masked = tl.where(cols_ok[None, :], z, float("-inf"))
        new_top = tl.maximum(top, tl.max(masked, axis=1))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(masked - new_top[:, None]), axis=1)
        top = new_top
        z_label += tl.sum(tl.where(cols_ok[None, :] & (cols[None, :] == label[:, None]), z, 0.0), axis=1)
        z_sum += tl.sum(tl.where(cols_ok[None, :], z, 0.0), axis=1)
    out = split * T + rows
    tl.store(top_ptr + out, top, mask=rows_ok)
    tl.store(total_ptr + out, total, mask=rows_ok)
    tl.store(z_label_ptr + out, z_label, mask=rows_ok)
    tl.store(z_sum_ptr + out, z_sum, mask=rows_ok)


@triton.jit
def grad_logits_kernel(x_ptr, w_ptr, labels_ptr, lse_ptr, d_lse_ptr, d_label_ptr, d_sum_ptr, cols_ptr, dz_ptr,
                       T: tl.constexpr, H: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, CAP: tl.constexpr,
                       DOT_PREC: tl.constexpr):
    """``dz [T, CHUNK]`` of the columns ``first .. first + CHUNK`` (``cols_ptr`` holds ``first`` and the
    first column no earlier chunk covered: columns before it get 0)."""
    pid_t = tl.program_id(0)
    pid_v = tl.program_id(1)
    first = tl.load(cols_ptr)
    fresh_from = tl.load(cols_ptr + 1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    local = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = first + local
    rows_ok = rows < T
    cols_ok = (local < CHUNK) & (cols < V)
    z = _logits(x_ptr, w_ptr, rows, cols, rows_ok, cols_ok, H, V, BLOCK_T, BLOCK_V, BLOCK_H, CAP, DOT_PREC)
    label = tl.load(labels_ptr + rows, mask=rows_ok, other=-1)
    lse = tl.load(lse_ptr + rows, mask=rows_ok, other=0.0)
    d_lse = tl.load(d_lse_ptr + rows, mask=rows_ok, other=0.0)
    d_label = tl.load(d_label_ptr + rows, mask=rows_ok, other=0.0)
    d_sum = tl.load(d_sum_ptr + rows, mask=rows_ok, other=0.0)
    dz = d_lse[:, None] * tl.exp(z - lse[:, None]) + d_sum[:, None]
    dz += tl.where(cols[None, :] == label[:, None], d_label[:, None], 0.0)
    if CAP > 0:
        dz = dz * (1.0 - (z / CAP) * (z / CAP))
    dz = tl.where(rows_ok[:, None] & (cols_ok & (cols >= fresh_from))[None, :], dz, 0.0)
    tl.store(dz_ptr + rows[:, None] * CHUNK + local[None, :], dz.to(dz_ptr.dtype.element_ty),
             mask=rows_ok[:, None] & (local < CHUNK)[None, :])
