"""Flash attention forward for Hopper written with Pallas's Mosaic GPU backend (``plgpu``).

A work item is (query block of ``block_q`` rows, q head, batch), query blocks varying fastest so the
CTAs running at once share a few heads' K and V in L2. One CTA runs each item, or with
``persistent=True`` one CTA per SM walks items in turn (``ejk.tiling.persistent_ctas``). A CTA runs
``block_q / 64 + 1`` warpgroups:

* ``block_q / 64`` consumer warpgroups (two, or three with the overlap), 64 rows each:
  ``S = Q·Kᵀ`` and ``O += P·V`` with warpgroup MMA (``plgpu.wgmma``; P stays in registers), an
  online softmax in float32 with ``exp2`` (``log2(e)`` and the logit scale folded into one
  multiply), soft cap through ``tanh``; a shared "schedule" barrier staggers them so one runs its
  softmax while the other's MMAs run;
* one producer warpgroup that streams K and V blocks with TMA into a ring of
  ``max_concurrent_steps`` shared-memory slots (one "ready" barrier per slot and operand that the
  TMA completes, one "free" barrier per slot that every consumer arrives on).

Causal masks and sliding windows bound the key loop: the CTA loads only the key blocks its 128 rows
can see, and each consumer splits its own range into masked edge blocks and unmasked interior
blocks; blocks of the CTA's range that a consumer's rows cannot see cost it only barrier traffic.
GQA reads the kv head ``h // group`` (never repeated). Rows that see no key give zeros and
``lse = +inf``. Ragged lengths are padded to the blocks (padded keys masked, padded rows dropped).

Segment ids (``q_segment_ids`` / ``kv_segment_ids``; ``flash_attention_varlen`` maps packed sequences to
them with a per-row offset for the causal / window test, ``_varlen_attention_mgpu``): a key is visible to a
query only when their ids are equal. On the blocks it masks, a consumer loads the key block's ids from global
memory as a column vector of the logits' layout, when the step starts (their latency passes under the step's
barrier waits and ``Q·Kᵀ``; no ring, barrier or TMA for them); the query rows' ids (and offsets) land
with Q and stay in registers as row vectors. The key blocks of each CTA and consumer come from a small
int32 array computed in XLA before the launch (``_segment_blocks``: per-block extremes of ids and
positions) and read as scalars at run time: only blocks whose ids can meet the rows' are loaded, and
wholly visible blocks skip the mask. Packed sequences (``flash_attention_varlen``) pass each query row's
visible keys as one range instead, the causal / window band folded in (``_Static.key_ranges``): the masked
blocks then compare the column index with two bounds and nothing else.

The forward saves the residuals of ``ejk_pallas._flash_attention`` (:data:`RESIDUALS`: inputs,
output and base-2 log-sum-exp). :func:`backward` runs the Mosaic GPU backward of
``ejk_pallas._flash_attention_mgpu_bwd`` on a GPU (``backward="auto"``, the default) and the
Triton-lowered Pallas backward otherwise or when asked; the core can pair this forward with that
implementation's tuned backward too (``ImplChoice.backward``).

``overlap=True`` pipelines a consumer's two matmuls across key blocks (FlashAttention-3's
intra-warpgroup overlap, see :class:`MosaicFlashAttentionConfig`); the consumers then pass a turn
for issuing MMAs instead of meeting on the schedule barrier.

With ``EJK_PALLAS_INTERPRET=1`` on a CPU the same kernel runs in Pallas's Mosaic GPU interpret
mode (``jax._src.pallas.mosaic_gpu.interpret``: simulated shared memory, barriers and TMA).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk.config.validators import int_in, one_of, one_of_str
from ejk.devices import sm_count as _sm_count
from ejk.ops import sinks_backward, without_residuals
from ejk.tiling import cdiv as _cdiv
from ejk.tiling import persistent_ctas
from ejk_pallas import _env
from ejk_pallas import _flash_attention as _fa
from ejk_pallas import _flash_attention_mgpu_bwd as _bwd
from ejk_pallas import _segment_blocks as _segs
from ejk_pallas._flash_attention import RESIDUALS, _key_blocks, _make_mask, _Mask, _pad, _q_block

__all__ = [
    "RESIDUALS",
    "MosaicFlashAttentionConfig",
    "backward",
    "bwd_smem_bytes",
    "capability",
    "config_space",
    "forward",
    "forward_with_residuals",
    "fused_backward",
    "heuristic_config",
    "interpret_params",
]

_LOG2E = math.log2(math.e)
_DTYPES = ("bfloat16", "float16")
_HEAD_DIMS = (64, 128)
#: Q / K head dims that take a narrower V (DeepSeek's prefill: 192 / 128), and those V head dims.
_NARROW_V_HEAD_DIMS = ((128, 192), (64, 128))
#: Query rows of a consumer warpgroup (one 64-row WGMMA tile); ``block_q / 64`` consumers per CTA.
_ROWS = 64
#: Consumer warpgroups of the ping-pong (``overlap=False``), whose meets pair exactly two.
_CONSUMERS = 2
#: Hopper's opt-in shared memory per block (227 KiB), less 4 KiB for barriers and alignment (the
#: lowering counted 2.6 KiB more than :func:`smem_bytes` for a 128 x 128 x 3 config at D = 128).
_SMEM_BUDGET = 227 * 1024 - 4 * 1024
#: Register split by consumer count: the consumers take what the producer gives back (65536 registers
#: per SM over 128 threads a warpgroup: 2 x 232 + 40 = 3 x 160 + 32 = 512).
_REGS = {2: (232, 40), 3: (160, 32)}
#: CTAs of a persistent kernel in interpret mode (each walks several items there too).
_INTERPRET_CTAS = 2


@attrs.frozen(kw_only=True)
class MosaicFlashAttentionConfig:
    """Tiles of the Mosaic GPU flash attention forward.

    Attributes:
        block_q: Query rows per CTA, 64 per consumer warpgroup: 128 (two) or 192 (three; needs
            ``overlap=True`` and head dim 64: each consumer has 160 registers).
        block_kv: Keys per step (one TMA of K and one of V per step).
        max_concurrent_steps: Shared-memory slots of the K/V ring (TMA runs this many steps ahead;
            fewer when the keys have fewer blocks).
        overlap: Pipeline the two matmuls of a warpgroup across key blocks (FlashAttention-3's
            intra-warpgroup overlap): step ``j`` issues ``S_j = Q·K_jᵀ`` and ``O += P_{j-1}·V_{j-1}``
            back to back, then runs the softmax of ``S_j`` while ``P_{j-1}·V_{j-1}`` is in flight.
            Costs registers for a second accumulator and a second ``P`` tile, and one extra
            (zero) ``P·V`` per CTA.
        persistent: One CTA per SM walks the work items (query block, head, batch) in turn: the K / V
            ring streams on from one item into the next, and the next item's Q lands in a second tile
            while this one runs, so neither the pipeline fill nor the output store stalls the MMAs
            between items. Costs a second Q tile of shared memory. ``False``: one CTA per item.
        backward: ``"auto"`` (default: the Mosaic GPU backward of ``_flash_attention_mgpu_bwd`` on a
            GPU whose jax has its API, else the Triton-lowered Pallas backward; the Triton-lowered one
            in interpret mode, where the Mosaic GPU interpreter is slow and stalls on small machines),
            ``"mosaic"`` (that backward or an error saying why not) or ``"triton_lowered"``. The
            Mosaic one measured faster (``benchmarks/results/kernel_defaults_h100.md``).
        bwd_block_q: Query rows per step of the Mosaic dK / dV kernel (``deterministic=True`` only).
        bwd_block_kv: Keys per step of the Mosaic dQ kernel (``deterministic=True`` only).
        bwd_max_concurrent_steps: TMA ring slots of the Mosaic backward kernels.
        deterministic: Which Mosaic backward. ``False``: one fused kernel per 128 keys that computes dK,
            dV and its share of dQ from one ``S`` / ``P`` recomputation and adds the dQ shares into a
            float32 buffer with TMA reduce-adds in no fixed order (dQ may differ in the last bits between
            runs); ``bwd_block_q`` / ``bwd_block_kv`` unused. ``True``: two kernels (dK / dV, then dQ, each
            recomputing ``S`` and ``P``), bitwise reproducible. ``None`` (default): the faster measured
            (``benchmarks/results/pallas_mosaic_attention_h100.md``): fused at head dims 64 and 128 (when its
            ``bwd_max_concurrent_steps`` fit: 2), unless ``XLA_FLAGS`` has ``--xla_gpu_deterministic_ops``;
            two kernels above 128. Calls with segment ids always take the two kernels (the fused one has no
            segments).
    """

    block_q: int = attrs.field(default=128, validator=one_of(128, 192))
    block_kv: int = attrs.field(default=128, validator=one_of(64, 128, 192, 256))
    max_concurrent_steps: int = attrs.field(default=2, validator=int_in(2, 6))
    overlap: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    persistent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    backward: Literal["auto", "triton_lowered", "mosaic"] = attrs.field(
        default="auto", validator=one_of_str("auto", "triton_lowered", "mosaic"))
    bwd_block_q: int = attrs.field(default=64, validator=one_of(64, 128))
    bwd_block_kv: int = attrs.field(default=64, validator=one_of(64, 128))
    bwd_max_concurrent_steps: int = attrs.field(default=2, validator=int_in(2, 4))
    deterministic: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool)))

    def __attrs_post_init__(self) -> None:
        if self.block_q != 128 and not self.overlap:
            raise ValueError(f"MosaicFlashAttentionConfig: block_q={self.block_q} (three consumer warpgroups) needs "
                             "overlap=True (the ping-pong pairs two); use block_q=128 or overlap=True")


@attrs.frozen(kw_only=True)
class _Static:
    """Everything the kernel body needs that is known when tracing."""

    mask: _Mask
    scale: float
    cap: float | None
    dtype: Any
    d: int
    #: V's head dim (at most ``d``): K and V then have rings of their own, and the output leaves Q's tile in
    #: 8-row bands (a ``[64, dv]`` column slice of the ``[64, d]`` tile is contiguous only by bands).
    dv: int
    bq: int
    bk: int
    steps: int
    nq: int
    nk: int
    group: int
    ragged_keys: bool
    interpret: bool
    overlap: bool = False
    #: Query heads, work items (query blocks x heads x batches) and CTAs (items / CTA: see ``persistent``).
    hq: int = 1
    items: int = 1
    ctas: int = 1
    #: Q / O tiles per consumer: 2 when persistent (the next item's Q lands while this one runs).
    q_buffers: int = 1
    #: Whether a sink per head joins each row's final normalisation (``sink_ref``: base-2 logits ``[Hq]`` in
    #: global memory, the item's head read as a scalar when the item starts and broadcast over its rows).
    sinks: bool = False
    #: Segment ids: a key is visible to a query only when their ids are equal (``qinfo_ref`` holds the query rows'
    #: ids, ``kseg_ref`` the keys'); the key blocks each consumer visits come from ``ranges_ref`` at run time.
    segments: bool = False
    #: Per-row offsets replace the static ``mask.offset`` of the id test's causal / window bounds (``qinfo_ref``'s
    #: last row: query row ``i`` sees key ``j`` iff ``i + off[i] - left <= j <= i + off[i] + right``).
    row_offsets: bool = False
    #: Segments given as each query row's visible keys ``[lo, hi)`` (``qinfo_ref``'s first two rows;
    #: ``_segment_blocks.visible_bounds``: the sequence's keys cut to the causal / window band and to the real
    #: keys) instead of ids: packed sequences, whose keys are contiguous. No key ids are streamed; the test is two
    #: compares with the column index and nothing else.
    key_ranges: bool = False

    @property
    def key_ids(self) -> bool:
        """Whether each key block's ids stream beside it (segments given as ids)."""
        return self.segments and not self.key_ranges

    @property
    def info_rows(self) -> int:
        """Rows of ``qinfo_ref``: the ids (then the offsets if any), or the visible keys' bounds."""
        return (2 if self.key_ranges else 1) + int(self.row_offsets)


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------


def _mods() -> tuple[Any, Any]:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return pl, plgpu


def _loop(lo: Any, hi: Any, body: Any, carry: Any) -> Any:
    if isinstance(lo, int) and isinstance(hi, int) and lo >= hi:
        return carry
    return lax.fori_loop(lo, hi, body, carry)


def _row_vector(ref: Any, st: _Static) -> Any:
    """A float32 vector of a consumer's rows from shared memory, in the layout of the softmax statistics."""
    if st.interpret:
        return ref[...]
    _, plgpu = _mods()
    layout = plgpu.Layout.WGMMA.reduce(1)
    return plgpu.load(ref, (), layout=layout) if _bwd._load_takes_index() else plgpu.load(ref, layout=layout)


def _max(a: Any, b: Any) -> Any:
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else jnp.maximum(a, b)


def _when(cond: Any, fn: Any) -> None:
    """``pl.when`` that also takes a Python bool (a bound known when tracing)."""
    if isinstance(cond, bool):
        if cond:
            fn()
        return
    pl, _ = _mods()
    pl.when(cond)(fn)


def _logits(s: Any, st: _Static) -> tuple[Any, float]:
    """``(z, c)`` with ``c·z`` the base-2 logits of raw ``q·k`` (float32), soft-capped when asked.

    Without a cap (and a positive scale) ``z`` is ``q·k`` itself: ``c`` goes into the running max
    and into ``exp2(c·z - m)``, one fused multiply-add per logit.
    """
    if st.cap is None:
        c = st.scale * _LOG2E
        return (s, c) if c > 0 else (s * c, 1.0)
    return jnp.tanh(s * (st.scale / st.cap)) * (st.cap * _LOG2E), 1.0


def _cast(x: Any, layout: Any, st: _Static) -> Any:
    """``plgpu.layout_cast`` (register layouts); the identity in interpret mode, which has no layouts."""
    if st.interpret:
        return x
    _, plgpu = _mods()
    return plgpu.layout_cast(x, layout)


def _col_vector(ref: Any, st: _Static) -> Any:
    """An int32 vector of a key block's columns from global memory, in the column layout of the logits (plain
    loads: Mosaic GPU's optimized transfers reach shared memory only)."""
    if st.interpret:
        return ref[...]
    _, plgpu = _mods()
    layout = plgpu.Layout.WGMMA.reduce(0)
    if _bwd._load_takes_index():
        return plgpu.load(ref, (), layout=layout, optimized=False)
    return plgpu.load(ref, layout=layout, optimized=False)


def _visible(st: _Static, row0: Any, col0: Any, shape: tuple[int, int], rows_info: tuple[Any, ...] = (),
             kseg: Any = None) -> Any:
    """Boolean visibility of a ``[rows, keys]`` tile (bottom-right aligned masks, see ``_Mask``).

    With segments, ``rows_info`` holds the rows' ids (and their offsets with ``st.row_offsets``) as row vectors
    and ``kseg`` the keys' ids as a column vector; with ``st.key_ranges`` it holds the rows' visible keys'
    bounds instead, tested alone (the mask is folded into them).
    """
    _, plgpu = _mods()
    wgmma = plgpu.Layout.WGMMA
    cols = _cast(lax.broadcasted_iota(jnp.int32, shape, 1), wgmma, st) + col0
    if st.key_ranges:
        return ((cols >= lax.broadcast_in_dim(rows_info[0], shape, [0]))
                & (cols < lax.broadcast_in_dim(rows_info[1], shape, [0])))
    rows = _cast(lax.broadcasted_iota(jnp.int32, shape, 0), wgmma, st) + row0
    mask = st.mask
    offset: Any = mask.offset
    if st.row_offsets:
        rows = rows + lax.broadcast_in_dim(rows_info[st.info_rows - 1], shape, [0])
        offset = 0
    conds = []
    if st.ragged_keys:
        conds.append(cols < mask.sk)
    if mask.right is not None:
        conds.append(cols <= rows + (offset + mask.right))
    if mask.left is not None:
        conds.append(cols >= rows + (offset - mask.left))
    if st.segments:
        conds.append(lax.broadcast_in_dim(rows_info[0], shape, [0]) == lax.broadcast_in_dim(kseg, shape, [1]))
    return functools.reduce(jnp.logical_and, conds) if conds else None


def _softmax_step(z: Any, m: Any, denom: Any, st: _Static, mask_at: Any) -> tuple[Any, Any, Any, Any]:
    """One online-softmax update on raw ``q·k`` scores ``z`` (float32 ``[rows, keys]``).

    ``mask_at`` is ``None`` for an unmasked block, else a function that sets the logits the rows cannot
    see to ``-inf``. Returns ``(p, m_new, denom_new, alpha)``: probabilities (float32), the running max
    (base 2), the running denominator and the factor that rescales the running output.
    """
    z, c = _logits(z, st)
    if mask_at is not None:
        z = mask_at(z)
    row_max = z.max(axis=1)
    m_new = jnp.maximum(m, row_max * c if c != 1.0 else row_max)
    # A row may see no key yet: keep exp2 away from (-inf) - (-inf).
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if mask_at is not None else m_new
    alpha = jnp.exp2(m - m_use)
    zc = z * c if c != 1.0 else z
    p = jnp.exp2(zc - lax.broadcast_in_dim(m_use, z.shape, [0]))
    denom = denom * alpha + p.sum(axis=1)
    return p, m_new, denom, alpha


def _scale_rows(acc: Any, alpha: Any) -> Any:
    return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])


def _cond(pred: Any, true_fn: Any, false_fn: Any, *operands: Any) -> Any:
    """``lax.cond`` that also takes a Python bool (a bound known when tracing)."""
    if isinstance(pred, bool):
        return (true_fn if pred else false_fn)(*operands)
    return lax.cond(pred, true_fn, false_fn, *operands)


def _item(i: Any, st: _Static) -> tuple[Any, Any, Any]:
    """``(batch, head, row0)`` of work item ``i``: query blocks vary fastest (a head's K and V stay in L2
    while its query blocks run), then heads, then batches."""
    head_batch = lax.div(i, jnp.array(st.nq, i.dtype))
    row0 = _q_block(lax.rem(i, jnp.array(st.nq, i.dtype)), st.mask, st.nq) * st.bq
    return lax.div(head_batch, jnp.array(st.hq, i.dtype)), lax.rem(head_batch, jnp.array(st.hq, i.dtype)), row0


def _item_blocks(mask: _Mask, bq: int, bk: int, nq: int, nk: int) -> np.ndarray:
    """Key blocks each query block index of :func:`_item` streams (its CTA's range), as numpy ints."""
    row0 = _q_block(np.arange(nq, dtype=np.int32), mask, nq) * bq
    with jax.ensure_compile_time_eval():  # concrete values inside a trace
        lo, _, _, hi = _key_blocks(mask, jnp.asarray(row0), bq, bk, nk)
    return np.broadcast_to(np.asarray(hi) - np.asarray(lo), (nq,)).astype(np.int64)


def _snake(j: Any, cta: Any, ctas: int) -> Any:
    """The ``j``-th work item of CTA ``cta`` (``ejk.tiling.snake_owner``'s order)."""
    return j * ctas + jnp.where(lax.rem(j, 2) == 0, cta, ctas - 1 - cta)


def _items_of(cta: Any, items: int, ctas: int) -> Any:
    """How many work items CTA ``cta`` runs under :func:`_snake`."""
    rounds, rest = divmod(items, ctas)
    if rest == 0:
        return jnp.int32(rounds)
    takes_last = cta < rest if rounds % 2 == 0 else cta >= ctas - rest
    return rounds + takes_last.astype(jnp.int32)


def _items_loop(mine: Any, body: Any, st: _Static, init: Any) -> Any:
    """``carry = body(j, carry)`` over this CTA's work items from ``init`` (the carry counts the key blocks
    streamed so far, with segments beside the next item's bounds); one plain call when every CTA has one item."""
    if st.ctas == st.items:
        return body(jnp.int32(0), init)
    return lax.fori_loop(0, mine, body, init)


def _kernel(q_ref: Any, k_ref: Any, v_ref: Any, sink_ref: Any, seg_refs: Any, out_ref: Any, lse_ref: Any,
            scoped: Any, *, st: _Static) -> None:
    pl, plgpu = _mods()
    # One ring of 2 * steps tiles: K of slot s at s, V of slot s at steps + s (every index into it is
    # traced or a Python int, never a static index followed by a traced one).
    (qo_smem, rings, lse_smem2, *extra_smem), (k_ready, v_ready, q_ready, *extra_ready), (k_free, v_free), sched, \
        turn = scoped
    # With V narrower than K, two rings (the overlap, which indexes one ring, is then off).
    kv_smem: Any = rings if st.dv == st.d else None
    k_smem: Any
    v_smem: Any
    k_smem, v_smem = (None, None) if st.dv == st.d else rings
    # Segments: the query rows' ids (and offsets), or their key ranges, land with Q.
    none: tuple[Any, ...] = (None, None, None)
    qinfo_smem: Any = extra_smem[0] if st.segments else None
    qinfo_ready: Any = extra_ready[0] if st.segments else None
    qinfo_ref, kseg_ref, ranges_ref = seg_refs if st.segments else none
    wg = lax.axis_index("wg")
    cta = lax.axis_index("cta")
    mine = _items_of(cta, st.items, st.ctas)  # one per CTA unless persistent
    consumers = st.bq // _ROWS
    bw = _ROWS

    def item_of(j: Any) -> tuple[Any, Any, Any]:
        return _item(_snake(j, cta, st.ctas), st)

    def segment_bounds(j: Any, *, of_consumer: bool) -> tuple[Any, ...]:
        """Item ``j``'s loop bounds with segments, computed outside the kernel (:func:`_segment_args`): the
        CTA's key blocks ``[lo, hi)``, then with ``of_consumer`` this consumer's four bounds. The items' loops
        read them one item ahead (``j`` past the last item reads the last), so that their latency passes under
        the item before instead of stalling the pipeline between items."""
        batch, _, row0 = item_of(jnp.minimum(j, mine - 1))
        qblk = lax.div(row0, jnp.array(st.bq, row0.dtype))
        out = [ranges_ref[batch, qblk, consumers, 0], ranges_ref[batch, qblk, consumers, 1]]
        if of_consumer:
            out += [ranges_ref[batch, qblk, wg, i] for i in range(4)]
        return tuple(out)

    def first_carry(of_consumer: bool) -> Any:  # ``_items_loop``'s initial carry
        return (jnp.int32(0), segment_bounds(jnp.int32(0), of_consumer=of_consumer)) if st.segments else jnp.int32(0)

    def item_bounds(j: Any, carry: Any, *, of_consumer: bool) -> tuple[Any, Any, tuple[Any, ...]]:
        """``(base, next, bounds)`` of item ``j``: the blocks streamed before it, what to carry to the next
        item (with segments its bounds, read now) and this item's bounds, as ``segment_bounds`` orders them."""
        if st.segments:
            base, bounds = carry
            ahead = bounds if st.ctas == st.items else segment_bounds(j + 1, of_consumer=of_consumer)
            return base, ahead, bounds
        _, _, row0 = item_of(j)
        lo, _, _, hi = _key_blocks(st.mask, row0, st.bq, st.bk, st.nk)
        own = _key_blocks(st.mask, row0 + wg * _ROWS, _ROWS, st.bk, st.nk) if of_consumer else ()
        return carry, None, (lo, hi, *own)

    def next_carry(base: Any, ahead: Any) -> Any:
        return (base, ahead) if st.segments else base

    def k_tile(s: Any) -> Any:
        return kv_smem.at[s] if kv_smem is not None else k_smem.at[s]

    def v_tile(s: Any) -> Any:
        return kv_smem.at[s + st.steps] if kv_smem is not None else v_smem.at[s]

    def k_value(s: Any) -> Any:  # interpret mode
        return kv_smem[s] if kv_smem is not None else k_smem[s]

    def v_value(s: Any) -> Any:  # interpret mode
        return kv_smem[s + st.steps] if kv_smem is not None else v_smem[s]

    def sync() -> None:  # both consumers meet: staggers one's softmax against the other's MMAs
        plgpu.barrier_arrive(sched)
        plgpu.barrier_wait(sched)

    # The overlapped loop passes a turn instead: a consumer waits for its turn, issues its MMAs and
    # hands the turn to the other, so the MMAs alternate while both softmaxes may run at once.
    def my_turn() -> None:
        plgpu.barrier_wait(turn.at[wg])

    def pass_turn() -> None:
        plgpu.barrier_arrive(turn.at[lax.rem(wg + 1, jnp.array(consumers, wg.dtype))])

    issue_begin, issue_end = (my_turn, pass_turn) if st.overlap else (sync, sync)

    def consumer() -> None:
        plgpu.set_max_registers(_REGS[consumers][0], action="increase")
        lse_smem = lse_smem2.at[wg]

        def load_q(j: Any, buf: Any) -> None:
            batch, head, row0 = item_of(j)
            plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0 + wg * bw, bw), head], qo_smem.at[buf, wg],
                                    q_ready.at[wg])
            if st.segments:
                plgpu.copy_gmem_to_smem(qinfo_ref.at[batch, :, pl.ds(row0 + wg * bw, bw)], qinfo_smem.at[buf, wg],
                                        qinfo_ready.at[wg])

        def run_item(j: Any, carry: Any) -> Any:
            """Work item ``j`` of this CTA; the carry counts the key blocks its earlier items streamed (see
            ``item_bounds``)."""
            batch, head, row0 = item_of(j)
            base, ahead, bounds = item_bounds(j, carry, of_consumer=True)
            lo, hi, w_lo, w_lo_full, w_hi_full, w_hi = bounds
            buf = lax.rem(j, jnp.array(st.q_buffers, j.dtype))
            q_smem = qo_smem.at[buf, wg]
            plgpu.barrier_wait(q_ready.at[wg])
            # The head's sink, loaded now: its latency passes under the item's key blocks.
            sink = sink_ref[head] if st.sinks else None
            rows_info: tuple[Any, ...] = ()
            if st.segments:  # the rows' ids (and offsets), held in registers for the item
                plgpu.barrier_wait(qinfo_ready.at[wg])
                rows_info = tuple(_row_vector(qinfo_smem.at[buf, wg, r], st) for r in range(st.info_rows))
                plgpu.commit_smem()  # order these generic reads before a later TMA refills the buffer
            if st.ctas < st.items:  # several items a CTA (persistent, two Q tiles)
                # The last item's output and lse stores have read their tiles: the next Q may go to the
                # other tile (it lands while this item runs), and this item's lse rows may be written.
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                _when(j + 1 < mine, lambda: load_q(j + 1, lax.rem(j + 1, jnp.array(st.q_buffers, j.dtype))))
            r0 = row0 + wg * bw

            def slot(t: Any) -> Any:
                return lax.rem(base + t - lo, jnp.array(st.steps, jnp.int32))

            def mask_at(t: Any, masked: bool) -> Any:
                """``None`` for an unmasked block ``t``, else what masks its logits (``_softmax_step``). Called
                when the step starts: the key block's ids are loaded from global memory then, so that their
                latency passes under the step's waits and ``Q·Kᵀ`` MMA."""
                if not masked:
                    return None
                kseg = _col_vector(kseg_ref.at[batch, pl.ds(t * st.bk, st.bk)], st) if st.key_ids else None

                def mask(z: Any) -> Any:
                    vis = _visible(st, r0, t * st.bk, (bw, st.bk), rows_info, kseg)
                    return z if vis is None else jnp.where(vis, z, -jnp.inf)

                return mask

            def step(t: Any, carry: Any, *, masked: bool) -> Any:
                """Ping-pong step: ``S = Q·Kᵀ``, the softmax, then ``O += P·V``."""
                acc, m, denom = carry
                s = slot(t)
                mask = mask_at(t, masked)
                plgpu.barrier_wait(k_ready.at[s])

                if st.interpret:  # the interpreter's wgmma takes no transposed operand nor registers
                    z = jnp.dot(q_smem[...], k_value(s).T, preferred_element_type=jnp.float32)
                    sync()
                else:
                    def qk(acc_ref: Any) -> Any:
                        plgpu.wgmma(acc_ref, q_smem, k_tile(s).transpose((1, 0)))
                        sync()  # the other consumer's softmax runs while this MMA does
                        return acc_ref[...]

                    z = pl.run_scoped(qk, plgpu.ACC((bw, st.bk), jnp.float32))
                plgpu.barrier_arrive(k_free.at[s])
                p, m_new, denom, alpha = _softmax_step(z, m, denom, st, mask)
                p16 = p.astype(st.dtype)
                acc = _scale_rows(acc, alpha)
                acc, denom, m_new, p16 = lax.optimization_barrier((acc, denom, m_new, p16))
                plgpu.barrier_arrive(sched)
                plgpu.barrier_wait(v_ready.at[s])
                plgpu.barrier_wait(sched)

                if st.interpret:
                    acc = acc + jnp.dot(p16, v_value(s), preferred_element_type=jnp.float32)
                else:  # the MMA accumulates into the running output in place
                    def pv(acc_ref: Any) -> None:
                        plgpu.wgmma(acc_ref, p16, v_tile(s))

                    acc = pl.run_state(pv)(plgpu.ACC.init(acc))
                plgpu.barrier_arrive(v_free.at[s])
                return acc, m_new, denom

            def overlapped_step(t: Any, carry: Any, *, masked: bool) -> Any:
                """Intra-warpgroup overlap: issue ``S_t = Q·K_tᵀ`` and ``O += P_{t-1}·V_{t-1}``, then the
                softmax of ``S_t`` under the ``P·V`` MMA.

                The carry holds ``(A, m, denom, P_{t-1})`` with ``A + P_{t-1}·V_{t-1}`` the output so far
                (``A`` in the basis of ``m``). The first visible block has no ``P_{t-1}``: it multiplies
                zeros by its own K tile (finite), so every step issues the same two MMAs.
                """
                acc, m, denom, p_prev = carry
                s, prev = slot(t), slot(t - 1)
                mask = mask_at(t, masked)
                first = t == w_lo
                later = jnp.logical_not(first)
                pv_tile = jnp.where(first, s, prev + st.steps).astype(jnp.int32)  # K_t's tile, else V_{t-1}'s
                plgpu.barrier_wait(k_ready.at[s])
                pl.when(later)(lambda: plgpu.barrier_wait(v_ready.at[prev]))
                my_turn()

                if st.interpret:
                    z = jnp.dot(q_smem[...], kv_smem[s].T, preferred_element_type=jnp.float32)
                    acc = acc + jnp.dot(p_prev, kv_smem[pv_tile], preferred_element_type=jnp.float32)
                    pass_turn()
                    plgpu.barrier_arrive(k_free.at[s])
                    p, m_new, denom, alpha = _softmax_step(z, m, denom, st, mask)
                else:
                    def mmas(s_ref: Any, o_ref: Any) -> Any:
                        o_ref[...] = acc
                        plgpu.wgmma(s_ref, q_smem, k_tile(s).transpose((1, 0)))
                        plgpu.wgmma(o_ref, p_prev, kv_smem.at[pv_tile])
                        pass_turn()  # the other consumer issues while this one runs its softmax
                        z = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)  # S_t done; P·V may still run
                        plgpu.barrier_arrive(k_free.at[s])
                        p_t, *rest = lax.optimization_barrier(_softmax_step(z, m, denom, st, mask))
                        # P_t goes to the registers of P_{t-1} only once the P·V MMA reading them is done
                        # (ptxas serialises every wgmma when registers a wgmma reads are written in flight).
                        return (*lax.optimization_barrier((o_ref[...], p_t)), *rest)

                    acc, p, m_new, denom, alpha = pl.run_scoped(
                        mmas, plgpu.ACC((bw, st.bk), jnp.float32), plgpu.ACC((bw, st.dv), jnp.float32))
                pl.when(later)(lambda: plgpu.barrier_arrive(v_free.at[prev]))
                return _scale_rows(acc, alpha), m_new, denom, p.astype(st.dtype)

            def last_pv(carry: Any) -> Any:
                """The overlapped loop's tail: ``O = A + P_last·V_last`` (one turn, like a step)."""
                acc, m, denom, p_prev = carry
                nonempty = w_lo < w_hi
                last = slot(w_hi - 1)
                _when(nonempty, lambda: plgpu.barrier_wait(v_ready.at[last]))
                my_turn()

                def pv(a: Any) -> Any:
                    if st.interpret:
                        return a + jnp.dot(p_prev, v_value(last), preferred_element_type=jnp.float32)

                    def mma(acc_ref: Any) -> None:
                        plgpu.wgmma(acc_ref, p_prev, v_tile(last))

                    return pl.run_state(mma)(plgpu.ACC.init(a))

                acc = _cond(nonempty, pv, lambda a: a, acc)
                pass_turn()
                _when(nonempty, lambda: plgpu.barrier_arrive(v_free.at[last]))
                return acc, m, denom

            def skip(t: Any, carry: Any) -> Any:
                """A block of the CTA's range that these rows cannot see: keep the barriers in step."""
                s = slot(t)
                plgpu.barrier_wait(k_ready.at[s])
                plgpu.barrier_arrive(k_free.at[s])
                issue_begin()
                plgpu.barrier_wait(v_ready.at[s])
                plgpu.barrier_arrive(v_free.at[s])
                issue_end()
                return carry

            rows = plgpu.Layout.WGMMA.reduce(1)
            carry = (
                _cast(jnp.zeros((bw, st.dv), jnp.float32), plgpu.Layout.WGMMA, st),
                # With a sink the running max starts at it: the sink's term of the denominator is then
                # e^(sink - m) at the end, with no rescaling (the rows' statistics stay in base 2).
                _cast(jnp.full((bw,), -jnp.inf if sink is None else sink, jnp.float32), rows, st),
                _cast(jnp.zeros((bw,), jnp.float32), rows, st),
            )
            body = overlapped_step if st.overlap else step
            masked = functools.partial(body, masked=True)
            carry = _loop(lo, w_lo, skip, carry)
            if st.overlap:
                carry = (*carry, _cast(jnp.zeros((bw, st.bk), st.dtype), plgpu.Layout.WGMMA, st))
            carry = _loop(w_lo, w_lo_full, masked, carry)
            carry = _loop(w_lo_full, w_hi_full, functools.partial(body, masked=False), carry)
            carry = _loop(w_hi_full, w_hi, masked, carry)
            if st.overlap:
                carry = last_pv(carry)
            acc, m, denom = _loop(w_hi, hi, skip, carry)

            empty = denom == 0.0  # the row saw no key (its output is zeros, its lse +inf)
            if st.sinks:
                denom = denom + jnp.exp2(sink - m)
            safe = jnp.where(empty, 1.0, denom)
            weight = 1.0 / safe
            acc = acc * lax.broadcast_in_dim(weight, acc.shape, [0])
            o_smem = q_smem if st.dv == st.d else q_smem.at[:, pl.ds(0, st.dv)]
            o_smem[...] = acc.astype(st.dtype)  # Q's tile holds the output (every Q·Kᵀ MMA is done)
            lse_smem[...] = jnp.where(empty, jnp.inf, m + jnp.log(safe) * (1.0 / math.log(2.0)))
            plgpu.commit_smem()
            if st.dv == st.d:
                plgpu.copy_smem_to_gmem(q_smem, out_ref.at[batch, pl.ds(r0, bw), head])
            else:  # contiguous 8-row bands of the output's columns
                for band in range(0, bw, 8):
                    plgpu.copy_smem_to_gmem(o_smem.at[pl.ds(band, 8)], out_ref.at[batch, pl.ds(r0 + band, 8), head])
            plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[batch, head, pl.ds(r0, bw)])
            return next_carry(base + (hi - lo), ahead)

        load_q(jnp.int32(0), 0)
        # The MMA turns and meets run on across items: the first turn is the first consumer's (the last
        # passes it); in the ping-pong the second consumer starts half a step behind.
        if st.overlap:
            _when(wg == consumers - 1, lambda: plgpu.barrier_arrive(turn.at[0]))
        else:
            _when(wg == 1, sync)
        _items_loop(mine, run_item, st, first_carry(True))
        # One meet (ping-pong: the second consumer's extra one) or turn pass (the last consumer's) is
        # left over: the first consumer observes it, so every barrier phase is awaited.
        _when(wg == 0, my_turn if st.overlap else sync)
        plgpu.wait_smem_to_gmem(0)

    def producer() -> None:
        plgpu.set_max_registers(_REGS[consumers][1], action="decrease")

        def stream_item(j: Any, carry: Any) -> Any:
            batch, head, _ = item_of(j)
            kv_head = lax.div(head, jnp.array(st.group, head.dtype))
            base, ahead, (lo, hi) = item_bounds(j, carry, of_consumer=False)

            def load(t: Any, *, reused: bool) -> None:  # the ring's (base + t - lo)-th block
                n = base + t - lo
                s = lax.rem(n, jnp.array(st.steps, jnp.int32))
                block = (batch, pl.ds(t * st.bk, st.bk), kv_head)
                if reused:  # the slot's last block has been released by every consumer
                    plgpu.barrier_wait(k_free.at[s])
                plgpu.copy_gmem_to_smem(k_ref.at[block], k_tile(s), k_ready.at[s])
                if reused:
                    plgpu.barrier_wait(v_free.at[s])
                plgpu.copy_gmem_to_smem(v_ref.at[block], v_tile(s), v_ready.at[s])

            def refill(t: Any, carry: Any) -> Any:
                load(t, reused=True)
                return carry

            def fill(t: Any, carry: Any) -> Any:  # the ring's first `steps` blocks go to empty slots
                load(t, reused=False)
                return carry

            split = jnp.clip(lo + st.steps - base, lo, hi)
            _loop(lo, split, fill, 0)
            _loop(split, hi, refill, 0)
            return next_carry(base + (hi - lo), ahead)

        streamed = _items_loop(mine, stream_item, st, first_carry(False))
        streamed = streamed[0] if st.segments else streamed

        def drain(n: Any, carry: Any) -> Any:  # observe the last blocks' releases (every phase is awaited)
            s = lax.rem(n, jnp.array(st.steps, jnp.int32))
            plgpu.barrier_wait(k_free.at[s])
            plgpu.barrier_wait(v_free.at[s])
            return carry

        lax.fori_loop(jnp.maximum(streamed - st.steps, 0), streamed, drain, 0)

    _when(wg < consumers, consumer)
    _when(wg == consumers, producer)


def _entry(*refs: Any, st: _Static) -> None:
    pl, plgpu = _mods()
    q_ref, k_ref, v_ref, *rest = refs
    sink_ref = rest.pop(0) if st.sinks else None
    # The key ids only when the kernel reads them (not with key ranges: their computation is then dead code).
    seg_refs = (rest.pop(0), rest.pop(0) if st.key_ids else None, rest.pop(0)) if st.segments else None
    out_ref, lse_ref = rest
    consumers = st.bq // _ROWS
    transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    # The query rows' ids (and offsets), or their visible keys' bounds, land as Q does.
    segs = (plgpu.SMEM((st.q_buffers, consumers, st.info_rows, _ROWS), jnp.int32),) if st.segments else ()
    smem = (
        plgpu.SMEM((st.q_buffers, consumers, _ROWS, st.d), st.dtype, transforms=transforms),  # Q, then O
        # K and V rings: one of 2 * steps tiles, or two when V is narrower
        plgpu.SMEM((2 * st.steps, st.bk, st.d), st.dtype, transforms=transforms) if st.dv == st.d else
        (plgpu.SMEM((st.steps, st.bk, st.d), st.dtype, transforms=transforms),
         plgpu.SMEM((st.steps, st.bk, st.dv), st.dtype, transforms=transforms)),
        plgpu.SMEM((consumers, _ROWS), jnp.float32),
        *segs,
    )
    ready = (plgpu.Barrier(num_barriers=st.steps), plgpu.Barrier(num_barriers=st.steps),
             plgpu.Barrier(num_barriers=consumers),
             *((plgpu.Barrier(num_barriers=consumers),) if st.segments else ()))
    free = (plgpu.Barrier(num_arrivals=consumers, num_barriers=st.steps),) * 2
    pl.run_scoped(
        lambda *scoped: _kernel(q_ref, k_ref, v_ref, sink_ref, seg_refs, out_ref, lse_ref, scoped, st=st),
        smem, ready, free, plgpu.Barrier(num_arrivals=_CONSUMERS), plgpu.Barrier(num_barriers=consumers),
        collective_axes="wg",
    )


def interpret_params() -> Any:
    """Pallas's Mosaic GPU interpret mode parameters (a private jax module: ``None`` when it is absent)."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:  # pragma: no cover - depends on the jax version
        return None
    return InterpretGPUParams()


def _segment_args(segments: Any, st: _Static, sqp: int, skp: int) -> tuple[Any, ...]:
    """The kernel's segment inputs: the rows' info ``[B, info_rows, Sqp]``, the key ids ``[B, Skp]`` (not with
    ``st.key_ranges``) and the loop bounds (``_segment_blocks``: per CTA of ``bq`` query rows, its 64-row
    consumers' key blocks and their hull, ``[B, Sqp / bq, bq / 64 + 1, 4]``)."""
    mask, consumers = st.mask, st.bq // _ROWS
    q_ids, k_ids, q_off = _segs.pad_segments(segments[:3], sqp, skp)
    if st.key_ranges:  # packed sequences (padded rows: the empty range [0, 0))
        k_lo, k_hi = (jnp.pad(b.astype(jnp.int32), ((0, 0), (0, sqp - mask.sq))) for b in segments[3])
        lo, hi = _segs.visible_bounds(k_lo, k_hi, q_off, mask)
        return jnp.stack([lo, hi], axis=1), _segs.range_block_ranges(lo, hi, mask.sq, st.bk, consumers)
    ranges = _segs.block_ranges(*_segs.block_visibility(q_ids, k_ids, q_off, mask, _ROWS, st.bk), consumers)
    qinfo = jnp.stack([q_ids, *(() if q_off is None else (q_off,))], axis=1).astype(jnp.int32)
    return qinfo, k_ids, ranges


def _forward_impl(q: Any, k: Any, v: Any, *, cfg: MosaicFlashAttentionConfig, causal: bool, softmax_scale: float,
                  sliding_window: tuple[int, int] | None, logits_soft_cap: float | None,
                  interpret: bool, sinks: Any = None, segments: Any = None) -> tuple[Any, Any]:
    """``(out [B, Sq, Hq, D], lse [B, Hq, Sq] float32, base 2)``; ``sinks`` ``[Hq]`` join each row's final
    normalisation in the epilogue (the lse includes them). ``segments``: ``(q_ids [B, Sq], k_ids [B, Sk],
    q_off)`` int, a key visible to a query only when their ids are equal, ``q_off`` ``[B, Sq]`` (or ``None``)
    each row's offset on the key axis for the causal / window test (replacing ``Sk - Sq``); a fourth element
    ``(k_lo, k_hi)`` (``[B, Sq]`` each) gives each row's keys as the range ``[k_lo, k_hi)`` instead, which must
    be exactly the keys whose id is the row's (contiguous keys per id: packed sequences); the ranges then also
    give the key blocks visited."""
    _, plgpu = _mods()
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    bq, bk = cfg.block_q, cfg.block_kv
    if dv != d and cfg.overlap:
        raise ValueError(f"MosaicFlashAttentionConfig: overlap=True needs v's head dim equal to q's ({dv} != {d}); "
                         "use overlap=False")
    if bq // _ROWS > 2 and d > 64:
        raise ValueError(f"MosaicFlashAttentionConfig: block_q={bq} (three consumer warpgroups of {_REGS[3][0]} "
                         f"registers) supports head_dim 64, not {d}; use block_q=128")
    sqp, skp = _cdiv(sq, bq) * bq, _cdiv(sk, bk) * bk
    nq, nk = sqp // bq, skp // bk
    mask = _make_mask(sq, sk, causal, sliding_window, False)
    items = nq * hq * batch
    if not cfg.persistent:
        ctas = items
    elif interpret:
        ctas = min(items, _INTERPRET_CTAS)
    else:
        # One unit a work item beside its key blocks: its Q, softmax tail and store. With segments the blocks are
        # known only at run time: equal costs (one CTA per SM).
        costs = np.ones(nq, np.int64) if segments is not None else _item_blocks(mask, bq, bk, nq, nk) + 1
        ctas = persistent_ctas(_sm_count(), items, costs)
    st = _Static(mask=mask, scale=float(softmax_scale),
                 cap=logits_soft_cap, dtype=jnp.dtype(q.dtype), d=d, dv=dv, bq=bq, bk=bk,
                 steps=min(cfg.max_concurrent_steps, nk), nq=nq, nk=nk, group=hq // hkv,
                 ragged_keys=skp != sk, interpret=interpret, overlap=cfg.overlap, hq=hq, items=items, ctas=ctas,
                 q_buffers=2 if cfg.persistent else 1, sinks=sinks is not None, segments=segments is not None,
                 row_offsets=segments is not None and segments[2] is not None and len(segments) == 3,
                 key_ranges=segments is not None and len(segments) > 3)
    qp, kp, vp = _pad(q, 1, sqp), _pad(k, 1, skp), _pad(v, 1, skp)
    seg_args = () if segments is None else _segment_args(segments, st, sqp, skp)
    # The sinks as base-2 logits.
    extra = () if sinks is None else (sinks.astype(jnp.float32) * (1.0 / math.log(2.0)),)
    kwargs: dict[str, Any] = {}
    if interpret:
        params = interpret_params()
        if params is None:
            raise RuntimeError("this jax has no Mosaic GPU interpret mode; run on a Hopper GPU")
        kwargs["interpret"] = params
    out, lse = plgpu.kernel(
        functools.partial(_entry, st=st),
        out_type=(jax.ShapeDtypeStruct((batch, sqp, hq, dv), q.dtype),
                  jax.ShapeDtypeStruct((batch, hq, sqp), jnp.float32)),
        grid=(ctas,),
        grid_names=("cta",),
        num_threads=cfg.block_q // _ROWS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        **kwargs,
    )(qp, kp, vp, *extra, *seg_args)
    return out[:, :sq], lse[:, :, :sq]


# ----------------------------------------------------------------------------------------------
# The registered functions
# ----------------------------------------------------------------------------------------------


def forward_with_residuals(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    q_segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None,
    bias: jax.Array | None,
    sinks: jax.Array | None = None,
    cfg: MosaicFlashAttentionConfig | None = None,
) -> tuple[jax.Array, tuple[Any, ...]]:
    """The output and the residuals of :data:`RESIDUALS` (those of the Triton-lowered forward).

    ``sinks`` ``[Hq]`` join each row's final normalisation in the kernel's epilogue.

    Returns:
        ``(out, (q, k, v, None, None, None, out, lse))``: ``out`` ``[B, Sq, Hq, D]`` in ``q.dtype``,
        ``lse`` the base-2 log-sum-exp ``[B, Hq, Sq]`` float32 (``+inf`` for rows that see no key),
        the sinks appended when given (the lse then includes them).
    """
    if bias is not None:
        raise ValueError("pallas/gpu:mosaic does not support bias (its capability gate says so)")
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    seg = (q_segment_ids, kv_segment_ids) if has_seg else (None, None)
    batch, sq, hq, _ = q.shape
    extra = () if sinks is None else (sinks,)
    if min(batch, sq, hq, k.shape[1]) == 0:
        out = jnp.zeros((batch, sq, hq, v.shape[3]), q.dtype)
        return out, (q, k, v, *seg, None, out, jnp.full((batch, hq, sq), jnp.inf, jnp.float32), *extra)
    out, lse = _forward_impl(q, k, v, cfg=heuristic_config(q, k, v) if cfg is None else cfg, causal=causal,
                             softmax_scale=softmax_scale, sliding_window=sliding_window,
                             logits_soft_cap=logits_soft_cap, interpret=_env.use_interpreter(), sinks=sinks,
                             segments=(*seg, None) if has_seg else None)
    return out, (q, k, v, *seg, None, out, lse, *extra)


forward = without_residuals(forward_with_residuals)


def _backward(
    residuals: tuple[Any, ...],
    d_out: jax.Array,
    *,
    d_lse: jax.Array | None = None,
    cfg: MosaicFlashAttentionConfig | None = None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
) -> tuple[Any, ...]:
    """Gradients from the shared residuals: the Mosaic GPU backward (fused, or the two deterministic kernels)
    or the Triton-lowered Pallas backward (its heuristic config), as ``cfg.backward`` and ``cfg.deterministic``
    say (see :class:`MosaicFlashAttentionConfig`); ``cfg=None`` takes :func:`heuristic_config` for the call;
    the Triton-lowered one when ``cfg`` is another implementation's config. ``d_lse``: the cotangent of
    ``ejk.flash_attention_lse``'s natural log-sum-exp (the VJP names ``"lse"`` in ``extra_cotangents``).

    Returns:
        ``(dq, dk, dv, None, None, None)``.
    """
    q, k, v, q_seg, kv_seg, _, out, lse = residuals
    segments = None if q_seg is None or kv_seg is None else (q_seg, kv_seg, None)
    if cfg is None:  # no config (``ImplChoice`` without one, or a pairing): this call's heuristic one
        cfg = heuristic_config(q, k, v, causal=causal, sliding_window=sliding_window)
    d, dv, itemsize = int(q.shape[3]), int(v.shape[3]), jnp.dtype(q.dtype).itemsize
    why_not = _mosaic_backward_refusal(cfg, d, itemsize, dv)
    if why_not is not None:
        if isinstance(cfg, MosaicFlashAttentionConfig) and cfg.backward == "mosaic":
            raise ValueError(f"MosaicFlashAttentionConfig.backward='mosaic': {why_not}")
        return _fa._backward(residuals, d_out, d_lse=d_lse, cfg=None, causal=causal, softmax_scale=softmax_scale,
                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap)
    assert isinstance(cfg, MosaicFlashAttentionConfig)
    if min(q.shape[0], q.shape[1], q.shape[2], k.shape[1]) == 0:
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None, None, None
    params = None
    if _env.use_interpreter():
        params = interpret_params()
        if params is None:
            raise RuntimeError("this jax has no Mosaic GPU interpret mode; run on a Hopper GPU")
    dq, dk, dv = _bwd.backward_impl(
        q, k, v, out, lse, d_out, block_q=cfg.bwd_block_q, block_kv=cfg.bwd_block_kv,
        steps=cfg.bwd_max_concurrent_steps, causal=causal, softmax_scale=softmax_scale,
        sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, interpret_params=params, d_lse=d_lse,
        fused=segments is None and fused_backward(cfg, d, itemsize, dv),
        segments=segments)
    return dq, dk, dv, None, None, None


#: The registered backward: :func:`_backward` with the sinks' cotangent appended (from the residuals; the
#: backward kernels need no change, the saved lse includes the sinks).
backward = sinks_backward(_backward)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


#: The Mosaic GPU API the kernel uses (present from jax 0.10 on; checked against 0.10.2 and jax's
#: main branch of 2026-08, the base of 0.11).
_PLGPU_API = ("kernel", "SMEM", "Barrier", "ACC", "TilingTransform", "SwizzleTransform", "CompilerParams",
              "copy_gmem_to_smem", "copy_smem_to_gmem", "wait_smem_to_gmem", "commit_smem", "barrier_arrive",
              "barrier_wait", "wgmma", "layout_cast", "set_max_registers", "Layout")


#: What the Mosaic GPU backward (``backward="mosaic"``) uses on top of :data:`_PLGPU_API`.
_PLGPU_BWD_API = ("load", "Mesh")


def fused_backward(cfg: MosaicFlashAttentionConfig, d: int, itemsize: int = 2, dv: int | None = None) -> bool:
    """Whether the Mosaic backward under ``cfg`` at head dims ``d`` (q / k) and ``dv`` (v, default ``d``) is the
    fused kernel (see :attr:`MosaicFlashAttentionConfig.deterministic`; ``None`` takes the two kernels where the
    fused one's ``bwd_max_concurrent_steps`` slots would not fit in shared memory, for a narrower v, above head
    dim 128, and when XLA is asked for deterministic ops: ``--xla_gpu_deterministic_ops``)."""
    if cfg.deterministic is not None:
        return not cfg.deterministic
    return (d <= 128 and (dv is None or dv == d) and not _xla_deterministic_ops()
            and _bwd.fused_smem_bytes(d, cfg.bwd_max_concurrent_steps, itemsize) <= _SMEM_BUDGET)


def _xla_deterministic_ops() -> bool:
    """Whether ``XLA_FLAGS`` asks XLA's GPU ops to be deterministic (``--xla_gpu_deterministic_ops``, or its
    stricter ``--xla_gpu_exclude_nondeterministic_ops``): then ``deterministic=None`` keeps the same promise."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return any(flag.split("=", 1)[0] in _DETERMINISTIC_FLAGS and flag.split("=", 1)[-1].lower() not in _FALSE
               for flag in flags)


_DETERMINISTIC_FLAGS = ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops")
_FALSE = ("false", "0")


def _mosaic_backward_refusal(cfg: Any, d: int, itemsize: int, dv: int | None = None) -> str | None:
    """Why :func:`backward` does not run the Mosaic GPU backward under ``cfg``, or ``None`` when it does."""
    if not isinstance(cfg, MosaicFlashAttentionConfig) or cfg.backward == "triton_lowered":
        return "the Triton-lowered backward was asked for"
    if dv is not None and dv != d and fused_backward(cfg, d, itemsize, dv):
        return (f"the fused Mosaic GPU backward (deterministic=False) needs v's head dim equal to q's ({dv} != {d}); "
                "use deterministic=True (the two kernels)")
    if cfg.backward == "auto" and _env.use_interpreter():
        return "interpret mode runs the Triton-lowered backward unless backward='mosaic' is asked for"
    need = bwd_smem_bytes(cfg, d, itemsize, dv)
    if need > _SMEM_BUDGET:
        tiles = ("" if fused_backward(cfg, d, itemsize, dv)
                 else f"bwd_block_q={cfg.bwd_block_q}, bwd_block_kv={cfg.bwd_block_kv}, ")
        dims = f"head_dim {d}" if dv is None or dv == d else f"head dims {d} / {dv}"
        return (f"{tiles}bwd_max_concurrent_steps={cfg.bwd_max_concurrent_steps}, deterministic={cfg.deterministic} "
                f"need {need} bytes of shared memory at {dims} (budget "
                f"{_SMEM_BUDGET}); use fewer steps or smaller blocks")
    _, plgpu = _mods()
    missing = [name for name in _PLGPU_BWD_API if not hasattr(plgpu, name)]
    if missing:
        return f"jax {jax.__version__} lacks plgpu.{', plgpu.'.join(missing)}; use backward='triton_lowered'"
    return None


@functools.cache
def _missing_api() -> str | None:
    """Why this jax cannot build the kernel (a Mosaic GPU name it lacks), or ``None``."""
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError as exc:
        return f"mosaic_gpu: jax {jax.__version__} has no Pallas Mosaic GPU backend ({exc})"
    with warnings.catch_warnings():  # a deprecated name warns on access (and is still there)
        warnings.simplefilter("ignore")
        missing = [name for name in _PLGPU_API if not hasattr(plgpu, name)]
    if missing:
        return f"mosaic_gpu: jax {jax.__version__} lacks plgpu.{', plgpu.'.join(missing)}"
    return None


def _compute_capability() -> str:
    return str(getattr(jax.devices()[0], "compute_capability", "") or "")


def capability(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    bias: Any = None,
) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: bfloat16 / float16 q, k, v with one head dim of 64 or 128 for q, k and v, or q / k of 128 or
    192 with a narrower v of 64 or 128 (DeepSeek's prefill, 192 / 128: K and V in rings of their own, no
    overlap, the Mosaic backward's two kernels); any
    lengths (padded to the blocks); GQA / MQA; causal; sliding windows; soft cap; segment ids (key blocks
    whose ids cannot meet a query block's are skipped, forward and backward; the Mosaic backward's two kernels).
    Not supported: bias, float32, other head dims. Needs a Hopper GPU (compute capability 9.0:
    warpgroup MMA), except in interpret mode (``EJK_PALLAS_INTERPRET=1`` on a CPU).
    """
    del causal, softmax_scale, sliding_window, logits_soft_cap
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16 and float16 only)"
    if len(dtypes) > 1:
        return f"q, k, v must share one dtype (got {', '.join(sorted(dtypes))})"
    d, dv = int(q.shape[3]), int(v.shape[3])
    if not _head_dims_supported(d, dv):
        return (f"head dims q/k {d}, v {dv} not supported (mosaic_gpu: 64 or 128 for all three, or q/k "
                f"{' or '.join(map(str, _NARROW_V_HEAD_DIMS[0]))} with a narrower v of "
                f"{' or '.join(map(str, _NARROW_V_HEAD_DIMS[1]))})")
    if bias is not None:
        return "bias not supported by mosaic_gpu"
    return hopper_reason()


def dense_capability(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
                     sliding_window: tuple[int, int] | None = None, logits_soft_cap: float | None = None,
                     q_segment_ids: Any = None, kv_segment_ids: Any = None, bias: Any = None) -> str | None:
    """:func:`capability` for calls without segment ids (``pallas/gpu:mosaic``): segment-id calls go to
    ``pallas/gpu:mosaic_segments``, the same kernels registered apart (rankings order them on their own)."""
    if q_segment_ids is not None:
        return ("segment ids run on pallas/gpu:mosaic_segments (the same kernels; "
                "cfg=ImplChoice('pallas', 'gpu', 'mosaic_segments') forces it)")
    return capability(q, k, v, bias=bias)


def segments_capability(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
                        sliding_window: tuple[int, int] | None = None, logits_soft_cap: float | None = None,
                        q_segment_ids: Any = None, kv_segment_ids: Any = None, bias: Any = None) -> str | None:
    """:func:`capability` for calls with segment ids (``pallas/gpu:mosaic_segments``); a narrower v runs without
    them only."""
    if q_segment_ids is None:
        return "calls without segment ids run on pallas/gpu:mosaic"
    if narrow_v(q, v):
        return "segment ids need v's head dim equal to q's on mosaic_gpu (a narrower v runs without them)"
    return capability(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias)


def narrow_v(q: Any, v: Any) -> bool:
    """Whether a call's v is narrower than q (two rings: see :attr:`_Static.dv`)."""
    return int(v.shape[-1]) != int(q.shape[-1])


def hopper_reason(*api: str) -> str | None:
    """The common tail of the Mosaic GPU kernels' gates: why this jax or machine cannot run them, or ``None``.

    This jax must have the Mosaic GPU names the kernels use (:data:`_PLGPU_API` and ``api``); in interpret
    mode, the Mosaic GPU interpreter; else an NVIDIA Hopper GPU (compute capability 9.0: warpgroup MMA).
    """
    if (missing := _missing_api()) is not None:
        return missing
    _, plgpu = _mods()
    if absent := [name for name in api if not hasattr(plgpu, name)]:
        return f"mosaic_gpu: jax {jax.__version__} lacks plgpu.{', plgpu.'.join(absent)}"
    if _env.use_interpreter():
        return None if interpret_params() is not None else "this jax has no Mosaic GPU interpret mode"
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"mosaic_gpu: needs sm_90 ({why})"
    raw = _compute_capability()
    if raw.split(".")[0] != "9":
        return f"mosaic_gpu: needs sm_90 (found compute capability {raw or 'unknown'})"
    return None


def _head_dims_supported(d: int, dv: int) -> bool:
    return (d == dv and d in _HEAD_DIMS) or (dv < d and d in _NARROW_V_HEAD_DIMS[0]
                                             and dv in _NARROW_V_HEAD_DIMS[1])


def smem_bytes(cfg: MosaicFlashAttentionConfig, d: int, itemsize: int, dv: int | None = None) -> int:
    """Shared memory (bytes) of a config: the Q/O tiles, the K and V rings (V ``dv`` wide, default ``d``) and
    the lse rows."""
    q_tiles = 2 if cfg.persistent else 1
    dv = d if dv is None else dv
    return ((q_tiles * cfg.block_q * d + cfg.max_concurrent_steps * cfg.block_kv * (d + dv)) * itemsize
            + cfg.block_q * 4)


def bwd_smem_bytes(cfg: MosaicFlashAttentionConfig, d: int, itemsize: int, dv: int | None = None) -> int:
    """Shared memory (bytes) of the Mosaic backward's (larger) kernel under ``cfg`` (``_bwd.fused_smem_bytes``,
    or ``_bwd.smem_bytes`` when ``cfg.deterministic``; v ``dv`` wide, default ``d``)."""
    if fused_backward(cfg, d, itemsize, dv):
        return _bwd.fused_smem_bytes(d, cfg.bwd_max_concurrent_steps, itemsize)
    return max(_bwd.smem_bytes(cfg.bwd_block_q, cfg.bwd_max_concurrent_steps, d, itemsize, dv),
               _bwd.smem_bytes(cfg.bwd_block_kv, cfg.bwd_max_concurrent_steps, d, itemsize, dv))


#: Candidates by head dim, the heuristic's choice first: (block_q, block_kv, max_concurrent_steps, overlap,
#: persistent). The overlap holds a second score accumulator and a second ``P`` tile in registers, so it is
#: offered only where ``block_kv`` leaves room for them (at most 192 keys at head dim 64, 128 at 128).
_CANDIDATES: dict[int, tuple[tuple[int, int, int, bool, bool], ...]] = {
    64: ((192, 128, 3, True, True), (128, 128, 2, False, True), (192, 128, 2, True, True), (128, 128, 2, True, True),
         (192, 128, 2, True, False), (128, 128, 2, False, False), (128, 128, 2, True, False),
         (192, 128, 3, True, False), (128, 64, 2, False, False), (128, 128, 3, False, False),
         (128, 192, 2, False, False), (128, 256, 2, False, False)),
    128: ((128, 128, 2, True, True), (128, 128, 2, False, True), (128, 64, 3, True, True), (128, 128, 2, True, False),
          (128, 128, 2, False, False), (128, 64, 2, True, False), (128, 64, 2, False, False),
          (128, 64, 3, False, False), (128, 128, 3, False, False), (128, 192, 2, False, False)),
}


# The config space keeps ``backward="auto"`` (the Mosaic GPU backward on a GPU) with the head dim's
# backward tiles.
#: The Mosaic GPU backward's tiles by q / k head dim, (bwd_block_q, bwd_block_kv), 2 slots: the fastest measured
#: (benchmarks/results/kernel_defaults_h100.md); at 192 (with v 128) the dQ kernel's 128-key steps do not fit.
_BWD_TILES = {64: (128, 128), 128: (64, 128), 192: (64, 64)}


def _fitting(q: Any, v: Any = None) -> list[MosaicFlashAttentionConfig]:
    """The head dim's candidates that fit shared memory; with a narrower ``v`` those of 128 without the overlap
    (it indexes one K / V ring)."""
    d, itemsize = int(q.shape[3]), jnp.dtype(q.dtype).itemsize
    dv = d if v is None else int(v.shape[3])
    head = 64 if d <= 64 else 128
    bq, bk = _BWD_TILES[d]
    configs = [MosaicFlashAttentionConfig(block_q=a, block_kv=b, max_concurrent_steps=c, overlap=o, persistent=p,
                                          bwd_block_q=bq, bwd_block_kv=bk) for a, b, c, o, p in _CANDIDATES[head]
               if dv == d or not o]
    return [c for c in configs if smem_bytes(c, d, itemsize, dv) <= _SMEM_BUDGET]


def config_space(q: Any, k: Any, v: Any, *rest: Any, **__: Any) -> list[MosaicFlashAttentionConfig]:
    """Autotuning candidates by head dim (the heuristic's choice first), pruned by :func:`smem_bytes`.

    One config in interpret mode. Arguments: abstract ``q``, ``k``, ``v`` and the op's others (ignored).
    """
    del k, rest
    if _env.use_interpreter():
        return [heuristic_config(q, q, v)]
    return _fitting(q, v)


def heuristic_config(q: Any, k: Any, v: Any, *rest: Any, **options: Any) -> MosaicFlashAttentionConfig:
    """Persistent CTAs with 128 keys a step (measured: ``benchmarks/results/kernel_defaults_h100.md``):

    * head dim 128: 128 query rows (two consumer warpgroups) with the intra-warpgroup overlap, 2 slots;
    * head dim 64 without a mask: 192 rows (three consumers, the overlap), 3 slots;
    * head dim 64 under a causal mask or a window: 128 rows in the ping-pong, 2 slots (there the three
      consumers' 192-row items balance worse and measured slower).

    128 rows and 64 keys, one CTA per item, when the kv length fits in one block of 64 or in interpret
    mode (fewer interpreted steps wasted on padding). The Mosaic GPU backward's tiles by head dim:
    :data:`_BWD_TILES`."""
    del rest
    if _env.use_interpreter() or int(k.shape[1]) <= 64:
        return MosaicFlashAttentionConfig(block_q=128, block_kv=64, max_concurrent_steps=2)
    configs = _fitting(q, v)
    masked = bool(options.get("causal")) or options.get("sliding_window") is not None
    if int(q.shape[3]) <= 64 and masked:
        return _ping_pong(configs)
    return configs[0]


def _ping_pong(configs: list[MosaicFlashAttentionConfig]) -> MosaicFlashAttentionConfig:
    return next(c for c in configs if c.block_q == 128 and not c.overlap and c.persistent)


def segments_heuristic_config(q: Any, k: Any, v: Any, *rest: Any, **options: Any) -> MosaicFlashAttentionConfig:
    """:func:`heuristic_config` for calls with segment ids (``pallas/gpu:mosaic_segments``): the ping-pong
    (``overlap=False``) at every head dim. The overlap keeps a second accumulator and ``P`` tile in registers;
    with the key ids' column vector beside them on masked blocks its consumers spill, every step paying for it
    (``benchmarks/results/mosaic_segments_varlen_h100.md``, session 8)."""
    cfg = heuristic_config(q, k, v, *rest, **options)
    if _env.use_interpreter() or int(k.shape[1]) <= 64 or not cfg.overlap:
        return cfg
    return _ping_pong(_fitting(q, v))
