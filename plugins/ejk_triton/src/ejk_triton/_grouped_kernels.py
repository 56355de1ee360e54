# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernels of the grouped matmul (mixture of experts), forward and backward.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).

Groups are consecutive row ranges: ``offsets`` ``[G + 1]`` int32 holds their boundaries
(group ``i`` owns rows ``offsets[i]:offsets[i + 1]``; rows from ``offsets[G]`` to ``M`` belong
to no group), computed on the device from ``group_sizes`` by the caller. Operands are addressed
through ``constexpr`` element strides (a transposed ``rhs`` needs no copy); offsets are int32.

- :func:`grouped_matmul_kernel`: ``out[r] = lhs[r] @ rhs[group(r)]`` (zeros for rows in no
  group). Persistent: ``PROGRAMS`` programs (about one per SM) walk the work list of
  (group, row tile, column tile) items in order, program ``p`` taking items ``p, p + PROGRAMS,
  …``; the list is built on the fly from ``offsets`` (an empty group has no items), then the
  rows past the last group are written as zero tiles. A row tile never straddles two groups.
- :func:`grouped_outer_kernel`: ``out[i] = lhs_iᵀ @ dy_i`` for every group (the ``rhs``
  gradient): one program per (group, row tile of ``out[i]``, column tile), reducing over the
  group's rows; an empty group's tiles are zeros.

Products accumulate in float32 (``tl.dot`` with ``DOT_PREC``) and are rounded once on store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ejk_triton._matmul_kernels import load_tile


@triton.jit
def _tile_product(lhs_ptr, rhs_ptr, row0, row_end, group, tn,
                  K: tl.constexpr, N: tl.constexpr, S_LM: tl.constexpr, S_LK: tl.constexpr, S_RG: tl.constexpr,
                  S_RK: tl.constexpr, S_RN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr):
    """``lhs[row0 : row0 + BLOCK_M] @ rhs[group][:, tile tn]`` in float32 (rows from ``row_end`` on read as 0)."""
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_ok = rows[:, None] < row_end
    cols_ok = cols[None, :] < N
    a_ptrs = lhs_ptr + rows[:, None] * S_LM + offs_k[None, :] * S_LK
    b_ptrs = rhs_ptr + group * S_RG + offs_k[:, None] * S_RK + cols[None, :] * S_RN
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, K, BLOCK_K):
        a = load_tile(a_ptrs, rows_ok, offs_k[None, :] < K - kk, True, K % BLOCK_K != 0)
        b = load_tile(b_ptrs, offs_k[:, None] < K - kk, cols_ok, K % BLOCK_K != 0, N % BLOCK_N != 0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K * S_LK
        b_ptrs += BLOCK_K * S_RK
    return acc


@triton.jit
def grouped_matmul_kernel(
    lhs_ptr, rhs_ptr, offsets_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    S_LM: tl.constexpr, S_LK: tl.constexpr, S_RG: tl.constexpr, S_RK: tl.constexpr, S_RN: tl.constexpr,
    PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    item = tl.program_id(0)
    before = 0  # work items of the groups already walked
    for group in range(0, G):
        start = tl.load(offsets_ptr + group)
        end = tl.load(offsets_ptr + group + 1)
        items = ((end - start + BLOCK_M - 1) // BLOCK_M) * tiles_n
        while item < before + items:
            local = item - before
            row0 = start + (local // tiles_n) * BLOCK_M
            tn = local % tiles_n
            acc = _tile_product(lhs_ptr, rhs_ptr, row0, end, group, tn, K, N, S_LM, S_LK, S_RG, S_RK, S_RN,
                                BLOCK_M, BLOCK_N, BLOCK_K, DOT_PREC)
            offs_m = row0 + tl.arange(0, BLOCK_M)
            offs_n = tn * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < end) & (offs_n[None, :] < N)
            tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
            item += PROGRAMS
        before += items
    # Rows past the last group are zeros.
    start = tl.load(offsets_ptr + G)
    items = ((M - start + BLOCK_M - 1) // BLOCK_M) * tiles_n
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
    while item < before + items:
        local = item - before
        offs_m = start + (local // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = (local % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], zeros, mask=mask)
        item += PROGRAMS


@triton.jit
def grouped_outer_kernel(
    x_ptr, dy_ptr, offsets_ptr, out_ptr,
    K: tl.constexpr, N: tl.constexpr, S_XM: tl.constexpr, S_XK: tl.constexpr, S_YM: tl.constexpr,
    S_YN: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """``out[g] = x[rows of g]ᵀ @ dy[rows of g]``: ``out`` is ``[G, K, N]``, tiles ``BLOCK_K x BLOCK_N``,
    ``BLOCK_M`` rows per reduction step."""
    tiles_k: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    pid = tl.program_id(0)
    group = pid // (tiles_k * tiles_n)
    tile = pid % (tiles_k * tiles_n)
    offs_k = (tile // tiles_n) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok = offs_k[:, None] < K
    n_ok = offs_n[None, :] < N
    start = tl.load(offsets_ptr + group)
    end = tl.load(offsets_ptr + group + 1)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for row0 in range(start, end, BLOCK_M):
        rows = row0 + offs_m
        inside = rows < end  # rows of other groups must not contribute (not even 0 * inf)
        xt = load_tile(x_ptr + rows[None, :] * S_XM + offs_k[:, None] * S_XK, k_ok, inside[None, :],
                       K % BLOCK_K != 0, True)
        dy = load_tile(dy_ptr + rows[:, None] * S_YM + offs_n[None, :] * S_YN, inside[:, None], n_ok, True,
                       N % BLOCK_N != 0)
        acc = tl.dot(xt, dy, acc, input_precision=DOT_PREC)
    out_ptrs = out_ptr + group * (K * N) + offs_k[:, None] * N + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=k_ok & n_ok)
