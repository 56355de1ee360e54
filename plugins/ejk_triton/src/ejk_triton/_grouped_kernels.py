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
  …`` (an empty group has no items), then the rows past the last group are written as zero
  tiles. A row tile never straddles two groups. Up to ``G_FLAT`` groups the work list (item
  counts and their running sums) is held in registers, so the item loop and the contraction
  loop flatten into one software pipeline: the next item's loads start during this one's
  epilogue. Beyond that (``G_FLAT = 0``) the programs walk the groups one by one.
- :func:`grouped_outer_kernel`: ``out[i] = lhs_iᵀ @ dy_i`` for every group (the ``rhs``
  gradient): one program per (group, row tile of ``out[i]``, column tile), reducing over the
  group's rows; an empty group's tiles are zeros.

Products accumulate in float32 (``tl.dot`` with ``DOT_PREC``) and are rounded once on store.
With ``GATED`` (``grouped_matmul(..., activation="swiglu")``) the forward's output has ``N_OUT = N / 2``
columns: each output tile multiplies the same ``lhs`` tile by the gate columns and the up columns of
``rhs`` (two accumulators) and stores ``silu(gate) · up``; the ``[m, N]`` product is never written.
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
def _gated_tile_product(lhs_ptr, rhs_ptr, row0, row_end, group, tn,
                        K: tl.constexpr, N_OUT: tl.constexpr, S_LM: tl.constexpr, S_LK: tl.constexpr,
                        S_RG: tl.constexpr, S_RK: tl.constexpr, S_RN: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr):
    """``silu(gate) · up`` in float32 for output column tile ``tn``: ``gate`` and ``up`` the products of one
    ``lhs`` tile with ``rhs[group]``'s columns ``tile tn`` and ``N_OUT + tile tn`` (one ``lhs`` load for both)."""
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_ok = rows[:, None] < row_end
    cols_ok = cols[None, :] < N_OUT
    a_ptrs = lhs_ptr + rows[:, None] * S_LM + offs_k[None, :] * S_LK
    g_ptrs = rhs_ptr + group * S_RG + offs_k[:, None] * S_RK + cols[None, :] * S_RN
    u_ptrs = g_ptrs + N_OUT * S_RN
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, K, BLOCK_K):
        a = load_tile(a_ptrs, rows_ok, offs_k[None, :] < K - kk, True, K % BLOCK_K != 0)
        k_ok = offs_k[:, None] < K - kk
        g = load_tile(g_ptrs, k_ok, cols_ok, K % BLOCK_K != 0, N_OUT % BLOCK_N != 0)
        u = load_tile(u_ptrs, k_ok, cols_ok, K % BLOCK_K != 0, N_OUT % BLOCK_N != 0)
        gate = tl.dot(a, g, gate, input_precision=DOT_PREC)
        up = tl.dot(a, u, up, input_precision=DOT_PREC)
        a_ptrs += BLOCK_K * S_LK
        g_ptrs += BLOCK_K * S_RK
        u_ptrs += BLOCK_K * S_RK
    return gate * tl.sigmoid(gate) * up


@triton.jit
def _store_tile(lhs_ptr, rhs_ptr, out_ptr, row0, row_end, group, tn,
                K: tl.constexpr, N: tl.constexpr, N_OUT: tl.constexpr, S_LM: tl.constexpr, S_LK: tl.constexpr,
                S_RG: tl.constexpr, S_RK: tl.constexpr, S_RN: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, GATED: tl.constexpr):
    """Computes and stores the output tile at rows ``row0 ..`` (below ``row_end``), column tile ``tn``."""
    if GATED:
        acc = _gated_tile_product(lhs_ptr, rhs_ptr, row0, row_end, group, tn, K, N_OUT, S_LM, S_LK, S_RG, S_RK,
                                  S_RN, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PREC)
    else:
        acc = _tile_product(lhs_ptr, rhs_ptr, row0, row_end, group, tn, K, N, S_LM, S_LK, S_RG, S_RK, S_RN,
                            BLOCK_M, BLOCK_N, BLOCK_K, DOT_PREC)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < row_end) & (offs_n[None, :] < N_OUT)
    tl.store(out_ptr + offs_m[:, None] * N_OUT + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _zero_tail(out_ptr, offsets_ptr, item, before, M: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
               PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Zeros the rows past the last group: tiles numbered from ``before``, this program's from ``item``."""
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
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
def grouped_matmul_kernel(
    lhs_ptr, rhs_ptr, offsets_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, G: tl.constexpr,
    S_LM: tl.constexpr, S_LK: tl.constexpr, S_RG: tl.constexpr, S_RK: tl.constexpr, S_RN: tl.constexpr,
    PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, G_FLAT: tl.constexpr, GATED: tl.constexpr,
):
    N_OUT: tl.constexpr = N // 2 if GATED else N  # the output's columns
    tiles_n: tl.constexpr = (N_OUT + BLOCK_N - 1) // BLOCK_N
    item = tl.program_id(0)
    if G_FLAT > 0:
        # The work list held in registers (``G_FLAT`` >= G, a power of two): each group's item
        # count and their running sum, so an item's group is a comparison and a sum, and the
        # item loop and the contraction loop flatten into one software pipeline (the next
        # item's loads start during this one's epilogue).
        index = tl.arange(0, G_FLAT)
        starts = tl.load(offsets_ptr + index, mask=index < G, other=0)
        ends = tl.load(offsets_ptr + index + 1, mask=index < G, other=0)
        counts = ((ends - starts + BLOCK_M - 1) // BLOCK_M) * tiles_n
        through = tl.cumsum(counts, 0)  # items of groups 0..i
        total = tl.sum(counts, 0)
        for work in tl.range(item, total, PROGRAMS, flatten=True):
            group = tl.sum((through <= work).to(tl.int32), 0)
            here = index == group
            local = work - tl.sum(tl.where(here, through - counts, 0), 0)
            start = tl.sum(tl.where(here, starts, 0), 0)
            end = tl.sum(tl.where(here, ends, 0), 0)
            _store_tile(lhs_ptr, rhs_ptr, out_ptr, start + (local // tiles_n) * BLOCK_M, end, group,
                        local % tiles_n, K, N, N_OUT, S_LM, S_LK, S_RG, S_RK, S_RN, BLOCK_M, BLOCK_N, BLOCK_K,
                        DOT_PREC, GATED)
        _zero_tail(out_ptr, offsets_ptr, item + tl.cdiv(total - item, PROGRAMS) * PROGRAMS, total, M, N_OUT, G,
                   PROGRAMS, BLOCK_M, BLOCK_N)
    else:
        # Many groups: walk them, each program taking every PROGRAMS-th item.
        before = 0  # work items of the groups already walked
        for group in range(0, G):
            start = tl.load(offsets_ptr + group)
            end = tl.load(offsets_ptr + group + 1)
            items = ((end - start + BLOCK_M - 1) // BLOCK_M) * tiles_n
            while item < before + items:
                local = item - before
                _store_tile(lhs_ptr, rhs_ptr, out_ptr, start + (local // tiles_n) * BLOCK_M, end, group,
                            local % tiles_n, K, N, N_OUT, S_LM, S_LK, S_RG, S_RK, S_RN, BLOCK_M, BLOCK_N, BLOCK_K,
                            DOT_PREC, GATED)
                item += PROGRAMS
            before += items
        _zero_tail(out_ptr, offsets_ptr, item, before, M, N_OUT, G, PROGRAMS, BLOCK_M, BLOCK_N)


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
