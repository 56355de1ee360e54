"""Flash attention backward for Hopper written with Pallas's Mosaic GPU backend (``plgpu``).

The backward of ``pallas/gpu:mosaic`` on a GPU (``MosaicFlashAttentionConfig.backward``); it consumes the
forward's residuals (:data:`ejk_pallas._flash_attention.RESIDUALS`: inputs, output and the base-2
log-sum-exp, ``+inf`` for rows that see no key). ``delta = rowsum(dO * O)`` is computed in JAX. Every
kernel has two consumer warpgroups (64 rows of the output tile each) and one producer warpgroup that
streams blocks over TMA into a ring of ``bwd_max_concurrent_steps`` slots (one "ready" barrier per slot
and operand, one "free" barrier per slot both consumers arrive on).

Fused (``deterministic=False``, the default at head dim 64): one CTA per (128 keys, kv head, batch) runs
the dK / dV kernel below with :func:`fused_block` query rows a step, and also stores each consumer's
``dSᵀ`` (16-bit) into one of two shared-memory slots; the consumers meet on a barrier, then each computes
its share of ``dQ = dS·K`` over the CTA's 128 keys (half the columns at head dim 128, half the rows at 64)
and adds it into a zeroed float32 ``[B, Sq, Hq, D]`` buffer with a TMA reduce-add (``jax.new_ref``,
aliased into ``pl.kernel``). ``S`` and ``P`` are computed once instead of twice; the adds land in no
fixed order. In interpret mode (no TMA reductions there) each key tile writes its own float32 part and
JAX sums them.

Deterministic (``deterministic=True``, the default at head dim 128): two kernels.

* dK / dV: one CTA per (128 keys, kv head, batch). The producer streams ``bwd_block_q`` rows of Q,
  dO, lse and delta for every q head of the kv head's group (GQA: dK / dV are summed over the group
  inside the kernel, K / V are never repeated). Each consumer keeps its 64 keys' K and V in shared
  memory and per step computes ``Sᵀ = K·Qᵀ``, ``Pᵀ = exp2(Sᵀ·c - lse)``, ``dV += Pᵀ·dO``,
  ``dPᵀ = V·dOᵀ``, ``dSᵀ = Pᵀ∘(dPᵀ - delta)`` (times ``1 - tanh²`` under a soft cap) and
  ``dK += dSᵀ·Q``.
* dQ: one CTA per (128 query rows, q head, batch), the forward's structure: the producer streams
  ``bwd_block_kv`` keys of K and V of the kv head ``h // group``; each consumer keeps its 64 rows of
  Q, dO, lse and delta and accumulates ``dQ += dS·K``.

A v narrower than q / k (DeepSeek's prefill, 192 / 128) narrows V, dO and dV's tiles, rings and accumulator
(the two kernels only); there the dK / dV kernel forms ``dSᵀ`` from the 16-bit ``Pᵀ`` (``_Static.p16``).

Causal masks and sliding windows bound both loops to the blocks the CTA can see (fully masked blocks
are never loaded); each consumer splits its own range into masked edge blocks and unmasked interior
blocks and only passes the barriers of the CTA's blocks its rows cannot see. Ragged lengths are padded
to 128 (padded rows carry ``lse = +inf`` and ``dO = 0``; padded keys are masked in dQ, their dK / dV
dropped).

With ``EJK_PALLAS_INTERPRET=1`` on a CPU the kernels run in Pallas's Mosaic GPU interpret mode,
which takes neither transposed nor register WGMMA operands: there the matmuls are plain dots.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.tiling import cdiv as _cdiv
from ejk_pallas import _segment_blocks as _segs
from ejk_pallas._flash_attention import _key_blocks, _make_mask, _Mask, _pad, _q_block, _query_blocks
from ejk_pallas._vmap import fold_vmap_into_batch

__all__ = ["backward_impl", "fused_block", "fused_smem_bytes", "smem_bytes"]

_LOG2E = math.log2(math.e)
#: Consumer warpgroups per CTA; each owns 64 rows of the output tile (one WGMMA tile).
_CONSUMERS = 2
_ROWS = 64
_TILE = _CONSUMERS * _ROWS
#: Barriers per consumer for the copies that open a CTA (its K and V, or its Q, dO, lse, delta and the ids):
#: each copy has its own, so that all are in flight at once.
_OPENING_COPIES = 5
_CONSUMER_REGS = 232
_PRODUCER_REGS = 40


def smem_bytes(block: int, steps: int, d: int, itemsize: int, dv: int | None = None) -> int:
    """Shared memory (bytes) of a backward kernel streaming ``block`` rows / keys in ``steps`` slots (V, dO
    and dV ``dv`` wide, default ``d``).

    dK / dV: the consumers' K and V (reused for dK / dV) plus rings of Q, dO, lse and delta (``block``
    float32). dQ: the consumers' Q and dO plus rings of K and V and 2 x 128 float32 lse / delta rows
    (within the first's ``steps x block x 8`` bytes, so one formula bounds both).
    """
    width = d + (d if dv is None else dv)
    return _TILE * width * itemsize + steps * block * (width * itemsize + 2 * 4)


@attrs.frozen(kw_only=True)
class _Static:
    """What the kernel bodies need that is known when tracing."""

    mask: _Mask
    scale: float
    cap: float | None
    dtype: Any
    d: int
    #: V's head dim (dO's and dV's too; at most ``d``, DeepSeek's prefill: 128 beside 192): the dK / dV
    #: kernel's dV accumulator and the V / dO tiles and rings are this wide.
    dv: int
    blk: int  # rows (dK / dV) or keys (dQ) per streamed step
    #: The dK / dV kernel forms ``dSᵀ`` from the 16-bit ``Pᵀ`` the dV MMA takes instead of the float32 one, so
    #: one register tile fewer is live beside dK's and dV's accumulators (:func:`_p16`).
    p16: bool = False
    steps: int
    n_blk: int  # streamed blocks in the padded length
    n_tile: int  # CTA tiles (128) in the padded length of the other axis
    heads: int  # heads of the CTA tiles (kv heads for dK / dV, q heads for dQ)
    group: int
    ragged_keys: bool
    interpret: bool
    #: Segment ids (``_segment_blocks``): the query rows' ids (and offsets, ``row_offsets``) and the keys' ids
    #: are streamed / held beside their tiles, the loop bounds read from a ranges array at run time.
    segments: bool = False
    row_offsets: bool = False
    #: Packed sequences: each row of a consumer tile (a query in dQ, a key in dK / dV) sees one range of the
    #: streamed axis, ``[lo, hi)`` (the causal / window band and the real rows folded in, see
    #: ``_segment_blocks.visible_bounds`` / ``key_visible_bounds``), held as two vectors: a masked block compares
    #: the streamed index with them and nothing else, and no ids are streamed.
    key_ranges: bool = False


def _mods() -> tuple[Any, Any]:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return pl, plgpu


def _loop(lo: Any, hi: Any, body: Any, carry: Any) -> Any:
    if isinstance(lo, int) and isinstance(hi, int) and lo >= hi:
        return carry
    return lax.fori_loop(lo, hi, body, carry)


def _when(cond: Any, fn: Any) -> None:
    if isinstance(cond, bool):
        if cond:
            fn()
        return
    pl, _ = _mods()
    pl.when(cond)(fn)


def _cast(x: Any, layout: Any, st: _Static) -> Any:
    if st.interpret:
        return x
    _, plgpu = _mods()
    return plgpu.layout_cast(x, layout)


def _vector(ref: Any, axis: int, st: _Static) -> Any:
    """A float32 vector from shared memory that indexes ``axis`` of a WGMMA tile (broadcast along the other)."""
    if st.interpret:
        return ref[...]
    _, plgpu = _mods()
    layout = plgpu.Layout.WGMMA.reduce(1 - axis)
    if _load_takes_index():
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


@functools.cache
def _load_takes_index() -> bool:
    """Whether ``plgpu.load`` needs its ``idx`` argument (jax 0.10's ``load(src, idx, *, layout)``; later
    versions dropped or defaulted it)."""
    _, plgpu = _mods()
    try:
        param = inspect.signature(plgpu.load).parameters.get("idx")
    except (TypeError, ValueError):  # pragma: no cover - not introspectable
        return True
    return param is not None and param.default is inspect.Parameter.empty


def _logits(s: Any, st: _Static) -> tuple[Any, Any]:
    """Base-2 logits of raw ``q·k`` (float32) and the ``tanh`` of a soft cap (or ``None``)."""
    if st.cap is None:
        return s * (st.scale * _LOG2E), None
    t = jnp.tanh(s * (st.scale / st.cap))
    return t * (st.cap * _LOG2E), t


def _visible(st: _Static, row0: Any, col0: Any, shape: tuple[int, int], *, rows_axis: int,
             q_info: tuple[Any, ...] = (), k_ids: Any = None, bounds: tuple[Any, ...] = ()) -> Any:
    """Visibility of a WGMMA tile whose ``rows_axis`` indexes queries from ``row0`` and other axis keys
    from ``col0`` (bottom-right aligned masks, see ``_Mask``); ``None`` when everything is visible.

    With segments, ``q_info`` holds the queries' ids (and offsets) and ``k_ids`` the keys' ids, vectors
    along their axes; with ``st.key_ranges``, ``bounds`` holds the tile rows' ``[lo, hi)`` on the streamed axis
    (axis 1), tested alone."""
    _, plgpu = _mods()
    wgmma = plgpu.Layout.WGMMA
    rows = _cast(lax.broadcasted_iota(jnp.int32, shape, rows_axis), wgmma, st) + row0
    cols = _cast(lax.broadcasted_iota(jnp.int32, shape, 1 - rows_axis), wgmma, st) + col0
    if st.key_ranges:
        streamed = cols if rows_axis == 0 else rows
        return ((streamed >= lax.broadcast_in_dim(bounds[0], shape, [0]))
                & (streamed < lax.broadcast_in_dim(bounds[1], shape, [0])))
    mask = st.mask
    offset: Any = mask.offset
    if st.row_offsets:
        rows = rows + lax.broadcast_in_dim(q_info[1], shape, [rows_axis])
        offset = 0
    conds = []
    if st.ragged_keys:
        conds.append(cols < mask.sk)
    if mask.right is not None:
        conds.append(cols <= rows + (offset + mask.right))
    if mask.left is not None:
        conds.append(cols >= rows + (offset - mask.left))
    if st.segments:
        conds.append(lax.broadcast_in_dim(q_info[0], shape, [rows_axis])
                     == lax.broadcast_in_dim(k_ids, shape, [1 - rows_axis]))
    return functools.reduce(jnp.logical_and, conds) if conds else None


def _loop_zero(zeros: Any, wg: Any) -> Any:
    """A zero the loop reads from shared memory each step (``zeros[wg]``, stored before the loop).

    A consumer's own tiles (K and V in dK / dV, Q and dO in dQ) are the same every step: with a static index
    their warpgroup-MMA descriptors are loop-invariant, and LLVM hoists them out of the loop, where they hold
    registers (2 per k-step and operand) that ptxas then spills. Indexed by this zero they stay in the loop."""
    return zeros[wg]


def _mm(a: Any, b_ref: Any, shape: tuple[int, int], st: _Static, *, transpose_b: bool) -> Any:
    """``a · b`` (or ``a · bᵀ``) in float32 with ``a`` a shared-memory ref; a fresh accumulator."""
    pl, plgpu = _mods()
    if st.interpret:
        b = b_ref[...]
        return jnp.dot(a[...], b.T if transpose_b else b, preferred_element_type=jnp.float32)

    def body(acc: Any) -> Any:
        plgpu.wgmma(acc, a, b_ref.transpose((1, 0)) if transpose_b else b_ref)
        return acc[...]

    return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))


def _mma(acc: Any, a: Any, b_ref: Any, st: _Static) -> Any:
    """``acc + a · b`` with ``a`` in registers (16-bit) and ``b`` a shared-memory ref, in place on Hopper."""
    pl, plgpu = _mods()
    if st.interpret:
        return acc + jnp.dot(a, b_ref[...], preferred_element_type=jnp.float32)

    def body(acc_ref: Any) -> None:
        plgpu.wgmma(acc_ref, a, b_ref)

    return pl.run_state(body)(plgpu.ACC.init(acc))


def _mm_pair(a: Any, b_ref: Any, c: Any, d_ref: Any, shape: tuple[int, int], st: _Static) -> tuple[Any, Any]:
    """``(a · b_refᵀ, c · d_refᵀ)`` in float32 (all shared-memory refs), both MMAs in flight at once."""
    pl, plgpu = _mods()
    if st.interpret:
        return (_mm(a, b_ref, shape, st, transpose_b=True), _mm(c, d_ref, shape, st, transpose_b=True))

    def body(acc1: Any, acc2: Any) -> tuple[Any, Any]:
        plgpu.wgmma(acc1, a, b_ref.transpose((1, 0)))
        plgpu.wgmma(acc2, c, d_ref.transpose((1, 0)))
        return acc1[...], acc2[...]

    return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32), plgpu.ACC(shape, jnp.float32))  # type: ignore[no-any-return]


def _mma_and_mm(acc: Any, a: Any, b_ref: Any, c: Any, d_ref: Any, shape: tuple[int, int],
                st: _Static) -> tuple[Any, Any]:
    """``(acc + a · b_ref, c · d_refᵀ)``: ``a`` in registers, ``c`` and the refs in shared memory, both
    MMAs in flight at once (one wait)."""
    pl, plgpu = _mods()
    if st.interpret:
        return _mma(acc, a, b_ref, st), _mm(c, d_ref, shape, st, transpose_b=True)

    def body(refs: Any) -> None:
        acc_ref, out_ref = refs
        plgpu.wgmma(acc_ref, a, b_ref)
        plgpu.wgmma(out_ref, c, d_ref.transpose((1, 0)))

    zeros = _cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA, st)
    return pl.run_state(body)((plgpu.ACC.init(acc), plgpu.ACC.init(zeros)))  # type: ignore[no-any-return]


def _opening_copies(copies: list[tuple[Any, Any]], barriers: Any, wg: Any) -> None:
    """Issue a consumer's opening ``(source, destination)`` copies at once, each on its own barrier, then
    wait for all of them."""
    _, plgpu = _mods()
    base = wg * _OPENING_COPIES
    for i, (src, dst) in enumerate(copies):
        plgpu.copy_gmem_to_smem(src, dst, barriers.at[base + i])
    for i in range(len(copies)):
        plgpu.barrier_wait(barriers.at[base + i])


class _Ring:
    """Slot arithmetic and the producer's fill / refill / drain of a TMA ring over flat steps ``[0, total)``."""

    def __init__(self, st: _Static, total: Any) -> None:
        self.st, self.total = st, total

    def slot(self, i: Any) -> Any:
        return lax.rem(i, jnp.array(self.st.steps, jnp.int32))

    def produce(self, load: Any, free: Any) -> None:
        """``load(i, slot)`` issues step ``i``'s copies; ``free`` are the slots' release barriers."""
        _, plgpu = _mods()
        steps = self.st.steps
        total = self.total
        for i in range(steps):
            _when(i < total if isinstance(total, int) else jnp.int32(i) < total,
                  functools.partial(load, jnp.int32(i), i))

        def refill(i: Any, carry: Any) -> Any:
            s = self.slot(i)
            plgpu.barrier_wait(free.at[s])
            load(i + steps, s)
            return carry

        def drain(i: Any, carry: Any) -> Any:  # every phase is awaited
            plgpu.barrier_wait(free.at[self.slot(i)])
            return carry

        last = max(total - steps, 0) if isinstance(total, int) else jnp.maximum(total - steps, 0)
        _loop(0, last, refill, 0)
        _loop(last, total, drain, 0)


def _consume(ring: _Ring, ready: tuple[Any, ...], free: Any, lo: Any, hi: Any, bounds: tuple[Any, ...],
             base: Any, step: Any, carry: Any) -> Any:
    """One consumer's pass over the CTA's blocks ``[lo, hi)`` (flat steps ``base + t``): its own blocks
    ``bounds = (w_lo, w_lo_full, w_hi_full, w_hi)`` through ``step(t, slot, carry, masked=)``, the others
    only through their barriers."""
    _, plgpu = _mods()

    def run(t: Any, carry: Any, *, masked: bool) -> Any:
        s = ring.slot(base + t)
        for bar in ready:
            plgpu.barrier_wait(bar.at[s])
        carry = step(t, s, carry, masked=masked)
        plgpu.barrier_arrive(free.at[s])
        return carry

    def skip(t: Any, carry: Any) -> Any:
        s = ring.slot(base + t)
        for bar in ready:
            plgpu.barrier_wait(bar.at[s])
        plgpu.barrier_arrive(free.at[s])
        return carry

    w_lo, w_lo_full, w_hi_full, w_hi = bounds
    masked = functools.partial(run, masked=True)
    carry = _loop(lo, w_lo, skip, carry)
    carry = _loop(w_lo, w_lo_full, masked, carry)
    carry = _loop(w_lo_full, w_hi_full, functools.partial(run, masked=False), carry)
    carry = _loop(w_hi_full, w_hi, masked, carry)
    return _loop(w_hi, hi, skip, carry)


def _info_rows(st: _Static) -> int:
    """Rows of the queries' info beside Q in the dQ kernel: ids (and offsets), or the key range's two bounds."""
    return 2 if st.key_ranges else 1 + int(st.row_offsets)


def _segment_refs(refs: tuple[Any, ...], st: _Static, *, keys: bool) -> tuple[Any, Any, Any]:
    """``(queries' info, keys' ids, loop bounds)`` among a kernel's inputs (``None`` for those it does not take).
    With key ranges the dK / dV kernel takes its keys' query ranges (in the ids' place) and the dQ kernel its
    queries' key ranges (in the info's place), and neither the other side's."""
    if not st.segments:
        return None, None, None
    if not st.key_ranges:
        return refs[0], refs[1], refs[2]
    return (None, refs[0], refs[1]) if keys else (refs[0], None, refs[1])


# ----------------------------------------------------------------------------------------------
# dK / dV
# ----------------------------------------------------------------------------------------------


def _dkdv_kernel(q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any, delta_ref: Any, *refs: Any,
                 st: _Static) -> None:
    pl, plgpu = _mods()
    qinfo_ref, kid_ref, ranges_ref = _segment_refs(refs, st, keys=True)
    dk_ref, dv_ref, scoped = refs[-3:]
    (k_smem2, v_smem2, q_ring, do_ring, lse_ring, delta_ring, *seg_smem), ready, kv_ready, free, zeros = scoped
    # The keys' ids (or their query ranges) beside K; the queries' ids streamed with Q (not with key ranges).
    qinfo_ring, kid_smem2 = (None, seg_smem[0]) if st.key_ranges else (*seg_smem, None, None)[:2]
    wg = lax.axis_index("wg")
    tile, kv_head, batch = _tile_of(st)
    col_cta = tile * _TILE
    if st.segments:  # the query blocks of the CTA's keys, from the ids (``_segment_blocks``)
        lo, hi = ranges_ref[batch, tile, _CONSUMERS, 0], ranges_ref[batch, tile, _CONSUMERS, 1]
    else:
        lo, _, _, hi = _query_blocks(st.mask, col_cta, _TILE, st.blk, st.n_blk)
    n = hi - lo
    ring = _Ring(st, n * st.group)

    def consumer() -> None:
        plgpu.set_max_registers(_CONSUMER_REGS, action="increase")
        k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
        col0 = col_cta + wg * _ROWS
        block = (batch, pl.ds(col0, _ROWS), kv_head)
        copies = [(k_ref.at[block], k_smem), (v_ref.at[block], v_smem)]
        if st.segments:
            keys = pl.ds(col0, _ROWS)
            copies.append((kid_ref.at[batch, :, keys] if st.key_ranges else kid_ref.at[batch, keys], kid_smem2.at[wg]))
        _opening_copies(copies, kv_ready, wg)
        k_ids, k_bounds = None, ()
        if st.key_ranges:
            k_bounds = tuple(_vector(kid_smem2.at[wg, r], 0, st) for r in range(2))
        elif st.segments:
            k_ids = _vector(kid_smem2.at[wg], 0, st)
        if st.segments:
            bounds = tuple(ranges_ref[batch, tile, wg, i] for i in range(4))
        else:
            bounds = _query_blocks(st.mask, col0, _ROWS, st.blk, st.n_blk)
        q_r, do_r, lse_r, delta_r, *seg_r = ready
        shape = (_ROWS, st.blk)

        zeros[wg] = jnp.int32(0)

        def step(t: Any, s: Any, carry: Any, *, masked: bool) -> Any:
            dk, dv = carry
            q_s, do_s = q_ring.at[s], do_ring.at[s]
            mine = wg + _loop_zero(zeros, wg)  # K's and V's descriptors stay in the loop
            k_op, v_op = k_smem2.at[mine], v_smem2.at[mine]
            z, tanh = _logits(_mm(k_op, q_s, shape, st, transpose_b=True), st)
            if masked:
                q_info = tuple(_vector(qinfo_ring.at[s, r], 1, st) for r in range(1 + st.row_offsets)) \
                    if st.segments and not st.key_ranges else ()
                vis = _visible(st, t * st.blk, col0, shape, rows_axis=1, q_info=q_info, k_ids=k_ids, bounds=k_bounds)
                if vis is not None:
                    z = jnp.where(vis, z, -jnp.inf)
            lse = _vector(lse_ring.at[s], 1, st)
            p = jnp.exp2(z - lax.broadcast_in_dim(lse, shape, [1]))  # Pᵀ: keys x rows
            p16 = p.astype(st.dtype)
            dv, dp = _mma_and_mm(dv, p16, do_s, v_op, do_s, shape, st)  # dV += Pᵀ·dO; dPᵀ = V·dOᵀ
            if st.p16:  # dS from the 16-bit P: the float32 one is dead once rounded
                p = p16.astype(jnp.float32)
            delta = _vector(delta_ring.at[s], 1, st)
            ds = p * (dp - lax.broadcast_in_dim(delta, shape, [1]))
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)
            dk = _mma(dk, ds.astype(st.dtype), q_s, st)
            plgpu.commit_smem()  # order the generic lse / delta reads before the TMA refills the slot
            return dk, dv

        def head(g: Any, carry: Any) -> Any:
            return _consume(ring, (q_r, do_r, lse_r, delta_r, *seg_r), free, lo, hi, bounds, g * n - lo, step, carry)

        carry = tuple(_cast(jnp.zeros((_ROWS, w), jnp.float32), plgpu.Layout.WGMMA, st) for w in (st.d, st.dv))
        dk, dv = head(0, carry) if st.group == 1 else lax.fori_loop(0, st.group, head, carry)
        k_smem[...] = (dk * st.scale).astype(st.dtype)
        v_smem[...] = dv.astype(st.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[block])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[block])
        plgpu.wait_smem_to_gmem(0)

    def producer() -> None:
        plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")
        q_r, do_r, lse_r, delta_r, *seg_r = ready
        first_head = kv_head * st.group
        safe_n = max(n, 1) if isinstance(n, int) else jnp.maximum(n, 1)

        def load(i: Any, s: Any) -> None:
            g = lax.div(i, jnp.int32(safe_n) if isinstance(safe_n, int) else safe_n)
            rows = pl.ds((lo + lax.rem(i, jnp.int32(safe_n) if isinstance(safe_n, int) else safe_n)) * st.blk,
                         st.blk)
            h = first_head + g
            plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, h], q_ring.at[s], q_r.at[s])
            plgpu.copy_gmem_to_smem(do_ref.at[batch, rows, h], do_ring.at[s], do_r.at[s])
            plgpu.copy_gmem_to_smem(lse_ref.at[batch, h, rows], lse_ring.at[s], lse_r.at[s])
            plgpu.copy_gmem_to_smem(delta_ref.at[batch, h, rows], delta_ring.at[s], delta_r.at[s])
            if st.segments and not st.key_ranges:
                plgpu.copy_gmem_to_smem(qinfo_ref.at[batch, :, rows], qinfo_ring.at[s], seg_r[0].at[s])

        ring.produce(load, free)

    _when(wg < _CONSUMERS, consumer)
    _when(wg == _CONSUMERS, producer)


# ----------------------------------------------------------------------------------------------
# dQ
# ----------------------------------------------------------------------------------------------


def _dq_kernel(q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any, delta_ref: Any, *refs: Any,
               st: _Static) -> None:
    pl, plgpu = _mods()
    qinfo_ref, kid_ref, ranges_ref = _segment_refs(refs, st, keys=False)
    dq_ref, scoped = refs[-2:]
    (q_smem2, do_smem2, lse_smem2, delta_smem2, k_ring, v_ring, *seg_smem), ready, row_ready, free, zeros = scoped
    # The queries' ids and offsets (or their key ranges) beside Q; the keys' ids streamed with K (not with ranges).
    qinfo_smem2, kid_ring = (*seg_smem, None, None)[:2]
    wg = lax.axis_index("wg")
    tile, head, batch = _tile_of(st)
    row_block = _q_block(tile, st.mask, st.n_tile)
    row_cta = row_block * _TILE
    if st.segments:  # the key blocks of the CTA's rows, from the ids (``_segment_blocks``)
        lo, hi = ranges_ref[batch, row_block, _CONSUMERS, 0], ranges_ref[batch, row_block, _CONSUMERS, 1]
    else:
        lo, _, _, hi = _key_blocks(st.mask, row_cta, _TILE, st.blk, st.n_blk)
    ring = _Ring(st, hi - lo)

    def consumer() -> None:
        plgpu.set_max_registers(_CONSUMER_REGS, action="increase")
        q_smem, do_smem = q_smem2.at[wg], do_smem2.at[wg]
        row0 = row_cta + wg * _ROWS
        rows = pl.ds(row0, _ROWS)
        copies = [(q_ref.at[batch, rows, head], q_smem), (do_ref.at[batch, rows, head], do_smem),
                  (lse_ref.at[batch, head, rows], lse_smem2.at[wg]),
                  (delta_ref.at[batch, head, rows], delta_smem2.at[wg])]
        if st.segments:
            copies.append((qinfo_ref.at[batch, :, rows], qinfo_smem2.at[wg]))
        _opening_copies(copies, row_ready, wg)
        lse = _vector(lse_smem2.at[wg], 0, st)
        delta = _vector(delta_smem2.at[wg], 0, st)
        q_info: tuple[Any, ...] = ()
        if st.segments:
            q_info = tuple(_vector(qinfo_smem2.at[wg, r], 0, st) for r in range(_info_rows(st)))
            bounds = tuple(ranges_ref[batch, row_block, wg, i] for i in range(4))
        else:
            bounds = _key_blocks(st.mask, row0, _ROWS, st.blk, st.n_blk)
        shape = (_ROWS, st.blk)

        zeros[wg] = jnp.int32(0)

        def step(t: Any, s: Any, dq: Any, *, masked: bool) -> Any:
            k_s, v_s = k_ring.at[s], v_ring.at[s]
            mine = wg + _loop_zero(zeros, wg)  # Q's and dO's descriptors stay in the loop
            s_raw, dp = _mm_pair(q_smem2.at[mine], k_s, do_smem2.at[mine], v_s, shape, st)  # S = Q·Kᵀ, dP = dO·Vᵀ
            z, tanh = _logits(s_raw, st)
            if masked:
                ids = st.segments and not st.key_ranges
                k_ids = _vector(kid_ring.at[s], 1, st) if ids else None
                if ids:  # order the generic id reads before the TMA refills the slot
                    plgpu.commit_smem()
                vis = _visible(st, row0, t * st.blk, shape, rows_axis=0, q_info=() if st.key_ranges else q_info,
                               k_ids=k_ids, bounds=q_info if st.key_ranges else ())
                if vis is not None:
                    z = jnp.where(vis, z, -jnp.inf)
            p = jnp.exp2(z - lax.broadcast_in_dim(lse, shape, [0]))
            ds = p * (dp - lax.broadcast_in_dim(delta, shape, [0]))
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)
            return _mma(dq, ds.astype(st.dtype), k_s, st)

        dq0 = _cast(jnp.zeros((_ROWS, st.d), jnp.float32), plgpu.Layout.WGMMA, st)
        dq = _consume(ring, ready, free, lo, hi, bounds, -lo, step, dq0)
        q_smem[...] = (dq * st.scale).astype(st.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[batch, rows, head])
        plgpu.wait_smem_to_gmem(0)

    def producer() -> None:
        plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")
        kv_head = lax.div(head, jnp.array(st.group, head.dtype))
        k_r, v_r, *seg_r = ready

        def load(i: Any, s: Any) -> None:
            block = (batch, pl.ds((lo + i) * st.blk, st.blk), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[block], k_ring.at[s], k_r.at[s])
            plgpu.copy_gmem_to_smem(v_ref.at[block], v_ring.at[s], v_r.at[s])
            if st.segments and not st.key_ranges:
                plgpu.copy_gmem_to_smem(kid_ref.at[batch, pl.ds((lo + i) * st.blk, st.blk)], kid_ring.at[s],
                                        seg_r[0].at[s])

        ring.produce(load, free)

    _when(wg < _CONSUMERS, consumer)
    _when(wg == _CONSUMERS, producer)


# ----------------------------------------------------------------------------------------------
# Fused: dK / dV and dQ in one kernel
# ----------------------------------------------------------------------------------------------


def fused_block(d: int) -> int:
    """Query rows per step of the fused kernel at head dim ``d``: 128 at 64 (the consumers split dQ's
    rows), 64 at 128 (they split dQ's columns, 64 each)."""
    return 2 * _ROWS if d <= 64 else _ROWS


def fused_smem_bytes(d: int, steps: int, itemsize: int) -> int:
    """Shared memory (bytes) of the fused kernel: K and V, the Q / dO / lse / delta ring, two slots of the
    CTA's ``dSᵀ`` (``128 x block`` 16-bit) and each consumer's float32 dQ part (``64 x 64`` or ``64 x d``)."""
    blk = fused_block(d)
    dq_cols = d if blk == 2 * _ROWS else d // 2
    return (2 * _TILE * d * itemsize + steps * blk * (2 * d * itemsize + 2 * 4) + 2 * _TILE * blk * itemsize
            + _CONSUMERS * _ROWS * dq_cols * 4)


def _dq_part(ds_slot: Any, k_smem2: Any, wg: Any, st: _Static, zero: Any = 0) -> Any:
    """This consumer's share of ``dQ = dS · K`` over the CTA's 128 keys (float32): rows ``64·wg`` to
    ``64·wg + 64`` of a 128-row step, or columns ``d/2·wg`` to ``d/2·wg + d/2`` of a 64-row step.
    ``ds_slot``: ``[consumers, 64 keys, block]`` (each consumer's ``dSᵀ``); ``k_smem2``: ``[consumers, 64, d]``."""
    pl, plgpu = _mods()
    by_rows = st.blk == 2 * _ROWS
    half = st.d // 2
    shape = (_ROWS, st.d if by_rows else half)
    if st.interpret:
        acc = jnp.zeros(shape, jnp.float32)
        for c in range(_CONSUMERS):
            ds_t, k = ds_slot[c], k_smem2[c]
            if by_rows:
                ds_t = lax.dynamic_slice_in_dim(ds_t, wg * _ROWS, _ROWS, 1)
            else:
                k = lax.dynamic_slice_in_dim(k, wg * half, half, 1)
            acc = acc + jnp.dot(ds_t.T, k, preferred_element_type=jnp.float32)
        return acc

    def body(acc: Any) -> Any:
        for c in range(_CONSUMERS):
            if by_rows:
                a, b = ds_slot.at[c, :, pl.ds(wg * _ROWS, _ROWS)], k_smem2.at[c + zero]
            else:
                a, b = ds_slot.at[c], k_smem2.at[c + zero, :, pl.ds(wg * half, half)]
            plgpu.wgmma(acc, a.transpose((1, 0)), b)
        return acc[...]

    return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))


def _mma2(dk: Any, ds: Any, q_s: Any, dv: Any, p: Any, do_s: Any, ds_dst: Any, st: _Static) -> tuple[Any, Any]:
    """``(dk + ds · q_s, dv + p · do_s)`` (``ds``, ``p`` 16-bit registers), both MMAs in flight while ``ds``
    is stored to ``ds_dst`` (shared memory, fenced for the tensor cores)."""
    pl, plgpu = _mods()
    if st.interpret:
        ds_dst[...] = ds
        return _mma(dk, ds, q_s, st), _mma(dv, p, do_s, st)

    def body(refs: Any) -> None:
        dk_ref, dv_ref = refs
        plgpu.wgmma(dv_ref, p, do_s)
        plgpu.wgmma(dk_ref, ds, q_s)
        ds_dst[...] = ds
        plgpu.commit_smem()

    return pl.run_state(body)((plgpu.ACC.init(dk), plgpu.ACC.init(dv)))  # type: ignore[no-any-return]


def _fused_kernel(q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any, delta_ref: Any, *refs: Any,
                  st: _Static) -> None:
    pl, plgpu = _mods()
    if st.interpret:  # dQ parts per key tile, summed in JAX (the interpreter has no TMA reduction)
        dk_ref, dv_ref, dq_ref, scoped = refs
    else:  # dQ: a zeroed float32 accumulator the TMA adds into
        dq_ref, dk_ref, dv_ref, scoped = refs
    (k_smem2, v_smem2, q_ring, do_ring, lse_ring, delta_ring, ds_smem, dq_smem), ready, kv_ready, free, dsync, \
        zeros = scoped
    wg = lax.axis_index("wg")
    tile, kv_head, batch = _tile_of(st)
    col_cta = tile * _TILE
    lo, _, _, hi = _query_blocks(st.mask, col_cta, _TILE, st.blk, st.n_blk)
    n = hi - lo
    ring = _Ring(st, n * st.group)
    by_rows = st.blk == 2 * _ROWS

    def meet() -> None:
        plgpu.barrier_arrive(dsync)
        plgpu.barrier_wait(dsync)

    def consumer() -> None:
        plgpu.set_max_registers(_CONSUMER_REGS, action="increase")
        k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
        col0 = col_cta + wg * _ROWS
        block = (batch, pl.ds(col0, _ROWS), kv_head)
        _opening_copies([(k_ref.at[block], k_smem), (v_ref.at[block], v_smem)], kv_ready, wg)
        # Both consumers run every block of the CTA's range (they meet on dsync each step): blocks
        # outside a consumer's own unmasked range are masked (its dSᵀ is zero where its keys see nothing).
        _, w_lo_full, w_hi_full, _ = _query_blocks(st.mask, col0, _ROWS, st.blk, st.n_blk)
        bounds = (lo, w_lo_full, w_hi_full, hi)
        q_r, do_r, lse_r, delta_r = ready
        shape = (_ROWS, st.blk)
        dq_s = dq_smem.at[wg]

        def head(g: Any, carry: Any) -> Any:
            base = g * n - lo
            h = kv_head * st.group + g

            def store_dq(dq: Any, t: Any) -> None:  # t: the query block of the dQ part
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last part has left dq_s
                dq_s[...] = dq
                plgpu.commit_smem()
                rows = pl.ds(t * st.blk + (wg * _ROWS if by_rows else 0), _ROWS)
                cols = pl.ds(0, st.d) if by_rows else pl.ds(wg * (st.d // 2), st.d // 2)
                if st.interpret:
                    plgpu.copy_smem_to_gmem(dq_s, dq_ref.at[tile, batch, rows, h, cols])
                else:
                    plgpu.copy_smem_to_gmem(dq_s, dq_ref.at[batch, rows, h, cols], reduction_op="add")

            def step(t: Any, s: Any, carry: Any, *, masked: bool) -> Any:
                dk, dv = carry
                q_s, do_s = q_ring.at[s], do_ring.at[s]
                zero = _loop_zero(zeros, wg)  # K's and V's descriptors stay in the loop
                s_raw, dp = _mm_pair(k_smem2.at[wg + zero], q_s, v_smem2.at[wg + zero], do_s, shape, st)  # Sᵀ, dPᵀ
                z, tanh = _logits(s_raw, st)
                if masked:
                    vis = _visible(st, t * st.blk, col0, shape, rows_axis=1)
                    if vis is not None:
                        z = jnp.where(vis, z, -jnp.inf)
                lse = _vector(lse_ring.at[s], 1, st)
                p = jnp.exp2(z - lax.broadcast_in_dim(lse, shape, [1]))  # Pᵀ: keys x rows
                delta = _vector(delta_ring.at[s], 1, st)
                ds = p * (dp - lax.broadcast_in_dim(delta, shape, [1]))
                if tanh is not None:
                    ds = ds * (1.0 - tanh * tanh)
                slot = ds_smem.at[lax.rem(base + t, 2)]  # two slots: the other consumer may still read the last
                dk, dv = _mma2(dk, ds.astype(st.dtype), q_s, dv, p.astype(st.dtype), do_s, slot.at[wg], st)
                plgpu.commit_smem()  # order the generic lse / delta reads before the TMA refills the slot
                meet()  # both halves of the CTA's dSᵀ are in shared memory
                store_dq(_dq_part(slot, k_smem2, wg, st, zero), t)
                return dk, dv

            return _consume(ring, (q_r, do_r, lse_r, delta_r), free, lo, hi, bounds, base, step, carry)

        zeros[wg] = jnp.int32(0)
        acc0 = _cast(jnp.zeros((_ROWS, st.d), jnp.float32), plgpu.Layout.WGMMA, st)
        carry = (acc0, acc0)
        dk, dv = head(0, carry) if st.group == 1 else lax.fori_loop(0, st.group, head, carry)
        meet()  # the other consumer's last dQ part has read this one's K
        k_smem[...] = (dk * st.scale).astype(st.dtype)
        v_smem[...] = dv.astype(st.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[block])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[block])
        plgpu.wait_smem_to_gmem(0)

    def producer() -> None:
        plgpu.set_max_registers(_PRODUCER_REGS, action="decrease")
        q_r, do_r, lse_r, delta_r = ready
        first_head = kv_head * st.group
        safe_n = max(n, 1) if isinstance(n, int) else jnp.maximum(n, 1)

        def load(i: Any, s: Any) -> None:
            g = lax.div(i, jnp.int32(safe_n) if isinstance(safe_n, int) else safe_n)
            rows = pl.ds((lo + lax.rem(i, jnp.int32(safe_n) if isinstance(safe_n, int) else safe_n)) * st.blk,
                         st.blk)
            h = first_head + g
            plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, h], q_ring.at[s], q_r.at[s])
            plgpu.copy_gmem_to_smem(do_ref.at[batch, rows, h], do_ring.at[s], do_r.at[s])
            plgpu.copy_gmem_to_smem(lse_ref.at[batch, h, rows], lse_ring.at[s], lse_r.at[s])
            plgpu.copy_gmem_to_smem(delta_ref.at[batch, h, rows], delta_ring.at[s], delta_r.at[s])

        ring.produce(load, free)

    _when(wg < _CONSUMERS, consumer)
    _when(wg == _CONSUMERS, producer)


def _visited_rows(st: _Static, sqp: int) -> Any:
    """``[tiles, sqp]`` booleans: which padded query rows the fused kernel's CTA of each key tile visits."""
    tiles = jnp.arange(st.n_tile, dtype=jnp.int32)
    lo, _, _, hi = _query_blocks(st.mask, tiles * _TILE, _TILE, st.blk, st.n_blk)
    rows = jnp.arange(sqp, dtype=jnp.int32)[None]
    lo = jnp.broadcast_to(jnp.asarray(lo), (st.n_tile,))[:, None]
    hi = jnp.broadcast_to(jnp.asarray(hi), (st.n_tile,))[:, None]
    return (rows >= lo * st.blk) & (rows < hi * st.blk)


def _fused(args: tuple[Any, ...], st: _Static, interpret_params: Any) -> tuple[Any, Any, Any]:
    """``(dq float32 unscaled, dk, dv)`` (padded) from the fused kernel."""
    pl, plgpu = _mods()
    qp, kp = args[0], args[1]
    batch, sqp, hq, d = qp.shape
    t = _tiles()
    by_rows = st.blk == 2 * _ROWS
    smem = (plgpu.SMEM((_CONSUMERS, _ROWS, d), st.dtype, transforms=t),
            plgpu.SMEM((_CONSUMERS, _ROWS, d), st.dtype, transforms=t),
            plgpu.SMEM((st.steps, st.blk, d), st.dtype, transforms=t),
            plgpu.SMEM((st.steps, st.blk, d), st.dtype, transforms=t),
            plgpu.SMEM((st.steps, st.blk), jnp.float32),
            plgpu.SMEM((st.steps, st.blk), jnp.float32),
            plgpu.SMEM((2, _CONSUMERS, _ROWS, st.blk), st.dtype, transforms=t),
            plgpu.SMEM((_CONSUMERS, _ROWS, d if by_rows else d // 2), jnp.float32,
                       transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))))
    kv_out = (jax.ShapeDtypeStruct(kp.shape, st.dtype),) * 2
    grid = (st.n_tile * st.heads * qp.shape[0],)
    if interpret_params is not None:
        parts = jax.ShapeDtypeStruct((st.n_tile, batch, sqp, hq, d), jnp.float32)
        dk, dv, dq = _launch(_fused_kernel, st, outs=(*kv_out, parts), grid=grid, names=("cta",), smem=smem,
                             ready=4, interpret_params=interpret_params, meet=True)(*args)
        seen = _visited_rows(st, sqp)[:, None, :, None, None]
        return jnp.where(seen, dq, 0.0).sum(0), dk, dv
    kernel = _launch(_fused_kernel, st, outs=kv_out, grid=grid, names=("cta",), smem=smem, ready=4,
                     interpret_params=None, meet=True)

    def run(refs: Any) -> None:  # the float32 dQ buffer is a Ref the kernel adds into (state kept functional)
        acc_ref, kv_refs = refs
        dk, dv = kernel(*args, acc_ref)
        kv_refs[0][...], kv_refs[1][...] = dk, dv

    empty = jnp.zeros(kp.shape, st.dtype)
    dq, (dk, dv) = pl.run_state(run)((jnp.zeros((batch, sqp, hq, d), jnp.float32), (empty, empty)))
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


def _tile_of(st: _Static) -> tuple[Any, Any, Any]:
    """``(tile, head, batch)`` of this CTA: tiles vary fastest, so the CTAs running at once share a few
    heads' operands in L2 (a grid of ``(tiles, heads, batch)`` launched batches and heads first)."""
    i = lax.axis_index("cta")
    tiles = jnp.array(st.n_tile, i.dtype)
    head_batch = lax.div(i, tiles)
    heads = jnp.array(st.heads, i.dtype)
    return lax.rem(i, tiles), lax.rem(head_batch, heads), lax.div(head_batch, heads)


def _tiles() -> tuple[Any, ...]:
    _, plgpu = _mods()
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def _launch(body: Any, st: _Static, *, outs: Any, grid: tuple[int, ...], names: tuple[str, ...], smem: Any,
            ready: int, interpret_params: Any, meet: bool = False) -> Any:
    pl, plgpu = _mods()

    def entry(*refs: Any) -> None:
        pl.run_scoped(
            lambda *scoped: body(*refs, scoped, st=st),
            smem,
            tuple(plgpu.Barrier(num_barriers=st.steps) for _ in range(ready)),
            plgpu.Barrier(num_barriers=_CONSUMERS * _OPENING_COPIES),
            plgpu.Barrier(num_arrivals=_CONSUMERS, num_barriers=st.steps),
            *((plgpu.Barrier(num_arrivals=_CONSUMERS),) if meet else ()),
            plgpu.SMEM((_CONSUMERS,), jnp.int32),  # each consumer's zero (:func:`_loop_zero`)
            collective_axes="wg",
        )

    params = plgpu.CompilerParams(approx_math=True)
    if interpret_params is None and meet:  # ``pl.kernel`` takes the accumulator Ref (``plgpu.kernel`` cannot)
        mesh = plgpu.Mesh(grid=grid, grid_names=names, num_threads=_CONSUMERS + 1, thread_name="wg")
        return pl.kernel(entry, out_type=outs, mesh=mesh, compiler_params=params, name=body.__name__.strip("_"))
    kwargs: dict[str, Any] = {} if interpret_params is None else {"interpret": interpret_params}
    return plgpu.kernel(entry, out_type=outs, grid=grid, grid_names=names, num_threads=_CONSUMERS + 1,
                        thread_name="wg", compiler_params=params, **kwargs)


def _range_args(segments: Any, mask: _Mask, sqp: int, skp: int, block_q: int,
                block_kv: int) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The two kernels' inputs for packed sequences: dK / dV's keys' query ranges ``[B, 2, Skp]`` and its query
    blocks per 64-key consumer; dQ's queries' key ranges ``[B, 2, Sqp]`` and its key blocks per 64-row consumer
    (``_segment_blocks``; padded rows and keys see nothing)."""
    _, _, q_off, (k_lo, k_hi), (q_lo, q_hi, k_off) = segments

    def pad(x: Any, to: int) -> Any:
        return jnp.pad(x.astype(jnp.int32), ((0, 0), (0, to - x.shape[1])))

    lo, hi = _segs.visible_bounds(pad(k_lo, sqp), pad(k_hi, sqp), pad(q_off, sqp), mask)
    q_args = (jnp.stack([lo, hi], axis=1), _segs.range_block_ranges(lo, hi, mask.sq, block_kv, _CONSUMERS))
    lo, hi = _segs.key_visible_bounds(pad(q_lo, skp), pad(q_hi, skp), pad(k_off, skp), mask)
    kv_args = (jnp.stack([lo, hi], axis=1), _segs.range_block_ranges(lo, hi, mask.sk, block_q, _CONSUMERS))
    return kv_args, q_args


def _p16(d: int, dv: int) -> bool:
    """Whether the dK / dV kernel forms ``dSᵀ`` from the 16-bit ``Pᵀ`` (:attr:`_Static.p16`): where dK's and dV's
    float32 accumulators (``d + dv`` columns of 64 rows) leave a consumer's 232 registers too few to keep the
    float32 one (ptxas spilled there). ``dSᵀ`` is rounded to 16 bits for its MMA anyway; this rounds ``P`` first."""
    return d + dv > 256


def backward_impl(q: Any, k: Any, v: Any, out: Any, lse: Any, d_out: Any, *, block_q: int, block_kv: int,
                  steps: int, causal: bool, softmax_scale: float, sliding_window: tuple[int, int] | None,
                  logits_soft_cap: float | None, interpret_params: Any, d_lse: Any = None,
                  fused: bool = False, segments: Any = None) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` from the forward's residuals (``lse`` base 2, ``[B, Hq, Sq]``, ``+inf`` for empty rows)
    and the cotangents (``d_lse``: of the natural log-sum-exp, if any).

    ``fused``: one kernel (:func:`fused_block` rows a step, ``block_q`` / ``block_kv`` unused), dQ
    accumulated in float32 by TMA reduce-adds in no fixed order; else the two deterministic kernels, dK / dV
    with ``block_q`` query rows a step and dQ with ``block_kv`` keys a step. ``steps``: TMA ring slots;
    ``interpret_params``: Mosaic GPU interpret mode's parameters, or ``None`` to compile for the GPU. ``v`` (and
    ``out``, ``d_out``) may have a narrower head dim than ``q`` / ``k`` (the two kernels only).
    ``segments``: ``(q_ids [B, Sq], k_ids [B, Sk], q_off [B, Sq] | None)`` as the forward's (the two kernels
    only: ``fused`` must be ``False``); packed sequences add ``(k_lo, k_hi)`` (``[B, Sq]``: each query's
    sequence's keys, as the forward's) and ``(q_lo, q_hi, k_off)`` (``[B, Sk]``: each key's sequence's queries
    and its offset ``Sk_s - Sq_s``), which must describe the same visibility as the ids: both kernels then test
    ranges (``_Static.key_ranges``).
    """
    if segments is not None and fused:
        raise ValueError("the fused Mosaic GPU backward has no segment ids; use the two kernels (fused=False)")
    _, plgpu = _mods()
    batch, sq, hq, d = q.shape
    dv_dim = v.shape[3]
    if fused and dv_dim != d:
        raise ValueError(f"the fused Mosaic GPU backward needs v's head dim equal to q's ({dv_dim} != {d}); use the "
                         "two kernels (fused=False)")
    sk, hkv = k.shape[1], k.shape[2]
    sqp, skp = _cdiv(sq, _TILE) * _TILE, _cdiv(sk, _TILE) * _TILE
    dtype = jnp.dtype(q.dtype)
    mask = _make_mask(sq, sk, causal, sliding_window, False)
    common = dict(mask=mask, scale=float(softmax_scale),
                  cap=logits_soft_cap, dtype=dtype, d=d, dv=dv_dim, group=hq // hkv, ragged_keys=skp != sk,
                  interpret=interpret_params is not None, segments=segments is not None,
                  row_offsets=segments is not None and segments[2] is not None and len(segments) == 3,
                  key_ranges=segments is not None and len(segments) == 5)
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
    if d_lse is not None:  # the natural-lse cotangent: d_logits = p · (dp - delta + d_lse)
        delta = delta - d_lse.astype(jnp.float32)
    qp, dop = _pad(q, 1, sqp), _pad(d_out.astype(dtype), 1, sqp)
    kp, vp = _pad(k, 1, skp), _pad(v, 1, skp)
    lsep, deltap = _pad(lse, 2, sqp, jnp.inf), _pad(delta, 2, sqp)  # padded rows: p = 0
    args = (qp, kp, vp, dop, lsep, deltap)

    if fused:
        blk = fused_block(d)
        st = _Static(blk=blk, steps=min(steps, sqp // blk), n_blk=sqp // blk, n_tile=skp // _TILE, heads=hkv,
                     **common)
        # jax.vmap folds into the batch (the accumulator Ref has no batching rule of its own)
        dq32, dk, dv = fold_vmap_into_batch(lambda *a: _fused(a, st, interpret_params))(*args)
        return (dq32[:, :sq] * st.scale).astype(dtype), dk[:, :sk], dv[:, :sk]

    st_kv = _Static(blk=block_q, steps=min(steps, sqp // block_q), n_blk=sqp // block_q, n_tile=skp // _TILE,
                    heads=hkv, p16=_p16(d, dv_dim), **common)
    t = _tiles()
    kv_args: tuple[Any, ...] = ()
    q_args: tuple[Any, ...] = ()
    rows = _info_rows(st_kv)
    if st_kv.key_ranges:
        kv_args, q_args = _range_args(segments, mask, sqp, skp, block_q, block_kv)
    elif segments is not None:
        q_ids, k_ids, q_off = _segs.pad_segments(segments, sqp, skp)
        qinfo = q_ids[:, None] if q_off is None else jnp.stack([q_ids, q_off], axis=1)
        # Key side: per CTA of 128 keys, its 64-key consumers' query blocks (the visibility transposed).
        some, every = _segs.block_visibility(q_ids, k_ids, q_off, mask, block_q, _ROWS)
        kv_args = (qinfo, k_ids, _segs.block_ranges(some.transpose(0, 2, 1), every.transpose(0, 2, 1), _CONSUMERS))
        q_args = (qinfo, k_ids, _segs.block_ranges(*_segs.block_visibility(q_ids, k_ids, q_off, mask, _ROWS,
                                                                          block_kv), _CONSUMERS))
    if st_kv.key_ranges:  # the keys' query ranges beside K
        seg_kv: tuple[Any, ...] = (plgpu.SMEM((_CONSUMERS, 2, _ROWS), jnp.int32),)
    else:  # the queries' ids streamed with Q, the keys' beside K
        seg_kv = (plgpu.SMEM((st_kv.steps, rows, block_q), jnp.int32),
                  plgpu.SMEM((_CONSUMERS, _ROWS), jnp.int32)) if segments is not None else ()
    smem_kv = (plgpu.SMEM((_CONSUMERS, _ROWS, d), dtype, transforms=t),
               plgpu.SMEM((_CONSUMERS, _ROWS, dv_dim), dtype, transforms=t),
               plgpu.SMEM((st_kv.steps, block_q, d), dtype, transforms=t),
               plgpu.SMEM((st_kv.steps, block_q, dv_dim), dtype, transforms=t),
               plgpu.SMEM((st_kv.steps, block_q), jnp.float32),
               plgpu.SMEM((st_kv.steps, block_q), jnp.float32),
               *seg_kv)
    kv_out = (jax.ShapeDtypeStruct(kp.shape, dtype), jax.ShapeDtypeStruct(vp.shape, dtype))
    dk, dv = _launch(_dkdv_kernel, st_kv, outs=kv_out,
                     grid=(skp // _TILE * hkv * batch,), names=("cta",), smem=smem_kv,
                     ready=4 + (segments is not None and not st_kv.key_ranges),
                     interpret_params=interpret_params)(*args, *kv_args)

    st_q = _Static(blk=block_kv, steps=min(steps, skp // block_kv), n_blk=skp // block_kv, n_tile=sqp // _TILE,
                   heads=hq, **common)
    smem_q = (plgpu.SMEM((_CONSUMERS, _ROWS, d), dtype, transforms=t),
              plgpu.SMEM((_CONSUMERS, _ROWS, dv_dim), dtype, transforms=t),
              plgpu.SMEM((_CONSUMERS, _ROWS), jnp.float32),
              plgpu.SMEM((_CONSUMERS, _ROWS), jnp.float32),
              plgpu.SMEM((st_q.steps, block_kv, d), dtype, transforms=t),
              plgpu.SMEM((st_q.steps, block_kv, dv_dim), dtype, transforms=t),
              *((plgpu.SMEM((_CONSUMERS, rows, _ROWS), jnp.int32),) if segments is not None else ()),
              *((plgpu.SMEM((st_q.steps, block_kv), jnp.int32),) if segments is not None and not st_q.key_ranges
                else ()))
    dq = _launch(_dq_kernel, st_q, outs=jax.ShapeDtypeStruct(qp.shape, dtype), grid=(sqp // _TILE * hq * batch,),
                 names=("cta",), smem=smem_q, ready=2 + (segments is not None and not st_q.key_ranges),
                 interpret_params=interpret_params)(*args, *q_args)
    return dq[:, :sq], dk[:, :sk], dv[:, :sk]
