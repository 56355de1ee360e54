# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernel of the batched matmul: ``c[z] = sum_r a[z, r] @ b[z, r]``.

Imported only when a kernel is launched (this module imports triton; see ``_env.import_triton``).

Operands are addressed through ``constexpr`` element strides, so a transposed operand
(``bᵀ`` in ``d a = d c @ bᵀ``), a broadcast batch (stride 0) or a batch to reduce over (the
``RED`` axis, summed inside the kernel: ``d b`` of a batched ``a`` with a 2-D ``b``) needs no
copy. The output ``c`` is contiguous ``[BATCH, M, N]``. Offsets are int32 (the capability
gate bounds every operand's size).

Tiles ``[BLOCK_M, BLOCK_N]`` of every batch are numbered in groups of ``GROUP_M`` row tiles
(consecutive tiles share the rows of ``a`` and sweep the columns of ``b`` a group at a time,
for L2 reuse). With ``PROGRAMS == TILES`` one program computes one tile; with fewer
(persistent, about one per SM) program ``p`` computes tiles ``p, p + PROGRAMS, …``, the tile
loop and the contraction loop flattened into one software pipeline, so the next tile's loads
are in flight during this one's epilogue. Loads are masked only along the dims
their block does not divide (``load_tile``). Products accumulate in float32 (``tl.dot`` with
``DOT_PREC``: ``ieee``, ``tf32x3`` or ``tf32`` for float32 operands) and are rounded once to
the output's dtype.

Split-K (``SPLIT_K > 1``, one program per tile): program ``(tile, s)`` covers the contraction
range ``[s * S, (s + 1) * S)``, ``S`` the whole ``BLOCK_K`` steps of ``cdiv(K, SPLIT_K)`` (the
last ranges short or empty), and stores its float32 partial tile (zeros for an empty range)
as ``c[s]`` of a float32 ``[SPLIT_K, BATCH, M, N]``; the caller adds the partials.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(ptrs, rows_ok, cols_ok, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """``tl.load`` of a 2-D tile with only the edge masks needed (``rows_ok`` ``[R, 1]``, ``cols_ok`` ``[1, C]``).

    Masks (not clamped indices) keep the loads vectorised and pipelined: a mask constant along
    the contiguous axis costs nothing there, a clamped index loses the contiguity.
    """
    if CHECK_ROWS:
        if CHECK_COLS:  # noqa: SIM108 (static branches of a Triton kernel)
            x = tl.load(ptrs, mask=rows_ok & cols_ok, other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok, other=0.0)
    else:
        if CHECK_COLS:  # noqa: SIM108 (static branches of a Triton kernel)
            x = tl.load(ptrs, mask=cols_ok, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _matmul_tile(a_ptr, b_ptr, c_ptr, tile,
                 M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, RED: tl.constexpr,
                 SA_Z: tl.constexpr, SA_R: tl.constexpr, SA_M: tl.constexpr, SA_K: tl.constexpr,
                 SB_Z: tl.constexpr, SB_R: tl.constexpr, SB_K: tl.constexpr, SB_N: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 DOT_PREC: tl.constexpr, SPLIT_K: tl.constexpr):
    """Computes and stores output tile ``tile`` (numbered over the batch, then in groups of ``GROUP_M`` rows);
    with ``SPLIT_K > 1``, split ``tl.program_id(1)``'s partial of it into ``c_ptr`` (that split's ``c``)."""
    tiles_m: tl.constexpr = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    if SPLIT_K == 1:
        k_first = 0
        k_steps: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    else:  # this split's steps: at most split_steps, none past K
        split_steps: tl.constexpr = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K
        k_first = tl.program_id(1) * (split_steps * BLOCK_K)
        k_steps = tl.minimum((tl.maximum(K - k_first, 0) + BLOCK_K - 1) // BLOCK_K, split_steps)
    z = tile // (tiles_m * tiles_n)
    tile = tile % (tiles_m * tiles_n)
    # Grouped ordering: GROUP_M row tiles, then the next column tile.
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    tm = first_m + (tile % width) % rows_in_group
    tn = (tile % width) // rows_in_group

    offs_m = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[None, :] < N
    a_ptrs = a_ptr + z * SA_Z + offs_m[:, None] * SA_M + offs_k[None, :] * SA_K
    b_ptrs = b_ptr + z * SB_Z + offs_k[:, None] * SB_K + offs_n[None, :] * SB_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, RED * k_steps):
        if RED == 1:
            r = 0
            kk = k_first + step * BLOCK_K
        else:
            r = step // k_steps
            kk = k_first + (step % k_steps) * BLOCK_K
        a = load_tile(a_ptrs + r * SA_R + kk * SA_K, m_ok, offs_k[None, :] < K - kk, M % BLOCK_M != 0,
                      K % BLOCK_K != 0)
        b = load_tile(b_ptrs + r * SB_R + kk * SB_K, offs_k[:, None] < K - kk, n_ok, K % BLOCK_K != 0,
                      N % BLOCK_N != 0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)

    c_ptrs = c_ptr + z * (M * N) + offs_m[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok & n_ok)


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, RED: tl.constexpr,
    SA_Z: tl.constexpr, SA_R: tl.constexpr, SA_M: tl.constexpr, SA_K: tl.constexpr,
    SB_Z: tl.constexpr, SB_R: tl.constexpr, SB_K: tl.constexpr, SB_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PREC: tl.constexpr, TILES: tl.constexpr, PROGRAMS: tl.constexpr, SPLIT_K: tl.constexpr,
):
    if SPLIT_K > 1:  # one program per tile and split: c_ptr to this split's [BATCH, M, N]
        batch: tl.constexpr = TILES // (((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N))
        c_ptr += tl.program_id(1).to(tl.int64) * (batch * M * N)
    if PROGRAMS == TILES:  # one program per tile
        _matmul_tile(a_ptr, b_ptr, c_ptr, tl.program_id(0), M, N, K, RED, SA_Z, SA_R, SA_M, SA_K, SB_Z, SB_R, SB_K,
                     SB_N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, DOT_PREC, SPLIT_K)
    else:  # persistent: the tile loop and the contraction loop flattened into one software pipeline
        for tile in tl.range(tl.program_id(0), TILES, PROGRAMS, flatten=True):
            _matmul_tile(a_ptr, b_ptr, c_ptr, tile, M, N, K, RED, SA_Z, SA_R, SA_M, SA_K, SB_Z, SB_R, SB_K,
                         SB_N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, DOT_PREC, SPLIT_K)
