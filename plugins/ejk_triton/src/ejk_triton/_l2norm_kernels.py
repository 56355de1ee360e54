# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of the per-row l2 normalisation ``y = x / sqrt(Σ x² + EPS)`` (float32 sums, ``y``
in ``x``'s dtype): what ``gated_delta_rule``'s ``use_qk_l2norm`` applies to ``q`` and ``k``.

Rows are ``x`` flattened to ``[ROWS, D]`` (``D ≤ BD``, one row block in registers); program ``p`` takes rows
``p·BR ..`` (int64 offsets). The backward recomputes ``r = 1 / sqrt(Σ x² + EPS)`` from ``x`` (it reads ``x``
anyway) and writes ``dx = r · (dy − y (y · dy))``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["l2norm_bwd_kernel", "l2norm_fwd_kernel"]


@triton.jit
def _rows(x_ptr, ROWS: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, EPS: tl.constexpr):
    """Offsets and mask of this program's ``[BR, BD]`` block, its rows as float32 and their ``r``."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    mask = (rows < ROWS)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return offs, mask, x, tl.rsqrt(tl.sum(x * x, axis=1) + EPS)


@triton.jit
def l2norm_fwd_kernel(x_ptr, y_ptr, ROWS: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
                      EPS: tl.constexpr):
    offs, mask, x, r = _rows(x_ptr, ROWS, D, BR, BD, EPS)
    tl.store(y_ptr + offs, (x * r[:, None]).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def l2norm_bwd_kernel(x_ptr, dy_ptr, dx_ptr, ROWS: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                      BD: tl.constexpr, EPS: tl.constexpr):
    offs, mask, x, r = _rows(x_ptr, ROWS, D, BR, BD, EPS)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * r[:, None]
    dx = r[:, None] * (dy - y * tl.sum(y * dy, axis=1)[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
