# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of RMSNorm: one read of each operand, float32 statistics in registers.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).

Rows are ``x`` flattened to ``[ROWS, D]``; a program takes ``BLOCK_R`` rows at a time and
``BLOCK_D`` columns per step. When ``BLOCK_D >= D`` (the usual case) a row block is loaded once
and kept in registers; wider rows take two passes over their ``BLOCK_D``-column chunks (the
statistics, then the outputs; the second read of a row mostly hits L2).

- ``forward_kernel``: program ``p`` normalises rows ``p·BLOCK_R ..``; writes ``y`` in ``y``'s dtype
  and the per-row float32 ``inv_rms = 1 / sqrt(mean(x²) + EPS)``. ``forward_residual_kernel`` first
  adds the residual ``r`` (``h = x + r`` rounded to ``x``'s dtype, also written) and normalises ``h``.
- ``backward_kernel``: a persistent grid of ``PROGRAMS`` programs, program ``p`` taking row blocks
  ``p, p + PROGRAMS, ..``. With ``x̂ = x · inv_rms`` and ``g = dy · scale``::

      dx = inv_rms · (g − x̂ · mean(g · x̂)),   dscale = Σ_rows dy · x̂

  Each program sums its rows' ``dy · x̂`` in float32 registers and writes that partial sum as row
  ``p`` of ``[PROGRAMS, D]`` (summed outside); in the two-pass form it adds each chunk into its own
  row of that buffer (zeroed by the launch), so no two programs write the same address.
  ``backward_residual_kernel`` also adds ``h``'s cotangent ``dh`` to ``dx`` (the gradient of both
  ``x`` and the residual).

Row offsets are int64 (any number of elements); ``D`` and the grid are compile-time constants.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_block(x_ptr, r_ptr, h_ptr, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """``x`` of one block as float32; with a residual, ``h = x + r`` rounded to ``x``'s dtype (stored to ``h``)."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + offs, x, mask=mask)
    return x.to(tl.float32)


@triton.jit
def _forward(x_ptr, r_ptr, scale_ptr, y_ptr, inv_ptr, h_ptr, ROWS: tl.constexpr, D: tl.constexpr,
             EPS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_ok = rows < ROWS
    base = rows.to(tl.int64)[:, None] * D
    if BLOCK_D >= D:
        cols = tl.arange(0, BLOCK_D)
        cols_ok = cols < D
        mask = rows_ok[:, None] & cols_ok[None, :]
        x = _row_block(x_ptr, r_ptr, h_ptr, base + cols[None, :], mask, HAS_RESIDUAL)
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + EPS)
        s = tl.load(scale_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)
        y = x * inv[:, None] * s[None, :]
        tl.store(y_ptr + base + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = rows_ok[:, None] & (cols < D)[None, :]
            x = _row_block(x_ptr, r_ptr, h_ptr, base + cols[None, :], mask, HAS_RESIDUAL)
            total += tl.sum(x * x, axis=1)
        inv = tl.rsqrt(total / D + EPS)
        # The second pass reads h back (this program wrote it, the barrier makes it visible to every thread).
        src = x_ptr
        if HAS_RESIDUAL:
            tl.debug_barrier()
            src = h_ptr
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            cols_ok = cols < D
            mask = rows_ok[:, None] & cols_ok[None, :]
            x = tl.load(src + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = tl.load(scale_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)
            y = x * inv[:, None] * s[None, :]
            tl.store(y_ptr + base + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(inv_ptr + rows, inv, mask=rows_ok)


@triton.jit
def forward_kernel(x_ptr, scale_ptr, y_ptr, inv_ptr, ROWS: tl.constexpr, D: tl.constexpr, EPS: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    _forward(x_ptr, x_ptr, scale_ptr, y_ptr, inv_ptr, y_ptr, ROWS, D, EPS, BLOCK_R, BLOCK_D, False)


@triton.jit
def forward_residual_kernel(x_ptr, r_ptr, scale_ptr, y_ptr, inv_ptr, h_ptr, ROWS: tl.constexpr, D: tl.constexpr,
                            EPS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    _forward(x_ptr, r_ptr, scale_ptr, y_ptr, inv_ptr, h_ptr, ROWS, D, EPS, BLOCK_R, BLOCK_D, True)


@triton.jit
def _load_rows(x_ptr, dy_ptr, dh_ptr, inv_ptr, blk, cols, cols_ok, ROWS: tl.constexpr, D: tl.constexpr,
               BLOCK_R: tl.constexpr, HAS_DH: tl.constexpr):
    """``x``, ``dy`` and ``dh`` (their dtypes; ``dh`` is ``dy`` without one) and ``inv_rms`` of row block
    ``blk``; zeros past the last row."""
    rows = blk * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_ok = rows < ROWS
    mask = rows_ok[:, None] & cols_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    dh = dy
    if HAS_DH:
        dh = tl.load(dh_ptr + offs, mask=mask, other=0.0)
    return x, dy, dh, tl.load(inv_ptr + rows, mask=rows_ok, other=0.0)


@triton.jit
def _backward(x_ptr, scale_ptr, inv_ptr, dy_ptr, dh_ptr, dx_ptr, partial_ptr, ROWS: tl.constexpr, D: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PROGRAMS: tl.constexpr, HAS_DH: tl.constexpr):
    pid = tl.program_id(0)
    blocks = tl.cdiv(ROWS, BLOCK_R)
    if BLOCK_D >= D:
        cols = tl.arange(0, BLOCK_D)
        cols_ok = cols < D
        s = tl.load(scale_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)
        acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
        # Software pipelining by hand: the loads of the next row block are issued before this one's math
        # and stores (a block past the end loads nothing), so they are in flight meanwhile.
        x_next, dy_next, dh_next, inv_next = _load_rows(x_ptr, dy_ptr, dh_ptr, inv_ptr, pid, cols, cols_ok, ROWS,
                                                        D, BLOCK_R, HAS_DH)
        for blk in range(pid, blocks, PROGRAMS):
            x, dy, dh, inv = x_next, dy_next, dh_next, inv_next
            x_next, dy_next, dh_next, inv_next = _load_rows(x_ptr, dy_ptr, dh_ptr, inv_ptr, blk + PROGRAMS, cols,
                                                            cols_ok, ROWS, D, BLOCK_R, HAS_DH)
            rows = blk * BLOCK_R + tl.arange(0, BLOCK_R)
            mask = (rows < ROWS)[:, None] & cols_ok[None, :]
            x = x.to(tl.float32)
            dy = dy.to(tl.float32)
            xhat = x * inv[:, None]
            g = dy * s[None, :]
            c = tl.sum(g * xhat, axis=1) / D
            dx = inv[:, None] * (g - xhat * c[:, None])
            if HAS_DH:
                dx += dh.to(tl.float32)
            tl.store(dx_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                     mask=mask)
            acc += dy * xhat
        tl.store(partial_ptr + pid * D + cols, tl.sum(acc, axis=0), mask=cols_ok)
    else:
        for blk in range(pid, blocks, PROGRAMS):
            rows = blk * BLOCK_R + tl.arange(0, BLOCK_R)
            rows_ok = rows < ROWS
            base = rows.to(tl.int64)[:, None] * D
            inv = tl.load(inv_ptr + rows, mask=rows_ok, other=0.0)
            total = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                cols_ok = cols < D
                mask = rows_ok[:, None] & cols_ok[None, :]
                x = tl.load(x_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                s = tl.load(scale_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)
                total += tl.sum(dy * s[None, :] * x, axis=1)
            c = total * inv / D
            for d0 in range(0, D, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                cols_ok = cols < D
                mask = rows_ok[:, None] & cols_ok[None, :]
                x = tl.load(x_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                s = tl.load(scale_ptr + cols, mask=cols_ok, other=0.0).to(tl.float32)
                xhat = x * inv[:, None]
                dx = inv[:, None] * (dy * s[None, :] - xhat * c[:, None])
                if HAS_DH:
                    dx += tl.load(dh_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + base + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
                # This program's own row of the buffer: a read-modify-write, made visible across the
                # threads of the program (the sum's layout need not match the load's) by the barrier.
                part = partial_ptr + pid * D + cols
                tl.store(part, tl.load(part, mask=cols_ok, other=0.0) + tl.sum(dy * xhat, axis=0), mask=cols_ok)
                tl.debug_barrier()


@triton.jit
def backward_kernel(x_ptr, scale_ptr, inv_ptr, dy_ptr, dx_ptr, partial_ptr, ROWS: tl.constexpr, D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PROGRAMS: tl.constexpr):
    _backward(x_ptr, scale_ptr, inv_ptr, dy_ptr, dy_ptr, dx_ptr, partial_ptr, ROWS, D, BLOCK_R, BLOCK_D, PROGRAMS,
              False)


@triton.jit
def backward_residual_kernel(x_ptr, scale_ptr, inv_ptr, dy_ptr, dh_ptr, dx_ptr, partial_ptr, ROWS: tl.constexpr,
                             D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PROGRAMS: tl.constexpr):
    _backward(x_ptr, scale_ptr, inv_ptr, dy_ptr, dh_ptr, dx_ptr, partial_ptr, ROWS, D, BLOCK_R, BLOCK_D, PROGRAMS,
              True)
