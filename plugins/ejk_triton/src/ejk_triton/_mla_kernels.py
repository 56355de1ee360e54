# mypy: disable-error-code="no-untyped-def,no-any-return,misc,untyped-decorator"
"""``@triton.jit`` kernel of latent (MLA) paged attention: decode and multi-token prediction, split-KV.

Imported only when the kernel is launched (this module imports triton; see ``_env.import_triton``).

Layouts (contiguous): q ``[B, Sq, Hq, Dk]``, the latent cache ``[P, page, Dk]``, kv_lens ``[B]``,
page table ``[B, pages_per_seq]`` (int32). Outputs: the attention ``[B, Sq, Hq, Dv]``; with several
splits instead, per split ``z``, the unnormalised float32 partials ``acc [Z, B·Sq·Hq, Dv]``, running
max ``m [Z, B·Sq·Hq]`` and sum ``l [Z, B·Sq·Hq]`` of the base-2 logits, merged by the caller.

A program takes one sequence, a block of ``BLOCK_H`` query heads of its ``Sq`` tokens (row ``m``
is token ``m // BLOCK_H``, head ``m % BLOCK_H``; ``BLOCK_M`` rows, padded to a power of two
``>= 16``) and one split of its keys. Each step loads ``BLOCK_N`` latent positions through the page
table once, as two tiles: the first ``Dv`` dims (the values, and the keys' first part) and the
other ``Dk - Dv`` (the rotary part of the keys). The logits are ``q[:, :Dv] · lat^T +
q[:, Dv:] · rope^T``; the output accumulates ``p · lat``: the value tile is the key tile already
in shared memory, so the cache is read once for every head of the block and nothing twice.
Positions a row cannot see (past the context, or causal: past ``kv_len - Sq + token``) are
masked; keys past the split are never loaded (zeros), so NaN there cannot leak into ``0 · v``.
"""

from __future__ import annotations

import triton
import triton.language as tl

_NEG_INF: tl.constexpr = tl.constexpr(float("-inf"))
_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _load_rows(ptrs, row_ok, col_ok, CHECK_COLS: tl.constexpr):
    if CHECK_COLS:
        return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    return tl.load(ptrs, mask=row_ok[:, None], other=0.0)


@triton.jit
def mla_kernel(Q, KV, KvLens, Table, Out, AccPart, MaxPart, SumPart,
               SCALE: tl.constexpr, SQ: tl.constexpr, HQ: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
               DV_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr, NUM_PAGES: tl.constexpr,
               PAGE: tl.constexpr, PAGES_PER_SEQ: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
               ROWS: tl.constexpr):
    """Grid ``(cdiv(Hq, BLOCK_H), B, NUM_SPLITS)``; ``ROWS = B·Sq·Hq`` (the partials' split stride).

    The head blocks of a sequence are neighbours in launch order, so they read its pages from L2.

    With one split the program writes its rows of ``Out``; with several, its partials (the caller
    merges them). Unused outputs are placeholders.
    """
    hb = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)

    kv_len = tl.minimum(tl.maximum(tl.load(KvLens + b), 0), PAGES_PER_SEQ * PAGE)
    offs_m = tl.arange(0, BLOCK_M)
    tok = offs_m // BLOCK_H
    head = hb * BLOCK_H + offs_m % BLOCK_H
    row_ok = (tok < SQ) & (head < HQ)
    if CAUSAL:  # noqa: SIM108 (static branches of a Triton kernel)
        last = kv_len - SQ + tok  # the last key each row sees (negative: none)
    else:
        last = tl.zeros([BLOCK_M], tl.int32) + kv_len - 1
    rows = ((b * SQ + tok) * HQ + head).to(tl.int64)  # row of [B·Sq·Hq, ...]
    offs_v = tl.arange(0, DV_PAD)
    offs_r = tl.arange(0, DR_PAD)
    q_lat = _load_rows(Q + rows[:, None] * DK + offs_v[None, :], row_ok, offs_v < DV, DV_PAD != DV)
    if DR > 0:
        q_rope = _load_rows(Q + rows[:, None] * DK + DV + offs_r[None, :], row_ok, offs_r < DR, DR_PAD != DR)

    # This split's keys: whole blocks of the context.
    per_split = ((kv_len + BLOCK_N - 1) // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS * BLOCK_N
    lo = tl.minimum(split * per_split, kv_len)
    hi = tl.minimum(lo + per_split, kv_len)

    m_i = tl.full([BLOCK_M], _NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    table_row = Table + b.to(tl.int64) * PAGES_PER_SEQ
    ONE_PAGE: tl.constexpr = PAGE % BLOCK_N == 0  # a block lies in one page (blocks start at multiples of BLOCK_N)
    # Page ids are loaded one step ahead (table index clipped in range), so the loads of the latents
    # depend on a loop-carried value only and pipeline like direct loads.
    if ONE_PAGE:
        next_page = tl.load(table_row + tl.minimum(lo // PAGE, PAGES_PER_SEQ - 1))
    else:
        next_page = tl.load(table_row + tl.minimum((lo + offs_n) // PAGE, PAGES_PER_SEQ - 1))
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        in_split = keys < hi
        page = tl.minimum(tl.maximum(next_page, 0), NUM_PAGES - 1).to(tl.int64)  # garbage ids stay in bounds
        if ONE_PAGE:
            next_page = tl.load(table_row + tl.minimum((start + BLOCK_N) // PAGE, PAGES_PER_SEQ - 1))
            pos = page * PAGE + start % PAGE + offs_n
        else:
            next_page = tl.load(table_row + tl.minimum((keys + BLOCK_N) // PAGE, PAGES_PER_SEQ - 1))
            pos = page * PAGE + keys % PAGE
        lat = _load_rows(KV + pos[:, None] * DK + offs_v[None, :], in_split, offs_v < DV, DV_PAD != DV)
        s = tl.dot(q_lat, tl.trans(lat), input_precision=DOT_PREC)
        if DR > 0:
            rope = _load_rows(KV + pos[:, None] * DK + DV + offs_r[None, :], in_split, offs_r < DR, DR_PAD != DR)
            s = tl.dot(q_rope, tl.trans(rope), s, input_precision=DOT_PREC)
        s = s * (SCALE * _LOG2E)
        ok = row_ok[:, None] & in_split[None, :] & (keys[None, :] <= last[:, None])
        s = tl.where(ok, s, _NEG_INF)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(lat.dtype), lat, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new

    out_mask = row_ok[:, None] & (offs_v[None, :] < DV)
    if NUM_SPLITS == 1:
        empty = l_i == 0.0  # no visible key; a NaN sum (NaN in q or a visible key) propagates
        out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
        tl.store(Out + rows[:, None] * DV + offs_v[None, :], out.to(Out.dtype.element_ty), mask=out_mask)
    else:
        part = split.to(tl.int64) * ROWS + rows
        tl.store(AccPart + part[:, None] * DV + offs_v[None, :], acc, mask=out_mask)
        tl.store(MaxPart + part, m_i, mask=row_ok)
        tl.store(SumPart + part, l_i, mask=row_ok)
