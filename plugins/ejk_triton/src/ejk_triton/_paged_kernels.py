# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernel of ragged paged attention (decode and chunked prefill, split-K).

Imported only when the kernel is launched (this module imports triton; see ``_env.import_triton``).

Layouts (contiguous): q ``[T, Hq, D]``, k_pages ``[P, page, Hkv, D]``, v_pages ``[P, page, Hkv, Dv]``,
kv_lens ``[S]``, page table ``[S, pages_per_seq]``, cu_q_lens ``[S+1]``, num_seqs ``[1]`` (int32).
Outputs: the attention ``[T, Hq, Dv]``; with several splits also, per split ``z``, the
unnormalised float32 partials ``acc [Z, T, Hq, Dv]``, running max ``m [Z, T, Hq]`` and sum
``l [Z, T, Hq]`` (base-2 logits), merged by the split that finishes last (or by the caller), and
an arrival counter per tile and kv head.

One program handles one *tile*: up to ``BLOCK_Q`` consecutive query tokens of one sequence, for
one kv head, over one split of the keys the tile can see. The ``GROUP`` q heads of the kv head
and the tile's tokens form the ``M`` dimension of ``tl.dot`` (row ``m`` is token ``m // GROUP``,
head ``m % GROUP``; padded to ``BLOCK_M >= 16``), so every page is read once per tile and kv head.
Tiles are numbered over the live sequences in order; the grid is sized from static shapes
and programs past the last tile return at once.

Keys are read through the page table: per step, the page id of each of the ``BLOCK_N`` keys
(``table[seq, key // page]``, clipped into ``[0, P)``) and then its row ``[D]``. Loops run only
over the tile's visible keys (causal end, sliding-window start); in prefill tiles, blocks every
row sees in full skip the position mask (decode tiles run one masked loop: one pipeline ramp).
Keys no row of the tile sees are never loaded (masked to 0), so NaN there cannot leak into
``0 · v``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ejk_triton._attention_kernels import _ceil_to, _floor_to, _load, _logits2

_NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))


@triton.jit
def _paged_inner(acc, l_i, m_i, q, pos, row_ok, k_base, v_base, table_row, key_lo, key_hi, kv_len, lo, hi,
                 SCALE: tl.constexpr, CAP: tl.constexpr, HAS_CAP: tl.constexpr, WINDOW: tl.constexpr,
                 WIN_L: tl.constexpr, NUM_PAGES: tl.constexpr, PAGE: tl.constexpr, PAGES_PER_SEQ: tl.constexpr,
                 HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                 DOT_PREC: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold keys ``[lo, hi)`` into the online softmax; ``MASKED`` blocks check positions per row."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    # Page ids are loaded one step ahead (table index clipped in range), so the loads of keys and
    # values depend on a loop-carried value only and pipeline like direct loads.
    ONE_PAGE: tl.constexpr = PAGE % BLOCK_N == 0  # a block lies in one page (loop starts are multiples of BLOCK_N)
    if ONE_PAGE:
        next_page = tl.load(table_row + tl.minimum(lo // PAGE, PAGES_PER_SEQ - 1))
    else:
        next_page = tl.load(table_row + tl.minimum((lo + offs_n) // PAGE, PAGES_PER_SEQ - 1))
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        in_tile = (keys >= key_lo) & (keys < key_hi)  # some row of the tile sees it (only masked blocks check)
        page = tl.minimum(tl.maximum(next_page, 0), NUM_PAGES - 1).to(tl.int64)
        if ONE_PAGE:
            next_page = tl.load(table_row + tl.minimum((start + BLOCK_N) // PAGE, PAGES_PER_SEQ - 1))
            rows = page * PAGE + start % PAGE + offs_n  # rows of [P * page, Hkv, D]
        else:
            next_page = tl.load(table_row + tl.minimum((keys + BLOCK_N) // PAGE, PAGES_PER_SEQ - 1))
            rows = page * PAGE + keys % PAGE
        k = _load(k_base + rows[:, None] * (HKV * D) + offs_d[None, :], in_tile[:, None], offs_d[None, :] < D,
                  MASKED, HEAD_DIM != D, 0.0)
        v = _load(v_base + rows[:, None] * (HKV * DV) + offs_dv[None, :], in_tile[:, None], offs_dv[None, :] < DV,
                  MASKED, HEAD_DIM_V != DV, 0.0)
        s, _t = _logits2(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), SCALE, CAP, HAS_CAP)
        if MASKED:
            ok = row_ok[:, None] & (keys[None, :] <= pos[:, None]) & (keys[None, :] < kv_len)
            if WINDOW:
                ok = ok & (keys[None, :] >= pos[:, None] - WIN_L)
            s = tl.where(ok, s, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _merge_splits(acc_part, max_part, sum_part, rows, row_ok, offs_dv, SPLIT_STRIDE: tl.constexpr,
                  DV: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Merge the splits' partials of ``rows`` (read through L2: other programs wrote them)."""
    m_all = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_all = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    mask = row_ok[:, None] & (offs_dv[None, :] < DV)
    for z in tl.static_range(NUM_SPLITS):  # unrolled: every split's loads in flight at once
        part = z * SPLIT_STRIDE + rows
        m_z = tl.load(max_part + part, mask=row_ok, other=_NEG_INF, cache_modifier=".cg")
        l_z = tl.load(sum_part + part, mask=row_ok, other=0.0, cache_modifier=".cg")
        a_z = tl.load(acc_part + part[:, None] * DV + offs_dv[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m_all, m_z)
        m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)
        old_w = tl.exp2(m_all - m_safe)
        new_w = tl.exp2(m_z - m_safe)  # NaN from a split that saw NaN propagates
        l_all = l_all * old_w + l_z * new_w
        acc = acc * old_w[:, None] + a_z * new_w[:, None]
        m_all = m_new
    return acc, l_all, m_all


@triton.jit
def _with_sink(acc, l_i, m_i, sink):
    """Add ``2^sink`` (base-2 sink logits per row) to the denominator of every row that saw a key."""
    seen = l_i != 0.0
    top = tl.where(seen, tl.maximum(m_i, sink), 0.0)
    alpha = tl.where(seen, tl.exp2(m_i - top), 1.0)
    return acc * alpha[:, None], tl.where(seen, alpha * l_i + tl.exp2(sink - top), l_i)


@triton.jit
def _store_out(out_ptrs, acc, l_i, mask):
    empty = l_i == 0.0  # no visible key; a NaN sum (NaN in q or a visible key) propagates
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def paged_attention_kernel(Q, K, V, KvLens, Table, CuQ, NumSeqs, Sinks, Out, AccPart, MaxPart, SumPart, Arrived,
                           SCALE: tl.constexpr, CAP: tl.constexpr, T: tl.constexpr, HQ: tl.constexpr,
                           GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr,
                           HEAD_DIM_V: tl.constexpr, NUM_PAGES: tl.constexpr, PAGE: tl.constexpr,
                           PAGES_PER_SEQ: tl.constexpr, SEQS: tl.constexpr, SEQS_POW2: tl.constexpr,
                           WINDOW: tl.constexpr, WIN_L: tl.constexpr, HAS_CAP: tl.constexpr,
                           DOT_PREC: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, MERGE: tl.constexpr,
                           ONE_LOOP: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Grid ``(max tiles, Hkv, NUM_SPLITS)``.

    With one split the program writes ``Out`` (the rows of its tile; the caller zeroes the rows of no
    live sequence, which no program writes). With several, each
    writes its partials ``AccPart``, ``MaxPart``, ``SumPart``; with ``MERGE`` it then counts itself in
    ``Arrived[tile, kv head]`` (zeroed beforehand; an acquire-release atomic after a block barrier),
    and the split that arrives last merges all of them into ``Out``. Without ``MERGE`` the caller
    merges. Unused outputs are placeholders. ``Sinks`` (with ``HAS_SINKS``): ``[Hq]`` float32 sink
    logits, added to each row's denominator where the output is normalised (not by the caller's merge).
    """
    HKV: tl.constexpr = HQ // GROUP
    pid = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)

    # -- which tile: the live sequences' tiles, in order ------------------------------------------
    live = tl.minimum(tl.maximum(tl.load(NumSeqs), 0), SEQS)
    s_idx = tl.arange(0, SEQS_POW2)
    s_ok = s_idx < SEQS
    starts = tl.minimum(tl.maximum(tl.load(CuQ + s_idx, mask=s_ok, other=0), 0), T)
    ends = tl.minimum(tl.maximum(tl.load(CuQ + s_idx + 1, mask=s_ok, other=0), 0), T)
    kv_lens = tl.load(KvLens + s_idx, mask=s_ok, other=0)  # with cu_q_lens: one round trip, not two
    q_lens = tl.where(s_idx < live, tl.maximum(ends - starts, 0), 0)
    tiles = (q_lens + BLOCK_Q - 1) // BLOCK_Q
    tile_ends = tl.cumsum(tiles, 0)
    if pid >= tl.sum(tiles, 0):
        return
    seq = tl.sum((tile_ends <= pid).to(tl.int32), 0)  # the first sequence whose tiles end past pid
    this = s_idx == seq
    first_tile = tl.sum(tl.where(this, tile_ends - tiles, 0), 0)
    seq_start = tl.sum(tl.where(this, starts, 0), 0)
    q_len = tl.sum(tl.where(this, q_lens, 0), 0)
    kv_len = tl.minimum(tl.maximum(tl.sum(tl.where(this, kv_lens, 0), 0), 0), PAGES_PER_SEQ * PAGE)

    # -- the tile's rows and the keys they see ----------------------------------------------------
    tok0 = seq_start + (pid - first_tile) * BLOCK_Q
    n_tok = tl.minimum(seq_start + q_len - tok0, BLOCK_Q)
    first_pos = kv_len - q_len + (tok0 - seq_start)  # position of the tile's first token
    last_pos = first_pos + n_tok - 1
    offs_m = tl.arange(0, BLOCK_M)
    row_tok = offs_m // GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (row_tok < n_tok)
    pos = first_pos + row_tok
    heads = hk * GROUP + offs_m % GROUP
    q_rows = (tok0 + row_tok).to(tl.int64) * HQ + heads  # row of [T * Hq, D]
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    key_hi = tl.minimum(tl.maximum(last_pos + 1, 0), kv_len)
    key_lo = tok0 * 0
    if WINDOW:
        key_lo = tl.maximum(first_pos - WIN_L, 0)
    key_lo = tl.minimum(key_lo, key_hi)
    block_lo = key_lo // BLOCK_N * BLOCK_N
    per_split = ((key_hi - block_lo + BLOCK_N - 1) // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS * BLOCK_N
    lo = tl.minimum(block_lo + split * per_split, key_hi)
    hi = tl.minimum(lo + per_split, key_hi)
    # Blocks every row sees in full: past the last row's window start, before the first row's position.
    mid_lo = block_lo
    if WINDOW:
        mid_lo = _ceil_to(last_pos - WIN_L, BLOCK_N)
    mid_hi = _floor_to(first_pos + 1, BLOCK_N)
    mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = tl.maximum(tl.minimum(mid_hi, hi), mid_lo)

    k_base = K + hk * D
    v_base = V + hk * DV
    table_row = Table + seq.to(tl.int64) * PAGES_PER_SEQ
    m_i = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    if ONE_LOOP:  # decode: one masked loop, one pipeline ramp (the masks cost nothing next to the loads)
        acc, l_i, m_i = _paged_inner(acc, l_i, m_i, q, pos, row_ok, k_base, v_base, table_row, key_lo, key_hi,
                                     kv_len, lo, hi, SCALE, CAP, HAS_CAP, WINDOW, WIN_L, NUM_PAGES, PAGE,
                                     PAGES_PER_SEQ, HKV, D, DV, HEAD_DIM, HEAD_DIM_V, DOT_PREC, True, BLOCK_N)
    else:
        acc, l_i, m_i = _paged_inner(acc, l_i, m_i, q, pos, row_ok, k_base, v_base, table_row, key_lo, key_hi,
                                     kv_len, lo, mid_lo, SCALE, CAP, HAS_CAP, WINDOW, WIN_L, NUM_PAGES, PAGE,
                                     PAGES_PER_SEQ, HKV, D, DV, HEAD_DIM, HEAD_DIM_V, DOT_PREC, True, BLOCK_N)
        acc, l_i, m_i = _paged_inner(acc, l_i, m_i, q, pos, row_ok, k_base, v_base, table_row, key_lo, key_hi,
                                     kv_len, mid_lo, mid_hi, SCALE, CAP, HAS_CAP, WINDOW, WIN_L, NUM_PAGES, PAGE,
                                     PAGES_PER_SEQ, HKV, D, DV, HEAD_DIM, HEAD_DIM_V, DOT_PREC, False, BLOCK_N)
        acc, l_i, m_i = _paged_inner(acc, l_i, m_i, q, pos, row_ok, k_base, v_base, table_row, key_lo, key_hi,
                                     kv_len, mid_hi, hi, SCALE, CAP, HAS_CAP, WINDOW, WIN_L, NUM_PAGES, PAGE,
                                     PAGES_PER_SEQ, HKV, D, DV, HEAD_DIM, HEAD_DIM_V, DOT_PREC, True, BLOCK_N)

    out_mask = row_ok[:, None] & (offs_dv[None, :] < DV)
    out_ptrs = Out + q_rows[:, None] * DV + offs_dv[None, :]
    sink = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        sink = tl.load(Sinks + heads).to(tl.float32) * 1.4426950408889634  # base 2, as the logits
    if NUM_SPLITS == 1:
        if HAS_SINKS:
            acc, l_i = _with_sink(acc, l_i, m_i, sink)
        _store_out(out_ptrs, acc, l_i, out_mask)
    else:
        part_rows = split.to(tl.int64) * (T * HQ) + q_rows
        tl.store(AccPart + part_rows[:, None] * DV + offs_dv[None, :], acc, mask=out_mask)
        tl.store(MaxPart + part_rows, m_i, mask=row_ok)
        tl.store(SumPart + part_rows, l_i, mask=row_ok)
        if MERGE:
            tl.debug_barrier()  # every thread's partials are written before the release below
            arrived = tl.atomic_add(Arrived + pid * HKV + hk, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:  # the last split of this tile and kv head merges
                acc, l_i, m_i = _merge_splits(AccPart, MaxPart, SumPart, q_rows, row_ok, offs_dv, T * HQ, DV,
                                              HEAD_DIM_V, BLOCK_M, NUM_SPLITS)
                if HAS_SINKS:
                    acc, l_i = _with_sink(acc, l_i, m_i, sink)
                _store_out(out_ptrs, acc, l_i, out_mask)
