"""Ragged paged attention as a Pallas kernel for NVIDIA GPUs (Triton lowering): decode and chunked prefill.

Grid ``(sequence, kv head, split)``. A program walks its sequence's query tokens in blocks of
``block_q`` tokens; the block's tokens times the kv head's ``G`` q heads are the rows of its dots
(``q`` is regrouped to ``[Hkv, T·G, D]`` outside, padded to >= 16 rows), so every page is read
once per query block and kv head whatever the GQA ratio: decode reads the KV cache once. Keys
are gathered page by page inside the kernel: each step loads the page ids of ``block_kv / page``
pages from the page table and those pages' keys and values. The causal end and the sliding
window bound each block's key loop, so pages outside are never loaded; keys outside every
row's view are zeroed before the value product, so NaN there cannot leak.

Split-K: the context of each sequence is cut into ``num_splits`` ranges of whole key steps, one
program each, so a batch of a few long sequences still fills the GPU; each writes float32
partials (unnormalised output, base-2 running max and sum) that a small XLA fusion merges with
a log-sum-exp. One split writes the output directly. For chunked prefill, ``q_programs``
programs share one sequence's query blocks instead (block ``b`` goes to program ``b mod
q_programs``, which balances the causal work), so a few long prompts still fill the GPU. Not
differentiable (serving-time attention).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.ops import paged_merge_splits, paged_owned_rows
from ejk.plugin import cdiv, devices, int_in, next_pow2, one_of, power_of_two
from ejk_pallas import _env, _mm
from ejk_pallas._flash_attention import pl
from ejk_pallas._flash_attention_tpu import _when

__all__ = ["PagedAttentionConfig", "capability", "config_space", "heuristic_config", "ragged_paged_attention"]

_LOG2E = math.log2(math.e)
_DTYPES = ("bfloat16", "float16", "float32")
_MAX_ROWS = 256
_MAX_SPLITS = 32


@attrs.frozen(kw_only=True)
class PagedAttentionConfig:
    """Tiles and launch parameters of the Pallas (Triton-lowered) ragged paged attention.

    Attributes:
        block_q: Query tokens per step of a program (times the GQA ratio: the dot's rows).
        block_kv: Keys per step (whole pages: at least one page).
        num_splits: Programs sharing one sequence's context (split-K), merged afterwards.
        q_programs: Programs sharing one sequence's query blocks (prefill), each writing its own rows.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the key loop.
    """

    block_q: int = attrs.field(default=1, validator=power_of_two(1))
    block_kv: int = attrs.field(default=64, validator=power_of_two(16))
    num_splits: int = attrs.field(default=1, validator=int_in(1, _MAX_SPLITS))
    q_programs: int = attrs.field(default=1, validator=int_in(1, 256))
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=2, validator=int_in(1, 8))


@attrs.frozen(kw_only=True)
class _Static:
    scale: float
    cap: float | None
    left: int | None
    group: int
    bq: int
    rows: int
    bk: int
    per_step: int
    splits: int
    q_programs: int
    num_pages: int
    precision: str = "highest"
    sinks: bool = False


def _logits(s: Any, st: _Static) -> Any:
    if st.cap is None:
        return s * (st.scale * _LOG2E)
    return jnp.tanh(s * (st.scale / st.cap)) * (st.cap * _LOG2E)


def _kernel(lens_ref: Any, cu_ref: Any, num_ref: Any, table_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any,
            sink_ref: Any, *out_refs: Any, st: _Static) -> None:
    p = pl()
    from jax.experimental.pallas import triton as plgpu

    s, zq = p.program_id(0), p.program_id(2)
    z, qz = zq // st.q_programs, zq % st.q_programs
    rows, bk, group = st.rows, st.bk, st.group

    @_when(s < num_ref[0])
    def _live() -> None:
        q0 = cu_ref[s]
        q_len = jnp.maximum(cu_ref[s + 1] - q0, 0)
        kv_len = lens_ref[s]
        chunk = (((kv_len + bk - 1) // bk + st.splits - 1) // st.splits) * bk
        z_lo = z * chunk
        z_hi = jnp.minimum(kv_len, z_lo + chunk)
        r = jnp.arange(rows, dtype=jnp.int32)

        def q_block(i: Any, carry: Any) -> Any:
            b = qz + i * st.q_programs
            tok = b * st.bq + r // group
            row_ok = (r < st.bq * group) & (tok < q_len)
            pos = kv_len - q_len + tok
            first = kv_len - q_len + b * st.bq
            row0 = (q0 + b * st.bq) * group
            q = q_ref[p.ds(row0, rows), :]
            hi = jnp.minimum(z_hi, jnp.minimum(first + st.bq, kv_len))
            lo = z_lo if st.left is None else jnp.maximum(z_lo, first - st.left)

            def step(j: Any, state: Any) -> Any:
                acc, m, l_sum = state
                if st.per_step == 1:  # one page a step: a plain 2-D load
                    page_id = jnp.clip(table_ref[j], 0, st.num_pages - 1)
                    k, v = k_ref[page_id], v_ref[page_id]
                else:  # several pages: a gather through their ids
                    pages = jnp.clip(table_ref[p.ds(j * st.per_step, st.per_step)], 0, st.num_pages - 1)
                    k = k_ref[pages].reshape(bk, k_ref.shape[-1])
                    v = v_ref[pages].reshape(bk, v_ref.shape[-1])
                keys = j * bk + jnp.arange(bk, dtype=jnp.int32)
                seen = (keys >= lo) & (keys < hi)  # some row of the block sees the key
                vis = row_ok[:, None] & seen[None, :] & (keys[None, :] <= pos[:, None])
                if st.left is not None:
                    vis = vis & (keys[None, :] >= pos[:, None] - st.left)
                logits = _logits(_mm.dot(q, k, (((1,), (1,)), ((), ())), st.precision, gpu=True), st)
                logits = jnp.where(vis, logits, -jnp.inf)
                m_new = jnp.maximum(m, jnp.max(logits, axis=1))
                m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
                prob = jnp.exp2(logits - m_use[:, None])
                alpha = jnp.exp2(m - m_use)
                v = jnp.where(seen[:, None], v, jnp.zeros_like(v))
                pv = _mm.dot(prob.astype(v.dtype), v, (((1,), (0,)), ((), ())), st.precision, gpu=True)
                return acc * alpha[:, None] + pv, m_new, l_sum * alpha + jnp.sum(prob, axis=1)

            dv = v_ref.shape[-1]
            init = (jnp.zeros((rows, dv), jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
                    jnp.zeros((rows,), jnp.float32))
            acc, m, l_sum = lax.fori_loop(lo // bk, (hi + bk - 1) // bk, step, init)
            at = p.ds(row0, rows)
            if st.splits == 1:
                (o_ref,) = out_refs
                if st.sinks:  # e^sink joins the denominator of every row that saw a key (base-2 logits per row)
                    sink = sink_ref[p.ds(row0, rows)]
                    empty = l_sum == 0.0
                    top = jnp.where(empty, 0.0, jnp.maximum(m, sink))
                    alpha = jnp.where(empty, 1.0, jnp.exp2(m - top))
                    acc = acc * alpha[:, None]
                    l_sum = jnp.where(empty, l_sum, l_sum * alpha + jnp.exp2(sink - top))
                out = acc / jnp.where(l_sum == 0.0, 1.0, l_sum)[:, None]
                plgpu.store(o_ref.at[at, :], out.astype(o_ref.dtype), mask=jnp.broadcast_to(row_ok[:, None], out.shape))
            else:
                acc_ref, m_ref, l_ref = out_refs
                plgpu.store(acc_ref.at[at, :], acc, mask=jnp.broadcast_to(row_ok[:, None], acc.shape))
                plgpu.store(m_ref.at[at], m, mask=row_ok)
                plgpu.store(l_ref.at[at], l_sum, mask=row_ok)
            return carry

        q_blocks = (q_len + st.bq - 1) // st.bq
        lax.fori_loop(0, (jnp.maximum(q_blocks - qz, 0) + st.q_programs - 1) // st.q_programs, q_block, 0)


def ragged_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array,
                           page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, *,
                           softmax_scale: float, sliding_window: tuple[int, int] | None,
                           logits_soft_cap: float | None, sinks: jax.Array | None = None,
                           precision: str = "highest", cfg: PagedAttentionConfig | None = None) -> jax.Array:
    """Causal attention of ragged query chunks over a paged KV cache (see ``docs/KERNEL_CONTRACT.md``).

    ``sinks`` ``[Hq]`` join each row's denominator where it is normalised (in the kernel with one split,
    in the split merge otherwise); ``precision`` sets the float32 dots.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows of no live sequence, and rows that see no key, are zeros.
    """
    tokens, hq, d = q.shape
    num_pages, page, hkv, _ = k_pages.shape
    dv = v_pages.shape[-1]
    seqs, per_seq = page_indices.shape
    if min(tokens, hq, seqs, per_seq, num_pages, page) == 0:
        return jnp.zeros((tokens, hq, dv), q.dtype)
    if cfg is None:
        cfg = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    group = hq // hkv
    per_step = max(1, cfg.block_kv // page)
    rows = max(16, next_pow2(cfg.block_q * group))
    st = _Static(scale=float(softmax_scale), cap=None if logits_soft_cap is None else float(logits_soft_cap),
                 left=None if sliding_window is None else int(sliding_window[0]), group=group, bq=cfg.block_q,
                 rows=rows, bk=per_step * page, per_step=per_step, splits=cfg.num_splits, q_programs=cfg.q_programs,
                 num_pages=num_pages, precision=str(precision), sinks=sinks is not None and cfg.num_splits == 1)
    cols = cdiv(per_seq, per_step) * per_step
    table = _mm.pad_to(page_indices.astype(jnp.int32), (seqs, cols))
    # Clamp the lengths to what the table holds and the query lengths to the tokens (invalid input stays in bounds).
    lens = jnp.clip(kv_lens.astype(jnp.int32), 0, cols * page)
    cu = jnp.clip(cu_q_lens.astype(jnp.int32), 0, tokens)
    num = jnp.reshape(jnp.asarray(num_seqs), (1,)).astype(jnp.int32)
    tg = tokens * group + rows
    q2 = q.reshape(tokens, hkv, group, d).transpose(1, 0, 2, 3).reshape(hkv, tokens * group, d)
    q2 = _mm.pad_to(q2, (hkv, tg, d))
    # Base-2 sink logits per row of q2 ([Hkv, tokens * G], row t * G + g is head h * G + g), or a placeholder.
    sink_rows = jnp.zeros((hkv, tg), jnp.float32)
    if sinks is not None:
        per_head = (sinks.astype(jnp.float32) * _LOG2E).reshape(hkv, 1, group)
        sink_rows = _mm.pad_to(jnp.broadcast_to(per_head, (hkv, tokens, group)).reshape(hkv, tokens * group),
                               (hkv, tg))
    p = pl()
    splits = cfg.num_splits
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return _mm.out_struct(shape, dtype, q2)

    if splits == 1:
        out_shape: Any = sds((hkv, tg, dv), q.dtype)
        out_specs: Any = p.BlockSpec((None, tg, dv), lambda s, h, zq: (h, 0, 0))
    else:
        out_shape = [sds((splits, hkv, tg, dv), jnp.float32), sds((splits, hkv, tg), jnp.float32),
                     sds((splits, hkv, tg), jnp.float32)]
        qp = cfg.q_programs
        out_specs = [p.BlockSpec((None, None, tg, dv), lambda s, h, zq: (zq // qp, h, 0, 0)),
                     p.BlockSpec((None, None, tg), lambda s, h, zq: (zq // qp, h, 0)),
                     p.BlockSpec((None, None, tg), lambda s, h, zq: (zq // qp, h, 0))]
    from jax.experimental.pallas import triton as plgpu

    result = p.pallas_call(
        functools.partial(_kernel, st=st),
        grid=(seqs, hkv, splits * cfg.q_programs),
        in_specs=[
            p.BlockSpec((seqs,), lambda s, h, z: (0,)),
            p.BlockSpec((seqs + 1,), lambda s, h, z: (0,)),
            p.BlockSpec((1,), lambda s, h, z: (0,)),
            p.BlockSpec((None, cols), lambda s, h, z: (s, 0)),
            p.BlockSpec((None, tg, d), lambda s, h, z: (h, 0, 0)),
            p.BlockSpec((num_pages, page, None, d), lambda s, h, z: (0, 0, h, 0)),
            p.BlockSpec((num_pages, page, None, dv), lambda s, h, z: (0, 0, h, 0)),
            p.BlockSpec((None, tg), lambda s, h, z: (h, 0)),
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_env.use_interpreter(),
        name="ejk_pallas_ragged_paged_attention",
    )(lens, cu, num, table, q2, k_pages, v_pages, sink_rows)
    if splits == 1:
        out2 = result
    else:
        acc_part, max_part, sum_part = result
        out2 = paged_merge_splits(acc_part, max_part, sum_part, None if sinks is None else sink_rows)
    out = out2[:, :tokens * group].reshape(hkv, tokens, group, dv).transpose(1, 0, 2, 3).reshape(tokens, hq, dv)
    keep = paged_owned_rows(tokens, cu_q_lens, jnp.asarray(num_seqs))
    return jnp.where(keep[:, None, None], out, 0).astype(q.dtype)


def gate_shapes(q: Any, k_pages: Any, v_pages: Any) -> str | None:
    """The dtype checks both paged implementations share."""
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k_pages, v_pages)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    if len(dtypes) > 1:
        return f"q, k_pages, v_pages must share one dtype (got {', '.join(sorted(dtypes))})"
    return None


def capability(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
               num_seqs: Any, **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: bfloat16 / float16 / float32 of one dtype; head dims that are powers of two from 16
    to 256 (q/k and v may differ); page sizes that are powers of two; up to 256 q heads per kv
    head; sliding windows; soft cap. Needs an NVIDIA GPU (compute capability 8.0+), except in
    interpret mode.
    """
    del kv_lens, page_indices, cu_q_lens, num_seqs
    why = gate_shapes(q, k_pages, v_pages)
    if why is not None:
        return why
    for name, dim in (("head_dim", int(q.shape[2])), ("v head_dim", int(v_pages.shape[3]))):
        if dim < 16 or dim > 256 or dim & (dim - 1):
            return f"{name} {dim} not supported (a power of two from 16 to 256: the kernel loads whole rows)"
    page = int(k_pages.shape[1])
    if page & (page - 1):
        return f"page size {page} not supported (a power of two)"
    group = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    if group > _MAX_ROWS:
        return f"{group} q heads per kv head not supported (at most {_MAX_ROWS})"
    return _mm.gpu_gate((), (), None)


def smem_bytes(cfg: PagedAttentionConfig, q: Any, k_pages: Any, v_pages: Any) -> int:
    """Shared memory estimate (bytes): pipelined key / value steps plus the query tile and probabilities."""
    itemsize = jnp.dtype(q.dtype).itemsize
    d, dv = int(q.shape[2]), int(v_pages.shape[3])
    group = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    rows = max(16, next_pow2(cfg.block_q * group))
    bk = max(cfg.block_kv, int(k_pages.shape[1]))
    return int((max(1, cfg.num_stages - 1) * bk * (d + dv) + rows * (d + bk)) * itemsize)


def _splits(q: Any, k_pages: Any, page_indices: Any, bk: int, block_q: int) -> int:
    """Split-K for decode: at least about two programs per SM, each with at least 4 key steps of the
    longest context; from there up to twice as many splits, the count that loads the SMs most evenly
    (programs / (SMs x programs per SM rounded up); the fewest splits among equals). On the H100, 8
    sequences x 8 kv heads at 2k context: 6 splits (384 programs, 97% even) rather than 5 (320, 81%)."""
    programs = max(int(page_indices.shape[0]) * int(k_pages.shape[2]), 1)
    if block_q > 1:
        return 1
    capacity = int(page_indices.shape[1]) * int(k_pages.shape[1])
    most = max(1, min(capacity // (4 * bk), _MAX_SPLITS))
    sms = devices.sm_count()
    least = min(cdiv(2 * sms, programs), most)

    def evenness(splits: int) -> float:
        n = programs * splits
        return n / (cdiv(n, sms) * sms)

    return max(range(least, min(2 * least, most) + 1), key=lambda s: (round(evenness(s), 3), -s))


def _q_programs(q: Any, k_pages: Any, page_indices: Any, block_q: int) -> int:
    """Prefill: enough programs per sequence for about two per SM, at most the average query blocks."""
    if block_q == 1:
        return 1
    programs = int(page_indices.shape[0]) * int(k_pages.shape[2])
    blocks = cdiv(cdiv(int(q.shape[0]), max(int(page_indices.shape[0]), 1)), block_q)
    return max(1, min(cdiv(2 * devices.sm_count(), max(programs, 1)), blocks, 256))


def heuristic_config(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                     num_seqs: Any, **_: Any) -> PagedAttentionConfig:
    """Decode (``T <= S``): one token per step, 64 keys per step (at least a page), split-K for about two
    programs per SM; prefill: about 64 rows per step, no split, query blocks shared by enough programs
    for about two per SM. 4 warps (8 from 64 rows), 3 stages for
    16-bit decode, then shrunk until the shared-memory estimate fits. Interpret mode: 16 keys, 2 splits."""
    del kv_lens, cu_q_lens, num_seqs
    tokens, seqs = int(q.shape[0]), int(page_indices.shape[0])
    group = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    page = int(k_pages.shape[1])
    decode = tokens <= seqs
    block_q = 1 if decode else max(1, min(next_pow2(cdiv(tokens, max(seqs, 1))), 64 // next_pow2(group)))
    block_kv = max(64 if int(q.shape[2]) <= 128 else 32, page)
    if _env.use_interpreter():
        return PagedAttentionConfig(block_q=block_q, block_kv=max(16, page), num_splits=2 if decode else 1,
                                    q_programs=1 if decode else 2)
    rows = max(16, next_pow2(block_q * group))
    cfg = PagedAttentionConfig(block_q=block_q, block_kv=block_kv, num_warps=8 if rows >= 64 else 4,
                               num_stages=3 if decode and jnp.dtype(q.dtype).itemsize == 2 else 2)

    while smem_bytes(cfg, q, k_pages, v_pages) > devices.smem_per_block() and cfg.num_stages > 1:
        cfg = attrs.evolve(cfg, num_stages=cfg.num_stages - 1)
    splits = _splits(q, k_pages, page_indices, max(block_kv, page), block_q)
    return attrs.evolve(cfg, num_splits=splits, q_programs=_q_programs(q, k_pages, page_indices, block_q))


def config_space(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                 num_seqs: Any, **_: Any) -> list[PagedAttentionConfig]:
    """The heuristic's config first, then keys per step (32-256), stages (2-4), warps and split-K
    (halved, doubled, 1) around it, pruned by the shared-memory estimate; at most 16."""
    base = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    if _env.use_interpreter():
        return [base]

    page = int(k_pages.shape[1])
    evolve = attrs.evolve
    # The most different candidates first (a benchmark may time only the first few).
    out = [base, evolve(base, block_kv=max(128, page), num_stages=3), evolve(base, num_splits=min(_MAX_SPLITS,
                                                                                                  base.num_splits * 2)),
           evolve(base, block_kv=max(32, page), num_stages=4), evolve(base, num_warps=8 if base.num_warps == 4 else 4),
           evolve(base, num_splits=max(1, base.num_splits // 2)), evolve(base, num_splits=1)]
    if base.block_q > 1:
        out[2:2] = [evolve(base, q_programs=min(256, base.q_programs * 2)),
                    evolve(base, q_programs=max(1, base.q_programs // 2))]
    for block_kv in (32, 64, 128, 256):
        for stages in (2, 3, 4):
            out.append(evolve(base, block_kv=max(block_kv, page), num_stages=stages))
    limit = devices.smem_per_block()
    fits = [c for c in dict.fromkeys(out) if c is base or smem_bytes(c, q, k_pages, v_pages) <= limit]
    return fits[:16]
