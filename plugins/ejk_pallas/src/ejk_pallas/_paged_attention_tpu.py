"""Ragged paged attention as a Mosaic TPU kernel (decode and chunked prefill) — **untested on TPU hardware**.

Checked on the CPU in the TPU interpret mode only. Grid ``(kv head, sequence, page slot)`` with
the page table, lengths and ``cu_q_lens`` scalar-prefetched (``PrefetchScalarGridSpec``): the
index maps of ``k_pages`` / ``v_pages`` (viewed as ``[P, page, Hkv·D]``, no copy) pick page
``page_indices[s, j]`` of kv head ``h``, so the pipeline DMAs exactly the pages a sequence needs;
slots outside the causal end and the sliding window are clamped to a needed page (no new copy)
and skipped. The kv head's ``G`` q heads times the sequence's tokens are the rows (``q``
regrouped to ``[Hkv, T·G, D]`` outside and kept in VMEM per kv head, like the output), so each
page is read once per kv head. The online-softmax state lives in VMEM scratch; a sequence's
rows are processed in blocks of ``block_rows``. No split-K: the page axis is sequential on a
TPU core, parallelism comes from the kv heads (``parallel``). Not differentiable.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.ops import paged_owned_rows
from ejk.plugin import cdiv, multiple_of
from ejk_pallas import _env, _mm
from ejk_pallas._flash_attention_tpu import _pl, _pltpu, _when
from ejk_pallas._paged_attention import gate_shapes

__all__ = ["TpuPagedAttentionConfig", "capability", "config_space", "heuristic_config", "ragged_paged_attention"]

_LOG2E = math.log2(math.e)
_VMEM = 16 * 1024 * 1024


@attrs.frozen(kw_only=True)
class TpuPagedAttentionConfig:
    """Rows (tokens x q heads of a kv head) per block of the Mosaic TPU paged attention (a multiple of 8)."""

    block_rows: int = attrs.field(default=128, validator=multiple_of(8))


@attrs.frozen(kw_only=True)
class _Static:
    scale: float
    cap: float | None
    left: int | None
    group: int
    rows: int
    page: int
    per_seq: int
    precision: str = "highest"
    sinks: bool = False


def _bounds(lens: Any, cu: Any, s: Any, st: _Static) -> tuple[Any, Any, Any, Any, Any]:
    """``(q0, q_len, kv_len, first page, last page)`` of sequence ``s`` (pages clamped to ``[0, per_seq)``)."""
    q0 = cu[s]
    q_len = jnp.maximum(cu[s + 1] - q0, 0)
    kv_len = lens[s]
    last = jnp.clip((kv_len + st.page - 1) // st.page - 1, 0, st.per_seq - 1)
    first = jnp.zeros_like(last)
    if st.left is not None:
        first = jnp.clip((kv_len - q_len - st.left) // st.page, 0, last)
    return q0, q_len, kv_len, first, last


def _kernel(lens_ref: Any, table_ref: Any, cu_ref: Any, num_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any,
            sink_ref: Any, o_ref: Any, m_sc: Any, l_sc: Any, acc_sc: Any, *, st: _Static) -> None:
    p = _pl()
    s, j = p.program_id(1), p.program_id(2)
    q0, q_len, kv_len, first, last = _bounds(lens_ref, cu_ref, s, st)
    live = s < num_ref[0]
    rows, group = st.rows, st.group
    blocks = (q_len * group + rows - 1) // rows

    @_when(jnp.logical_and(s == 0, j == 0))
    def _zero() -> None:
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    def each_block(fn: Any) -> None:
        def body(b: Any, carry: Any) -> Any:
            r = b * rows + lax.broadcasted_iota(jnp.int32, (rows, 1), 0)
            fn(q0 * group + b * rows, r < q_len * group, kv_len - q_len + r // group)
            return carry

        lax.fori_loop(0, blocks, body, 0)

    @_when(jnp.logical_and(live, j == 0))
    def _init() -> None:
        def init(row0: Any, ok: Any, pos: Any) -> None:
            del ok, pos
            at = p.ds(row0, rows)
            m_sc[at, :] = jnp.full((rows, 1), -jnp.inf, jnp.float32)
            l_sc[at, :] = jnp.zeros((rows, 1), jnp.float32)
            acc_sc[at, :] = jnp.zeros((rows, acc_sc.shape[1]), jnp.float32)

        each_block(init)

    @_when(jnp.logical_and(live, jnp.logical_and(j >= first, j <= last)))
    def _step() -> None:
        keys = j * st.page + lax.broadcasted_iota(jnp.int32, (1, st.page), 1)
        k, v = k_ref[...], v_ref[...]

        def step(row0: Any, ok: Any, pos: Any) -> None:
            at = p.ds(row0, rows)
            s_ = _mm.dot(q_ref[at, :], k, (((1,), (1,)), ((), ())), st.precision, gpu=False)
            z = s_ * (st.scale * _LOG2E) if st.cap is None else jnp.tanh(s_ * (st.scale / st.cap)) * (
                st.cap * _LOG2E)
            vis = ok & (keys <= pos) & (keys < kv_len)
            if st.left is not None:
                vis = vis & (keys >= pos - st.left)
            z = jnp.where(vis, z, -jnp.inf)
            m_prev = m_sc[at, :]
            m_new = jnp.maximum(m_prev, jnp.max(z, axis=1, keepdims=True))
            m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            prob = jnp.exp2(z - m_use)
            alpha = jnp.exp2(m_prev - m_use)
            seen = jnp.any(vis, axis=0, keepdims=True)  # [1, page]: keys some row sees
            vv = jnp.where(seen.T, v, jnp.zeros_like(v))
            pv = _mm.dot(prob.astype(v.dtype), vv, (((1,), (0,)), ((), ())), st.precision, gpu=False)
            l_sc[at, :] = l_sc[at, :] * alpha + jnp.sum(prob, axis=1, keepdims=True)
            acc_sc[at, :] = acc_sc[at, :] * alpha + pv
            m_sc[at, :] = m_new

        each_block(step)

    @_when(jnp.logical_and(live, j == last))
    def _finish() -> None:
        def finish(row0: Any, ok: Any, pos: Any) -> None:
            del pos
            at = p.ds(row0, rows)
            denom, acc = l_sc[at, :], acc_sc[at, :]
            if st.sinks:  # e^sink joins the denominator of every row that saw a key (base-2 logits per row)
                m, sink = m_sc[at, :], sink_ref[at, :]
                empty = denom == 0.0
                top = jnp.where(empty, 0.0, jnp.maximum(m, sink))
                alpha = jnp.where(empty, 1.0, jnp.exp2(m - top))
                acc = acc * alpha
                denom = jnp.where(empty, denom, denom * alpha + jnp.exp2(sink - top))
            out = acc / jnp.where(denom == 0.0, 1.0, denom)
            o_ref[at, :] = jnp.where(ok, out.astype(o_ref.dtype), o_ref[at, :])

        each_block(finish)


def ragged_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array,
                           page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, *,
                           softmax_scale: float, sliding_window: tuple[int, int] | None,
                           logits_soft_cap: float | None, sinks: jax.Array | None = None,
                           precision: str = "highest", cfg: TpuPagedAttentionConfig | None = None) -> jax.Array:
    """Causal attention of ragged query chunks over a paged KV cache (see ``docs/KERNEL_CONTRACT.md``);
    ``sinks`` ``[Hq]`` join each row's denominator at its normalisation, ``precision`` sets the float32 dots."""
    tokens, hq, d = q.shape
    num_pages, page, hkv, _ = k_pages.shape
    dv = v_pages.shape[-1]
    seqs, per_seq = page_indices.shape
    if min(tokens, hq, seqs, per_seq, num_pages, page) == 0:
        return jnp.zeros((tokens, hq, dv), q.dtype)
    if cfg is None:
        cfg = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    group = hq // hkv
    st = _Static(scale=float(softmax_scale), cap=None if logits_soft_cap is None else float(logits_soft_cap),
                 left=None if sliding_window is None else int(sliding_window[0]), group=group, rows=cfg.block_rows,
                 page=page, per_seq=per_seq, precision=str(precision), sinks=sinks is not None)
    tg = cdiv(tokens * group, 8) * 8 + cfg.block_rows
    q2 = q.reshape(tokens, hkv, group, d).transpose(1, 0, 2, 3).reshape(hkv, tokens * group, d)
    q2 = _mm.pad_to(q2, (hkv, tg, d))
    # Base-2 sink logits per row of q2 (row t * G + g of kv head h is q head h * G + g); zeros when unused.
    sink_rows = jnp.zeros((hkv, tg, 1), jnp.float32)
    if sinks is not None:
        per_head = (sinks.astype(jnp.float32) * _LOG2E).reshape(hkv, 1, group)
        rows2 = jnp.broadcast_to(per_head, (hkv, tokens, group)).reshape(hkv, tokens * group)
        sink_rows = _mm.pad_to(rows2, (hkv, tg))[..., None]
    lens = jnp.clip(kv_lens.astype(jnp.int32), 0, per_seq * page)
    cu = jnp.clip(cu_q_lens.astype(jnp.int32), 0, tokens)
    table = jnp.clip(page_indices.astype(jnp.int32), 0, num_pages - 1).reshape(-1)
    num = jnp.reshape(jnp.asarray(num_seqs), (1,)).astype(jnp.int32)

    def page_map(h: Any, s: Any, j: Any, lens: Any, table: Any, cu: Any, num: Any) -> tuple[Any, Any, Any]:
        del num
        _, _, _, first, last = _bounds(lens, cu, s, st)
        return table[s * per_seq + jnp.clip(j, first, last)], 0, h

    p = _pl()
    spec = _pltpu().PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(hkv, seqs, per_seq),
        in_specs=[p.BlockSpec((None, tg, d), lambda h, s, j, *_: (h, 0, 0)),
                  p.BlockSpec((None, page, d), page_map),
                  p.BlockSpec((None, page, dv), page_map),
                  p.BlockSpec((None, tg, 1), lambda h, s, j, *_: (h, 0, 0))],
        out_specs=p.BlockSpec((None, tg, dv), lambda h, s, j, *_: (h, 0, 0)),
        scratch_shapes=[_pltpu().VMEM((tg, 1), jnp.float32), _pltpu().VMEM((tg, 1), jnp.float32),
                        _pltpu().VMEM((tg, dv), jnp.float32)],
    )
    out2 = p.pallas_call(
        functools.partial(_kernel, st=st),
        grid_spec=spec,
        out_shape=_mm.out_struct((hkv, tg, dv), q.dtype, q2),
        compiler_params=_pltpu().CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=_pltpu().InterpretParams() if _env.use_interpreter() else False,
        name="ejk_pallas_ragged_paged_attention_tpu",
    )(lens, table, cu, num, q2, k_pages.reshape(num_pages, page, hkv * d), v_pages.reshape(num_pages, page, hkv * dv),
      sink_rows)
    out = out2[:, :tokens * group].reshape(hkv, tokens, group, dv).transpose(1, 0, 2, 3).reshape(tokens, hq, dv)
    keep = paged_owned_rows(tokens, cu_q_lens, jnp.asarray(num_seqs))
    return jnp.where(keep[:, None, None], out, 0).astype(q.dtype)


def vmem_bytes(cfg: TpuPagedAttentionConfig, q: Any, k_pages: Any, v_pages: Any) -> int:
    """Resident ``q`` / output of one kv head (double-buffered), the softmax state and two pages in flight."""
    itemsize = jnp.dtype(q.dtype).itemsize
    group = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    tg = cdiv(int(q.shape[0]) * group, 8) * 8 + cfg.block_rows
    d, dv, page = int(q.shape[2]), int(v_pages.shape[3]), int(k_pages.shape[1])
    return int(2 * tg * (d + dv) * itemsize + tg * (dv + 256) * 4 + 4 * page * (d + dv) * itemsize)


def capability(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
               num_seqs: Any, **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: bfloat16 / float16 / float32 of one dtype, windows, soft cap. On a TPU (untested):
    head dims a multiple of 128 (or one kv head), page sizes a multiple of 8, and the tokens of
    one kv head (``q`` and output) resident in VMEM (16 MiB). Interpret mode takes any shape.
    """
    del kv_lens, page_indices, cu_q_lens, num_seqs
    why = gate_shapes(q, k_pages, v_pages)
    if why is not None or _env.use_interpreter():
        return why
    if jax.default_backend() != "tpu":
        return f"needs a TPU (JAX's default backend is {jax.default_backend()})"
    hkv, page = int(k_pages.shape[2]), int(k_pages.shape[1])
    for name, dim in (("head_dim", int(q.shape[2])), ("v head_dim", int(v_pages.shape[3]))):
        if hkv > 1 and dim % 128:
            return f"{name} {dim} not supported with {hkv} kv heads (a multiple of 128: the page block's lanes)"
    if page % 8:
        return f"page size {page} not supported (a multiple of 8)"
    cfg = heuristic_config(q, k_pages, v_pages, None, None, None, None)
    if vmem_bytes(cfg, q, k_pages, v_pages) > _VMEM:
        return f"{int(q.shape[0])} tokens do not fit VMEM with this kernel (q and output of a kv head stay resident)"
    return None


def heuristic_config(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                     num_seqs: Any, **_: Any) -> TpuPagedAttentionConfig:
    """Blocks of the average query length times the GQA ratio, rounded up to 8, at most 128 (untimed)."""
    del v_pages, kv_lens, cu_q_lens, num_seqs
    group = int(q.shape[1]) // max(int(k_pages.shape[2]), 1)
    seqs = int(page_indices.shape[0]) if page_indices is not None else 1
    rows = cdiv(int(q.shape[0]), max(seqs, 1)) * group
    return TpuPagedAttentionConfig(block_rows=min(128, cdiv(max(rows, 1), 8) * 8))


def config_space(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                 num_seqs: Any, **_: Any) -> list[TpuPagedAttentionConfig]:
    """The heuristic's block, then 64 and 256 rows (untimed on hardware)."""
    first = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    if _env.use_interpreter():
        return [first]
    return list(dict.fromkeys([first, TpuPagedAttentionConfig(block_rows=64),
                               TpuPagedAttentionConfig(block_rows=256)]))
