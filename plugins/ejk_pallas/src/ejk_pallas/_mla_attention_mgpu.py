"""Latent (MLA) paged attention for Hopper with Pallas's Mosaic GPU backend (``plgpu``).

The compute-bound shapes of DeepSeek-style decode (many query heads, or several query tokens, on one shared
latent head: ``Sq · Hq`` rows of ``Dk = 576`` against keys of 576 dims whose first ``Dv = 512`` are the values)
need warpgroup MMA with an output that does not fit one warpgroup's registers (``64 × 512`` float32). So a CTA
takes 64 query rows of one sequence and runs three warpgroups:

* two consumers that share the rows and split the output's columns (``Dv / 2`` each, 128 registers a thread
  of float32 accumulator). Each step covers two key blocks of ``block_kv`` positions: consumer ``w`` computes
  ``S_w = Q · K_wᵀ`` for block ``w`` of the pair (``Q`` and the key tiles from shared memory), the two exchange
  their rows' maxima through shared memory so that both hold the same running max, each writes its
  probabilities ``P_w`` (16-bit) to shared memory, and then each adds ``P_0 · V_0 + P_1 · V_1`` to its half of
  the output, ``V`` being the first ``Dv`` columns of the key tiles already loaded. The running sums stay per
  consumer and meet once at the end.
* one producer that streams the key blocks with TMA from the pages into a ring of ``stages`` slots (a "ready"
  barrier per slot that the TMA completes, a "free" barrier per slot that both consumers arrive on).

The row blocks of one sequence read the same keys: with ``cluster`` 2 or 4 the CTAs of neighbouring row blocks
launch as a cluster, each key block is read once and multicast into all their rings, and a slot is refilled once
the consumers of every CTA in the cluster released it (a cluster barrier).

Rows are ``(token, head)`` pairs, ``token · Hq + head``, padded to 64. A causal row of token ``i`` sees keys
``j <= kv_len - Sq + i``; the CTA streams the keys its last row sees and masks the logits per row. The pair of
key blocks that holds a sequence's last key is gathered by XLA before the launch with the positions past
``kv_len`` zeroed, and streamed from there: what lies in a page past the context never reaches an MMA (a NaN
there cannot leak through ``0 · NaN``). Split-KV (``num_splits``) cuts a CTA's pairs into ranges, one CTA
each; each writes its normalised output in the query's dtype with its base-2 log-sum-exp, merged in float32
by XLA (``ejk.ops.paged_merge_splits``).

Not differentiable (serving-time attention), like the other implementations. With ``EJK_PALLAS_INTERPRET=1``
on a CPU the same kernel runs in Pallas's Mosaic GPU interpret mode.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.config.validators import int_in, one_of
from ejk.devices import sm_count as _sm_count
from ejk.ops import paged_merge_splits
from ejk.tiling import cdiv as _cdiv
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _fa
from ejk_pallas import _flash_attention_mgpu_bwd as _bwd

__all__ = ["MosaicMlaConfig", "capability", "config_space", "heuristic_config", "mla_paged_attention",
           "smem_bytes"]

_DTYPES = ("bfloat16", "float16")
_LOG2E = math.log2(math.e)
#: Query rows of a CTA (one warpgroup MMA's rows; both consumers share them).
_ROWS = 64
_CONSUMERS = 2
#: Registers per thread: consumers, producer (2 × 128 × 232 + 128 × 40 <= 65536).
_REGS = (232, 40)
#: The widest accumulator a consumer holds: ``64 × 256`` float32 (half of DeepSeek's 512 value dims).
_MAX_HALF_DV = 256
_MAX_SPLITS = 64
#: Hopper's shared memory per CTA, and what the barriers and alignment take beyond :func:`smem_bytes`.
_SMEM_LIMIT = 227 * 1024
_SMEM_SPARE = 1024


@attrs.frozen(kw_only=True)
class MosaicMlaConfig:
    """Tiles of the Mosaic GPU latent paged attention.

    Attributes:
        block_kv: Key positions of each consumer's block (a step covers two blocks); the page size must be a
            multiple of it.
        stages: Key blocks the ring holds (at least the two of a step; more let the producer run ahead).
        num_splits: CTAs that share one row block's keys (split-KV), merged afterwards.
        cluster: CTAs of neighbouring row blocks of one sequence launched as a cluster: each key block is read
            once for all of them and multicast into their shared memories (their rings advance together, each
            slot refilled once every CTA's consumers released it). 1 (no cluster), 2 or 4; the rows are padded
            to ``64 · cluster``. GPU only (the interpret mode has no cluster barriers).
    """

    block_kv: int = attrs.field(default=32, validator=one_of(32, 64))
    stages: int = attrs.field(default=3, validator=int_in(2, 8))
    num_splits: int = attrs.field(default=1, validator=int_in(1, _MAX_SPLITS))
    cluster: int = attrs.field(default=1, validator=one_of(1, 2, 4))


@attrs.frozen
class _Static:
    dtype: Any
    dk: int
    dv: int
    bk: int
    stages: int
    splits: int
    cluster: int
    sq: int
    hq: int
    page: int
    pages_per_seq: int
    num_pages: int
    causal: bool
    scale: float
    interpret: bool

    @property
    def half(self) -> int:
        return self.dv // _CONSUMERS

    @property
    def pair(self) -> int:
        return 2 * self.bk


def smem_bytes(cfg: MosaicMlaConfig, dk: int, itemsize: int = 2) -> int:
    """Shared memory (bytes) of a config: the Q tile (then the output's), the key ring, the two probability
    tiles and the rows' statistics. The barriers and their alignment add under 1 KiB (``_SMEM_SPARE``): at 576
    key dims a ring of four 32-key blocks takes 231,520 bytes of Hopper's 232,448. No reduction crosses warps
    (the row statistics reduce within each warp's rows), so the kernel reserves no reduction scratch."""
    return ((_ROWS * dk + cfg.stages * cfg.block_kv * dk + _CONSUMERS * _ROWS * cfg.block_kv) * itemsize
            + (2 * _CONSUMERS + 1) * _ROWS * 4)


def _tail_pairs(kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array,
                pair: int) -> tuple[jax.Array, jax.Array]:
    """``(tails [B, pair, Dk], start [B])``: the pair of key blocks that holds each sequence's last key
    (positions ``start .. start + pair``), positions at or past ``kv_len`` zeroed."""
    page, pages_per_seq = int(kv_pages.shape[1]), int(page_indices.shape[1])
    lens = kv_lens.astype(jnp.int32)
    start = jnp.maximum(lens - 1, 0) // pair * pair
    pos = start[:, None] + jnp.arange(pair, dtype=jnp.int32)[None, :]
    slot = jnp.clip(pos // page, 0, pages_per_seq - 1)
    pages = jnp.clip(jnp.take_along_axis(page_indices.astype(jnp.int32), slot, axis=1), 0, kv_pages.shape[0] - 1)
    rows = kv_pages[pages, pos % page]
    return jnp.where((pos < lens[:, None])[..., None], rows, jnp.zeros((), rows.dtype)), start


def _load(ref: Any, layout: Any, **options: Any) -> Any:
    """``plgpu.load`` of a whole ref in ``layout`` (jax 0.10 also takes an index)."""
    _, plgpu = _fa._mods()
    if _bwd._load_takes_index():
        return plgpu.load(ref, (), layout=layout, **options)
    return plgpu.load(ref, layout=layout, **options)


def _cast(x: Any, layout: Any, interpret: bool) -> Any:
    """``plgpu.layout_cast``; the identity in interpret mode, which has no register layouts."""
    return x if interpret else _fa._mods()[1].layout_cast(x, layout)


def _row_limits(kv_lens: jax.Array, *, sq: int, hq: int, padded: int, causal: bool,
                group: int = _ROWS) -> tuple[jax.Array, jax.Array]:
    """``(limits [B, padded], hi [B, padded / group])`` int32: the keys each row sees (``j < limit``) and those
    the last row of each group of ``group`` rows sees (the key range of a CTA, or of a cluster's CTAs). Padding
    rows see what the last token's rows see."""
    lens = kv_lens.astype(jnp.int32)[:, None]
    token = jnp.minimum(jnp.arange(padded, dtype=jnp.int32) // hq, sq - 1)[None, :]
    limits = jnp.clip(lens - sq + token + 1, 0, lens) if causal else jnp.broadcast_to(lens, (lens.shape[0], padded))
    return limits, limits[:, group - 1::group]


def _kernel(refs: tuple[Any, ...], scoped: Any, *, st: _Static) -> None:
    pl, plgpu = _fa._mods()
    q_ref, kv_ref, tail_ref, lim_ref, hi_ref, start_ref, pidx_ref, out_ref, lse_ref = refs
    (q_smem, ring, p_smem, stats, lse_smem), (ready, q_ready), free, meet = scoped
    wg, group, sp, b = (lax.axis_index(n) for n in ("wg", "rb", "sp", "b"))
    rb = group * st.cluster + (lax.axis_index("cluster") if st.cluster > 1 else 0)
    r0 = rb * _ROWS
    collective = {"collective_axes": "cluster"} if st.cluster > 1 else {}
    pairs = lax.div(hi_ref[b, group] + (st.pair - 1), jnp.int32(st.pair))  # the cluster's keys
    per = lax.div(pairs + (st.splits - 1), jnp.int32(st.splits))
    lo_p = jnp.minimum(sp * per, pairs)
    n = jnp.minimum(lo_p + per, pairs) - lo_p  # the CTA's steps
    tail_start = start_ref[b]

    def slot(i: Any) -> Any:
        return lax.rem(i, jnp.array(st.stages, jnp.int32))

    def producer() -> None:
        plgpu.set_max_registers(_REGS[1], action="decrease")

        def load(i: Any, carry: Any) -> Any:  # the CTA's i-th key block
            s = slot(i)
            _fa._when(i >= st.stages, lambda: plgpu.barrier_wait(free.at[s]))
            key0 = (2 * lo_p + i) * st.bk

            # whole blocks by index (Mosaic GPU cannot prove a dynamic row offset a multiple of the tiling)
            def from_pages() -> None:
                page = jnp.clip(pidx_ref[b, key0 // st.page], 0, st.num_pages - 1)
                block = lax.div(lax.rem(key0, jnp.int32(st.page)), jnp.int32(st.bk))
                plgpu.copy_gmem_to_smem(kv_ref.at[page, block], ring.at[s], ready.at[s], **collective)

            def from_tail() -> None:
                block = lax.div(key0 - tail_start, jnp.int32(st.bk))
                plgpu.copy_gmem_to_smem(tail_ref.at[b, block], ring.at[s], ready.at[s], **collective)

            pl.when(key0 < tail_start)(from_pages)
            pl.when(key0 >= tail_start)(from_tail)
            return carry

        lax.fori_loop(0, 2 * n, load, 0)

        def drain(i: Any, carry: Any) -> Any:  # observe the last blocks' releases (every phase is awaited)
            plgpu.barrier_wait(free.at[slot(i)])
            return carry

        lax.fori_loop(jnp.maximum(2 * n - st.stages, 0), 2 * n, drain, 0)

    def consumer(half: int) -> None:
        plgpu.set_max_registers(_REGS[0], action="increase")
        wgmma_layout = plgpu.Layout.WGMMA
        row_layout = wgmma_layout.reduce(1)
        cols = pl.ds(half * st.half, st.half)
        c = st.scale * _LOG2E

        def meet_other() -> None:
            plgpu.barrier_arrive(meet)
            plgpu.barrier_wait(meet)

        def other_rows(ref: Any) -> Any:  # the other consumer's row statistics
            return ref[...] if st.interpret else _load(ref, row_layout)

        if st.interpret:
            limit = lim_ref[b, pl.ds(r0, _ROWS)]
        else:  # a row vector of the logits' layout, loaded from global memory (plain loads)
            limit = _load(lim_ref.at[b, pl.ds(r0, _ROWS)], row_layout, optimized=False)
        limit = lax.broadcast_in_dim(limit, (_ROWS, st.bk), [0])
        key_cols = _cast(lax.broadcasted_iota(jnp.int32, (_ROWS, st.bk), 1), wgmma_layout, st.interpret)
        plgpu.barrier_wait(q_ready)

        def step(i: Any, carry: Any) -> Any:
            acc, m, denom = carry
            mine, theirs = slot(2 * i + half), slot(2 * i + 1 - half)
            plgpu.barrier_wait(ready.at[mine])
            if st.interpret:  # the interpreter's wgmma takes no transposed operand
                z = jnp.dot(q_smem[...], ring[mine].T, preferred_element_type=jnp.float32)
            else:
                def qk(acc_ref: Any) -> Any:
                    plgpu.wgmma(acc_ref, q_smem, ring.at[mine].transpose((1, 0)))
                    return acc_ref[...]

                z = pl.run_scoped(qk, plgpu.ACC((_ROWS, st.bk), jnp.float32))
            key0 = (2 * (lo_p + i) + half) * st.bk
            z = jnp.where(key_cols + key0 < limit, z, -jnp.inf)
            own_max = z.max(axis=1) * c
            stats[0, half] = own_max
            meet_other()  # both row maxima are in
            m_new = jnp.maximum(jnp.maximum(m, own_max), other_rows(stats.at[0, 1 - half]))
            m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row that sees no key yet
            alpha = jnp.exp2(m - m_use)
            p = jnp.exp2(z * c - lax.broadcast_in_dim(m_use, z.shape, [0]))
            denom = denom * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            p16 = p.astype(st.dtype)
            p_smem[half] = p16
            meet_other()  # both P tiles are in
            plgpu.barrier_wait(ready.at[theirs])
            first, second = slot(2 * i), slot(2 * i + 1)
            if st.interpret:
                acc = acc + jnp.dot(p_smem[0], ring[first][:, half * st.half:(half + 1) * st.half],
                                    preferred_element_type=jnp.float32)
                acc = acc + jnp.dot(p_smem[1], ring[second][:, half * st.half:(half + 1) * st.half],
                                    preferred_element_type=jnp.float32)
            else:  # both P tiles from registers (a shared-memory operand would need V's swizzle)
                p_other = _load(p_smem.at[1 - half], wgmma_layout)
                p_first, p_second = (p16, p_other) if half == 0 else (p_other, p16)

                def pv(acc_ref: Any) -> None:
                    plgpu.wgmma(acc_ref, p_first, ring.at[first, :, cols])
                    plgpu.wgmma(acc_ref, p_second, ring.at[second, :, cols])

                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(free.at[first])
            plgpu.barrier_arrive(free.at[second])
            return acc, m_new, denom

        carry = (_cast(jnp.zeros((_ROWS, st.half), jnp.float32), wgmma_layout, st.interpret),
                 _cast(jnp.full((_ROWS,), -jnp.inf, jnp.float32), row_layout, st.interpret),
                 _cast(jnp.zeros((_ROWS,), jnp.float32), row_layout, st.interpret))
        acc, m, denom = lax.fori_loop(0, n, step, carry)
        stats[1, half] = denom
        meet_other()  # both sums are in; every Q·Kᵀ MMA is done, so Q's tile may hold the output
        total = denom + other_rows(stats.at[1, 1 - half])
        empty = total == 0.0
        acc = acc * lax.broadcast_in_dim(1.0 / jnp.where(empty, 1.0, total), acc.shape, [0])
        q_smem.at[:, cols][...] = acc.astype(st.dtype)
        if half == 0:
            lse_smem[...] = jnp.where(empty, -jnp.inf, m + jnp.log2(jnp.where(empty, 1.0, total)))
        plgpu.commit_smem()
        for band in range(0, _ROWS, 8):  # TMA stores of contiguous tiles: 8-row bands of the column half
            plgpu.copy_smem_to_gmem(q_smem.at[pl.ds(band, 8), cols], out_ref.at[sp, b, pl.ds(r0 + band, 8), cols])
        if half == 0:
            plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[sp, b, pl.ds(r0, _ROWS)])
        plgpu.wait_smem_to_gmem(0)

    _fa._when(wg == 0, lambda: plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(r0, _ROWS)], q_smem, q_ready))
    for half in range(_CONSUMERS):
        _fa._when(wg == half, functools.partial(consumer, half))
    _fa._when(wg == _CONSUMERS, producer)


def _entry(*refs: Any, st: _Static) -> None:
    pl, plgpu = _fa._mods()
    # One swizzle for every tile: a warpgroup MMA's operands share it, and ``P · V`` contracts ``block_kv`` keys.
    transforms = (plgpu.TilingTransform((8, st.bk)), plgpu.SwizzleTransform(st.bk * jnp.dtype(st.dtype).itemsize))
    smem = (
        plgpu.SMEM((_ROWS, st.dk), st.dtype, transforms=transforms),  # Q, then the output
        plgpu.SMEM((st.stages, st.bk, st.dk), st.dtype, transforms=transforms),  # the key ring
        plgpu.SMEM((_CONSUMERS, _ROWS, st.bk), st.dtype, transforms=transforms),  # P of each consumer
        plgpu.SMEM((2, _CONSUMERS, _ROWS), jnp.float32),  # row maxima, then row sums, of each consumer
        plgpu.SMEM((_ROWS,), jnp.float32),  # the rows' log-sum-exp
    )
    ready = (plgpu.Barrier(num_barriers=st.stages), plgpu.Barrier(num_barriers=1))
    if st.cluster > 1:  # a slot is refilled (by multicast) once the consumers of every CTA released it
        free = plgpu.ClusterBarrier(collective_axes=("cluster",), num_arrivals=_CONSUMERS, num_barriers=st.stages)
    else:
        free = plgpu.Barrier(num_arrivals=_CONSUMERS, num_barriers=st.stages)
    pl.run_scoped(lambda *scoped: _kernel(refs, scoped, st=st), smem, ready, free,
                  plgpu.Barrier(num_arrivals=_CONSUMERS), collective_axes="wg")


def _launch(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *, v_head_dim: int,
            scale: float, causal: bool, cfg: MosaicMlaConfig, interpret: bool | None = None) -> jax.Array:
    """The launch; ``interpret`` (default: :func:`ejk_pallas._env.use_interpreter`) picks the interpret mode."""
    _, plgpu = _fa._mods()
    batch, sq, hq, dk = q.shape
    rows = sq * hq
    padded = _cdiv(rows, _ROWS * cfg.cluster) * _ROWS * cfg.cluster
    interpret = _env.use_interpreter() if interpret is None else interpret
    if interpret and cfg.cluster > 1:
        raise ValueError(f"MosaicMlaConfig(cluster={cfg.cluster}) needs a GPU: the Mosaic GPU interpret mode has no "
                         "cluster barriers (use cluster=1 there)")
    st = _Static(dtype=jnp.dtype(q.dtype), dk=int(dk), dv=int(v_head_dim), bk=cfg.block_kv, stages=cfg.stages,
                 splits=cfg.num_splits, cluster=cfg.cluster, sq=int(sq), hq=int(hq), page=int(kv_pages.shape[1]),
                 pages_per_seq=int(page_indices.shape[1]), num_pages=int(kv_pages.shape[0]), causal=causal,
                 scale=scale, interpret=interpret)
    q_rows = jnp.pad(q.reshape(batch, rows, dk), ((0, 0), (0, padded - rows), (0, 0)))
    kv_lens = jnp.minimum(kv_lens.astype(jnp.int32), st.pages_per_seq * st.page)  # the table's capacity
    tails, tail_start = _tail_pairs(kv_pages, kv_lens, page_indices, st.pair)
    limits, group_hi = _row_limits(kv_lens, sq=st.sq, hq=st.hq, padded=padded, causal=causal,
                                   group=_ROWS * st.cluster)
    kwargs: dict[str, Any] = {}
    if interpret:
        kwargs["interpret"] = _fa.interpret_params()
    out, lse = plgpu.kernel(
        functools.partial(_entry, st=st),
        out_type=(jax.ShapeDtypeStruct((st.splits, batch, padded, st.dv), q.dtype),
                  jax.ShapeDtypeStruct((st.splits, batch, padded), jnp.float32)),
        grid=(padded // (_ROWS * st.cluster), st.splits, batch),
        grid_names=("rb", "sp", "b"),
        **({"cluster": (st.cluster,), "cluster_names": ("cluster",)} if st.cluster > 1 else {}),
        num_threads=_CONSUMERS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0),
        **kwargs,
    )(q_rows, kv_pages.reshape(st.num_pages, st.page // st.bk, st.bk, dk), tails.reshape(batch, 2, st.bk, dk),
      limits, group_hi, tail_start, page_indices.astype(jnp.int32))
    merged: jax.Array
    if st.splits == 1:
        merged = out[0]
    else:  # each split's output is normalised: weights 2^lse, sums of one
        merged = paged_merge_splits(out.astype(jnp.float32), lse, jnp.ones_like(lse)).astype(q.dtype)
    return merged[:, :rows].reshape(batch, sq, hq, st.dv)


def mla_paged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *,
                        v_head_dim: int, softmax_scale: float, causal: bool,
                        cfg: MosaicMlaConfig | None = None) -> jax.Array:
    """Latent attention over a paged cache (see ``docs/KERNEL_CONTRACT.md``); arguments arrive validated.

    ``q [B, Sq, Hq, Dk]``, ``kv_pages [P, page, Dk]``, ``kv_lens [B]``, ``page_indices [B, pages_per_seq]``;
    returns ``[B, Sq, Hq, v_head_dim]`` in ``q.dtype``, rows that see no key zeros.
    """
    batch, sq, hq, _ = q.shape
    if min(batch, sq, hq, int(page_indices.shape[1])) == 0:
        return jnp.zeros((batch, sq, hq, v_head_dim), q.dtype)
    if cfg is None:
        cfg = heuristic_config(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim)
    run = functools.partial(_launch, v_head_dim=int(v_head_dim), scale=float(softmax_scale), causal=bool(causal),
                            cfg=cfg)
    out: jax.Array = _batched(run)(q, kv_pages, kv_lens, page_indices)
    return out


def _batched(run: Any) -> Any:
    """``run`` whose ``jax.vmap`` over one shared cache folds the mapped axis into the batch (one launch), and
    over mapped caches runs the calls one after another (their page tables index their own caches)."""

    @jax.custom_batching.custom_vmap
    def call(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any) -> Any:
        return run(q, kv_pages, kv_lens, page_indices)

    @call.def_vmap
    def rule(axis_size: int, in_batched: Any, q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any) -> Any:
        def mapped(x: Any, batched: bool) -> Any:
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        q, kv_lens, page_indices = (mapped(x, bt) for x, bt in zip((q, kv_lens, page_indices),
                                                                   (in_batched[0], *in_batched[2:]), strict=True))
        if in_batched[1]:
            return lax.map(lambda a: call(*a), (q, kv_pages, kv_lens, page_indices)), True
        out = call(q.reshape(-1, *q.shape[2:]), kv_pages, kv_lens.reshape(-1),
                   page_indices.reshape(-1, page_indices.shape[-1]))
        return out.reshape(axis_size, -1, *out.shape[1:]), True

    return call


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, *, v_head_dim: int,
               **_: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: bfloat16 / float16 ``q`` and ``kv_pages`` of one dtype; key dims a multiple of 64; value dims a
    multiple of 128, at most 512 and at most the key dims; pages of a multiple of 32 positions; any ``Sq`` and
    ``Hq`` (rows padded to 64). Needs a Hopper GPU (warpgroup MMA), except in interpret mode
    (``EJK_PALLAS_INTERPRET=1`` on a CPU).
    """
    del kv_lens, page_indices
    dtypes = {jnp.dtype(x.dtype).name for x in (q, kv_pages)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16 and float16 only)"
    if len(dtypes) > 1:
        return f"q and kv_pages must share one dtype (got {', '.join(sorted(dtypes))})"
    dk, dv, page = int(q.shape[3]), int(v_head_dim), int(kv_pages.shape[1])
    if dk % 64:
        return f"key dims {dk} not supported (a multiple of 64)"
    if dv % 128 or dv // _CONSUMERS > _MAX_HALF_DV or dv > dk:
        return f"v_head_dim {dv} not supported (a multiple of 128, at most {2 * _MAX_HALF_DV} and at most {dk})"
    if page % 32:
        return f"page size {page} not supported (a multiple of 32)"
    if not _fitting(dk, page):
        return f"key dims {dk} do not fit shared memory with two key blocks of 32"
    return _fa.hopper_reason()


def _fitting(dk: int, page: int) -> list[MosaicMlaConfig]:
    return [cfg for bk in (32, 64) for stages in range(2, 9)
            if page % bk == 0 and smem_bytes(cfg := MosaicMlaConfig(block_kv=bk, stages=stages), dk)
            + _SMEM_SPARE <= _SMEM_LIMIT]


def _splits(q: Any, kv_pages: Any, page_indices: Any, bk: int) -> int:
    """One where the CTAs fill the SMs; else the splits (powers of two) whose waves of CTAs take the fewest
    steps in all (the fewest splits among equals), each split keeping at least four steps of the longest
    context the page table allows."""
    batch, sq, hq, _ = (int(n) for n in q.shape)
    ctas = batch * _cdiv(sq * hq, _ROWS)
    steps = _cdiv(int(page_indices.shape[1]) * int(kv_pages.shape[1]), 2 * bk)
    if ctas >= _sm_count():
        return 1
    options = [1 << k for k in range(_MAX_SPLITS.bit_length()) if (1 << k) <= _MAX_SPLITS
               and (k == 0 or _cdiv(steps, 1 << k) >= 4)]
    return min(options, key=lambda s: (_cdiv(ctas * s, _sm_count()) * _cdiv(steps, s), s))


def _cluster(q: Any) -> int:
    """Two CTAs a cluster where a sequence has two row blocks or more (their key blocks multicast: half the
    reads), on a GPU (the interpret mode has no cluster barriers)."""
    _, sq, hq, _ = (int(n) for n in q.shape)
    return 2 if sq * hq > _ROWS and not _env.use_interpreter() else 1


def heuristic_config(q: Any, kv_pages: Any, kv_lens: Any = None, page_indices: Any = None, *, v_head_dim: int = 0,
                     **_: Any) -> MosaicMlaConfig:
    """Blocks of 32 keys, the deepest ring that fits (at most 4 blocks), the splits of :func:`_splits` and the
    cluster of :func:`_cluster`."""
    fitting = [cfg for cfg in _fitting(int(q.shape[3]), int(kv_pages.shape[1])) if cfg.block_kv == 32]
    stages = max([cfg.stages for cfg in fitting if cfg.stages <= 4], default=2)
    return MosaicMlaConfig(block_kv=32, stages=stages, num_splits=_splits(q, kv_pages, page_indices, 32),
                           cluster=_cluster(q))


def config_space(q: Any, kv_pages: Any, kv_lens: Any = None, page_indices: Any = None, *, v_head_dim: int = 0,
                 **_: Any) -> list[MosaicMlaConfig]:
    """The heuristic's config first, then every fitting block and ring (up to 4 blocks) at its splits and at
    twice and half as many, each without a cluster and in clusters of as many CTAs as a sequence has row blocks
    (2 or 4; on a GPU)."""
    first = heuristic_config(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim)
    splits = sorted({max(1, first.num_splits // 2), first.num_splits, min(_MAX_SPLITS, 2 * first.num_splits)})
    row_blocks = _cdiv(int(q.shape[1]) * int(q.shape[2]), _ROWS)
    clusters = [1] if _env.use_interpreter() else [c for c in (1, 2, 4) if c <= row_blocks]
    space = [attrs.evolve(cfg, num_splits=s, cluster=c)
             for cfg in _fitting(int(q.shape[3]), int(kv_pages.shape[1])) if cfg.stages <= 4
             for s in splits for c in clusters]
    return [first, *(cfg for cfg in space if cfg != first)]
