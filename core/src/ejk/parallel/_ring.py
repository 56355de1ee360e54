"""``ejk.ring_attention``: sequence-parallel flash attention inside ``shard_map``.

Each device holds a block of queries and a block of keys / values of one sequence sharded along
a mesh axis. Key / value blocks (with their segment ids) travel around the axis with
``lax.ppermute``; at each step every device runs :func:`ejk.flash_attention_lse` — the best
local implementation for the block's shape, chosen (and tuned) by the Executor — on the block it
holds, and merges the partial result into its running output by log-sum-exp.

Masks. Positions are global (see :mod:`ejk.parallel._layout`); causal, window and bottom-right
alignment follow the flash attention contract on the gathered sequence. For each (query piece,
key piece) pair the visible relative offsets form a band ``lo ≤ j - i ≤ hi``; the schedule is
computed statically from the layout, so a pair the mask hides entirely is never computed
(``lax.switch`` picks, per device, a branch without it), a ring step no device needs is never
run nor waited for (the blocks jump over it with one ``ppermute``), and a partially visible pair
becomes one ``flash_attention_lse`` call on the rows / keys that see something, with a window
that reproduces the band.

Backward (``jax.custom_vjp``). The forward saves ``q, k, v``, the output and the global
log-sum-exp ``L``. The backward runs the ring again: key / value blocks travel as before, their
``dk`` / ``dv`` accumulators travel one step behind them, and each device adds its contribution
to the block it holds. A flash backward fed the merged output and ``L`` (instead of the block's
own) gives exactly the block's share of the merged gradient (``P = exp(S - L)``, ``dS = P∘(dP -
rowsum(dout·out) + dL)``), so when the implementation the block's ``flash_attention_lse`` call runs
has a backward on the shared flash residuals (ejk-triton's, ejk-pallas's), the ring calls that
backward directly: no block forward is re-run. Otherwise (an implementation differentiated by
``jax.vjp``, another residual format) the block's VJP runs with cotangents ``w·dout`` for its output
and ``rowsum(w·dout·o_b) - w·delta`` for its log-sum-exp (``w = exp(lse_b - L)``, ``delta =
rowsum(dout·out)``), which re-runs the block's forward.

Overlap: a step's ``ppermute`` of the next key / value block is issued before the step's compute
and does not depend on it, so XLA's scheduler runs the two concurrently. Likewise the
accumulators' ``ppermute`` overlaps the next step's compute: that step computes its share of the
held block's ``dk`` / ``dv`` into zeros and adds the arrived accumulators only afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.ops._base import decide_op
from ejk.ops._check_common import attention_precision, normalize_window
from ejk.ops._flash_attention._check import check_flash_attention_args, check_sinks
from ejk.ops._flash_attention._lse import KERNEL as LSE_KERNEL
from ejk.ops._flash_attention._lse import flash_attention_lse
from ejk.ops._flash_attention._op import flash_attention_call
from ejk.ops._flash_attention._residuals import FLASH_LSE_RESIDUALS
from ejk.ops._matmul._op import DEFAULT_PRECISION
from ejk.parallel._layout import Piece, check_layout, local_pieces
from ejk.parallel._vma import varying_like

__all__ = ["ring_attention", "ring_schedule"]

_OP = "ring_attention"
_BIG = 2**31 - 1  # a window side that covers any block (the op layer clamps it)
_LOG2E = 1.4426950408889634  # natural → base-2 log-sum-exp


@attrs.frozen
class _Block:
    """One visible (query piece, key piece) pair: local rows ``[q0, q1)`` × keys ``[k0, k1)``."""

    q0: int
    q1: int
    k0: int
    k1: int
    window: tuple[int, int] | None


Plan = tuple[_Block, ...]


@attrs.frozen
class _Ring:
    """Everything static about one call (hashable: the custom VJP's ``nondiff_argnums``)."""

    axis_name: Any
    num_shards: int
    layout: str
    q_len: int
    kv_len: int
    causal: bool
    window: tuple[int, int] | None
    scale: float
    cap: float | None
    platform: str
    cfg: Any
    precision: str = "highest"

    def plan(self, device: int, step: int) -> Plan:
        """The visible blocks of ``device`` at ``step`` (it then holds keys of ``device - step``)."""
        source = (device - step) % self.num_shards
        if (source == device and self.causal and self.window is None and self.q_len == self.kv_len
                and _increasing(local_pieces(self.layout, device, self.num_shards, self.q_len))):
            # Its own keys: queries and keys share one increasing map of local to global positions, so the
            # causal mask over the global positions is the causal mask over the local ones: one causal call
            # (zig-zag's two pieces would otherwise take three).
            return (_Block(0, self.q_len, 0, self.kv_len, (_BIG, 0)),)
        offset = self.num_shards * (self.kv_len - self.q_len)  # bottom-right alignment, global
        blocks = []
        for qp in local_pieces(self.layout, device, self.num_shards, self.q_len):
            for kp in local_pieces(self.layout, source, self.num_shards, self.kv_len):
                block = _pair(qp, kp, offset, self.causal, self.window)
                if block is not None:
                    blocks.append(block)
        return _merged(blocks)

    def steps(self) -> tuple[int, ...]:
        """Ring steps at which some device has a visible block."""
        return tuple(t for t in range(self.num_shards) if any(self.plan(d, t) for d in range(self.num_shards)))


def _increasing(pieces: Sequence[Piece]) -> bool:
    """Whether the local rows of ``pieces`` hold increasing global positions."""
    ordered = sorted(pieces, key=lambda piece: piece.offset)
    last = -1
    for piece in ordered:
        if piece.length == 0:
            continue
        if (piece.stride <= 0 and piece.length > 1) or piece.start <= last:
            return False
        last = piece.start + piece.stride * (piece.length - 1)
    return True


def _pair(qp: Piece, kp: Piece, offset: int, causal: bool, window: tuple[int, int] | None) -> _Block | None:
    """The block of one piece pair, or ``None`` when the mask hides it entirely.

    Query row ``i`` of ``qp`` sees key ``j`` of ``kp`` iff ``-L ≤ kpos - (qpos + offset) ≤ R``,
    i.e. ``lo ≤ j - i ≤ hi`` for the band computed here. The call keeps rows ``[qa, qb)`` and keys
    ``[ka, kb)`` (those that see / are seen by something); bottom-right alignment of that call
    puts relative offset ``kb - qb`` at its diagonal, which always lies in the band, so the band
    is the window ``(kb - qb - lo, hi - (kb - qb))``.
    """
    assert qp.stride == kp.stride
    stride, shift = qp.stride, kp.start - qp.start - offset  # kpos - qpos - offset = stride·(j - i) + shift
    left = None if window is None else window[0]
    right = 0 if causal else (None if window is None else window[1])
    lo = None if left is None else -((left + shift) // stride)  # ceil((-left - shift) / stride)
    hi = None if right is None else (right - shift) // stride
    nq, nk = qp.length, kp.length
    if (lo is not None and lo > nk - 1) or (hi is not None and hi < -(nq - 1)) or (
            lo is not None and hi is not None and lo > hi):
        return None
    lo_c = -(nq - 1) if lo is None else max(lo, -(nq - 1))
    hi_c = nk - 1 if hi is None else min(hi, nk - 1)
    if lo_c == -(nq - 1) and hi_c == nk - 1:
        return _Block(qp.offset, qp.offset + nq, kp.offset, kp.offset + nk, None)
    qa, qb = max(0, -hi_c), min(nq, nk - lo_c)
    ka, kb = max(0, lo_c), min(nk, nq + hi_c)
    diagonal = kb - qb
    side_l = _BIG if lo_c == -(nq - 1) else diagonal - lo_c
    side_r = _BIG if hi_c == nk - 1 else hi_c - diagonal
    return _Block(qp.offset + qa, qp.offset + qb, kp.offset + ka, kp.offset + kb, (side_l, side_r))


def _merged(blocks: list[_Block]) -> Plan:
    """Fuse unmasked blocks that share their rows (or keys) and abut: fewer, larger calls.

    Zig-zag steps then run one call per device (e.g. both query halves against one key half).
    """
    blocks = list(blocks)
    fused = True
    while fused:
        fused = False
        for a in blocks:
            for b in blocks:
                if a is b or a.window is not None or b.window is not None:
                    continue
                if (a.q0, a.q1) == (b.q0, b.q1) and a.k1 == b.k0:
                    c = _Block(a.q0, a.q1, a.k0, b.k1, None)
                elif (a.k0, a.k1) == (b.k0, b.k1) and a.q1 == b.q0:
                    c = _Block(a.q0, b.q1, a.k0, a.k1, None)
                else:
                    continue
                blocks = [x for x in blocks if x is not a and x is not b] + [c]
                fused = True
                break
            if fused:
                break
    return tuple(sorted(blocks, key=lambda x: (x.q0, x.k0)))


def ring_schedule(num_shards: int, q_len: int, kv_len: int, *, layout: str = "contiguous", causal: bool = False,
                  sliding_window: tuple[int, int] | None = None) -> list[list[int]]:
    """Work per ring step and device: ``[step][device]`` = number of visible (query, key) pairs.

    ``q_len`` / ``kv_len`` are local lengths, ``sliding_window`` a normalised ``(left, right)``.
    Steps no device needs are left out of the ring. Useful to compare layouts' balance.
    """
    ring = _Ring(axis_name=None, num_shards=num_shards, layout=layout, q_len=q_len, kv_len=kv_len, causal=causal,
                 window=sliding_window, scale=1.0, cap=None, platform="auto", cfg=None)
    work = []
    for step in ring.steps():
        row = []
        for device in range(num_shards):
            pieces = ring.plan(device, step)
            row.append(sum(_visible(b, ring, device, step) for b in pieces))
        work.append(row)
    return work


def _visible(block: _Block, ring: _Ring, device: int, step: int) -> int:
    """Visible (query, key) pairs of a block (ignoring segment ids)."""
    import numpy as np

    from ejk.parallel._layout import layout_positions

    n = ring.num_shards
    qpos = layout_positions(ring.layout, n * ring.q_len, n)[device * ring.q_len:][block.q0:block.q1]
    source = (device - step) % n
    kpos = layout_positions(ring.layout, n * ring.kv_len, n)[source * ring.kv_len:][block.k0:block.k1]
    rel = kpos[None, :] - qpos[:, None] - n * (ring.kv_len - ring.q_len)
    mask = np.ones(rel.shape, bool)
    if ring.causal:
        mask &= rel <= 0
    if ring.window is not None:
        mask &= (rel >= -ring.window[0]) & (rel <= ring.window[1])
    return int(mask.sum())


# ----------------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------------


#: What rings traced now keep: ``(communication, computation)`` (see :func:`ring_ablation`).
_ablation: contextvars.ContextVar[tuple[bool, bool]] = contextvars.ContextVar("ejk_ring_ablation", default=(True, True))


@contextlib.contextmanager
def ring_ablation(*, communication: bool = True, computation: bool = True) -> Iterator[None]:
    """For studying where a ring's time goes: rings traced in this context skip their communication
    (``communication=False``: blocks stay where they are) or replace each step's attention by zeros
    that still read every received block (``computation=False``). The results are wrong on purpose;
    only their timing means something (``benchmarks/bench_ring_attention.py`` uses it)."""
    token = _ablation.set((communication, computation))
    try:
        yield
    finally:
        _ablation.reset(token)


def _shift(ring: _Ring, tree: Any, distance: int) -> Any:
    """Send every leaf ``distance`` devices forward along the ring (device d receives from d - distance)."""
    n = ring.num_shards
    if distance % n == 0 or not _ablation.get()[0]:
        return tree
    perm = [(j, (j + distance) % n) for j in range(n)]
    return jax.tree.map(lambda x: lax.ppermute(x, ring.axis_name, perm), tree)


def _merge(out: jax.Array, lse: jax.Array, o: jax.Array, lse_o: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Merge two partial results ``(out [B,S,H,D] f32, lse [B,H,S])`` by log-sum-exp (``-inf``: empty)."""
    top = jnp.maximum(lse, lse_o)
    safe = jnp.where(jnp.isfinite(top), top, 0.0)
    w1, w2 = jnp.exp(lse - safe), jnp.exp(lse_o - safe)
    total = w1 + w2
    seen = total > 0
    norm = jnp.where(seen, total, 1.0)
    rows = lambda w: jnp.swapaxes(w / norm, 1, 2)[..., None]  # noqa: E731
    merged = rows(w1) * out + rows(w2) * o
    return merged, jnp.where(seen, safe + jnp.log(norm), -jnp.inf)


def _call(ring: _Ring, block: _Block, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any,
          kv_seg: Any) -> tuple[jax.Array, jax.Array]:
    qs, ks, vs = q[:, block.q0:block.q1], k[:, block.k0:block.k1], v[:, block.k0:block.k1]
    segs = {} if q_seg is None else {"q_segment_ids": q_seg[:, block.q0:block.q1],
                                     "kv_segment_ids": kv_seg[:, block.k0:block.k1]}
    return flash_attention_lse(qs, ks, vs, softmax_scale=ring.scale, sliding_window=block.window,
                               logits_soft_cap=ring.cap, precision=ring.precision, platform=ring.platform,
                               cfg=ring.cfg, **segs)


def _fwd_plan(ring: _Ring, plan: Plan, out: jax.Array, lse: jax.Array, q: jax.Array, q_seg: Any, k: jax.Array,
              v: jax.Array, kv_seg: Any) -> tuple[jax.Array, jax.Array]:
    """``(out f32, lse)`` with the local queries' blocks against the held key block merged in, each into
    its own rows only (updated in place: no full-size temporaries per block)."""
    for block in plan:
        o, lse_o = _call(ring, block, q, k, v, q_seg, kv_seg)
        rows = slice(block.q0, block.q1)
        merged, merged_lse = _merge(out[:, rows], lse[:, :, rows], o.astype(jnp.float32), lse_o)
        out = lax.dynamic_update_slice_in_dim(out, merged, block.q0, axis=1)
        lse = lax.dynamic_update_slice_in_dim(lse, merged_lse, block.q0, axis=2)
    return varying_like((out, lse), q, k, v)


def _bwd_plan(ring: _Ring, plan: Plan, dq: jax.Array, dk: jax.Array, dv: jax.Array, q: jax.Array, q_seg: Any,
              out: jax.Array, lse: jax.Array, d_out: jax.Array, d_lse: jax.Array, delta: jax.Array, k: jax.Array,
              v: jax.Array, kv_seg: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The float32 ``(dq, dk, dv)`` (``dk`` / ``dv`` of the held block) with this step's contributions added,
    each block's into its own rows only (in place)."""
    for block in plan:
        rows = slice(block.q0, block.q1)
        keys = slice(block.k0, block.k1)
        segs = (None, None) if q_seg is None else (q_seg[:, rows], kv_seg[:, keys])
        q_b, k_b, v_b = q[:, rows], k[:, keys], v[:, keys]
        backward = _residual_backward(ring, block.window, segs[0], segs[1], q_b, k_b, v_b)
        if backward is not None:  # the block's backward kernel on the merged out / lse: no forward re-run
            lse_rows = lse[:, :, rows]
            lse2 = jnp.where(lse_rows == -jnp.inf, jnp.inf, lse_rows * _LOG2E)
            residuals = (q_b, k_b, v_b, *segs, None, out[:, rows].astype(q.dtype), lse2)
            dq_b, dk_b, dv_b = backward(residuals, (d_out[:, rows].astype(q.dtype), d_lse[:, :, rows]))[:3]
        else:
            dq_b, dk_b, dv_b = _recomputed_grads(ring, block, segs, q_b, k_b, v_b, lse[:, :, rows],
                                                 d_out[:, rows], delta[:, :, rows])
        dq = _add_rows(dq, dq_b, block.q0)
        dk = _add_rows(dk, dk_b, block.k0)
        dv = _add_rows(dv, dv_b, block.k0)
    return varying_like((dq, dk, dv), q, k, v, d_out)


def _residual_backward(ring: _Ring, window: tuple[int, int] | None, q_seg: Any, kv_seg: Any, q: jax.Array,
                       k: jax.Array, v: jax.Array) -> Callable[[Any, Any], tuple[Any, ...]] | None:
    """The backward of the implementation the block's ``flash_attention_lse`` call runs, fed residuals in
    the shared flash format (``None`` when that backward takes none: then the block's VJP is used)."""
    arrays, static = flash_attention_call(q, k, v, softmax_scale=ring.scale, sliding_window=window,
                                          logits_soft_cap=ring.cap, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
                                          precision=ring.precision)
    choice, platform = decide_op(LSE_KERNEL, arrays, static, ring.platform, ring.cfg)
    return LSE_KERNEL.residual_backward(arrays, static, choice, FLASH_LSE_RESIDUALS, platform)


def _recomputed_grads(ring: _Ring, block: _Block, segs: tuple[Any, Any], q: jax.Array, k: jax.Array, v: jax.Array,
                      total: jax.Array, d_out: jax.Array, delta: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A block's gradients through its own VJP (its forward re-run): cotangents ``w·dout`` for its output and
    ``rowsum(w·dout·o_b) − w·delta`` for its lse, ``w = exp(lse_b − L)``."""
    fn = partial(_block_fn, ring, block.window, *segs)
    (o_b, lse_b), vjp = jax.vjp(fn, q, k, v)
    w = jnp.where(lse_b == -jnp.inf, 0.0, jnp.exp(lse_b - jnp.where(jnp.isfinite(total), total, 0.0)))
    g_out = (jnp.swapaxes(w, 1, 2)[..., None] * d_out.astype(jnp.float32)).astype(o_b.dtype)
    dot = jnp.swapaxes(jnp.sum(g_out.astype(jnp.float32) * o_b.astype(jnp.float32), axis=-1), 1, 2)
    dq, dk, dv = vjp((g_out, dot - w * delta))
    return dq, dk, dv


def _add_rows(total: jax.Array, part: jax.Array, start: int) -> jax.Array:
    """``total`` (float32) with ``part`` added to its rows ``start:start + len`` along axis 1, in place.

    A slice update rather than ``x.at[:, a:b].add``: no scatter (and no empty scatter-index constant,
    which jax 0.11.2's Shardy pass crashed on when it entered a ``shard_map`` body on GPUs).
    """
    rows = lax.slice_in_dim(total, start, start + part.shape[1], axis=1)
    return lax.dynamic_update_slice_in_dim(total, rows + part.astype(jnp.float32), start, axis=1)


def _block_fn(ring: _Ring, window: tuple[int, int] | None, q_seg: Any, kv_seg: Any, q: jax.Array, k: jax.Array,
              v: jax.Array) -> tuple[jax.Array, jax.Array]:
    segs = {} if q_seg is None else {"q_segment_ids": q_seg, "kv_segment_ids": kv_seg}
    return flash_attention_lse(q, k, v, softmax_scale=ring.scale, sliding_window=window, logits_soft_cap=ring.cap,
                               precision=ring.precision, platform=ring.platform, cfg=ring.cfg, **segs)


def _dispatch(ring: _Ring, step: int, branch: Callable[..., Any], operands: Sequence[Any]) -> Any:
    """Run ``branch(plan, *operands)`` with this device's plan for ``step`` (a ``lax.switch`` when devices differ)."""
    if not _ablation.get()[1]:  # zeros shaped like the result that still read every block (no DCE)
        shapes = jax.eval_shape(partial(branch, ring.plan(0, step)), *operands)
        touch = sum((jnp.nan_to_num(x[(0,) * x.ndim].astype(jnp.float32)) for x in jax.tree.leaves(operands)
                     if x.size),
                    jnp.zeros((), jnp.float32))
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype) + (touch * 0).astype(s.dtype), shapes)
    plans = [ring.plan(d, step) for d in range(ring.num_shards)]
    distinct = list(dict.fromkeys(plans))
    if len(distinct) == 1:
        return branch(distinct[0], *operands)
    table = jnp.asarray([distinct.index(p) for p in plans], jnp.int32)
    index = table[lax.axis_index(ring.axis_name)]
    return lax.switch(index, [partial(branch, p) for p in distinct], *operands)


# ----------------------------------------------------------------------------------------------
# The ring, forward and backward
# ----------------------------------------------------------------------------------------------


def _forward(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any,
             kv_seg: Any, out_dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """The merged ``(out, lse)`` of every visible block (``out`` in ``out_dtype``, default ``q.dtype``)."""
    out_dtype = q.dtype if out_dtype is None else out_dtype
    batch, rows, heads = q.shape[:3]
    out, lse = varying_like((jnp.zeros((batch, rows, heads, v.shape[3]), jnp.float32),
                             jnp.full((batch, heads, rows), -jnp.inf, jnp.float32)), q, k, v)
    steps = ring.steps()
    if not steps:
        return out.astype(out_dtype), lse
    held = _shift(ring, (k, v, kv_seg), steps[0])
    for index, step in enumerate(steps):
        following = _shift(ring, held, steps[index + 1] - step) if index + 1 < len(steps) else None
        out, lse = _dispatch(ring, step, partial(_fwd_plan, ring), (out, lse, q, q_seg, *held))
        held = following
    return out.astype(out_dtype), lse


def _ring_out(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any, kv_seg: Any) -> jax.Array:
    return _forward(ring, q, k, v, q_seg, kv_seg)[0]


def _ring_fwd(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any,
              kv_seg: Any) -> tuple[jax.Array, tuple[Any, ...]]:
    out, lse = _forward(ring, q, k, v, q_seg, kv_seg)
    return out, (q, k, v, q_seg, kv_seg, out, lse)


def _ring_bwd(ring: _Ring, residuals: tuple[Any, ...], d_out: jax.Array, d_lse: Any = None) -> tuple[Any, ...]:
    q, k, v, q_seg, kv_seg, out, lse = residuals
    # The merged lse's cotangent: each block's lse gets w·d_lse (rows that see nothing: none).
    d_lse = jnp.zeros(lse.shape, jnp.float32) if d_lse is None else jnp.where(lse == -jnp.inf, 0.0, d_lse)
    delta = jnp.swapaxes(jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1), 1, 2) - d_lse
    dq = varying_like(jnp.zeros(q.shape, jnp.float32), q, k, v, d_out)
    steps = ring.steps()
    if not steps:
        return dq.astype(q.dtype), jnp.zeros_like(k), jnp.zeros_like(v), None, None
    held = _shift(ring, (k, v, kv_seg), steps[0])
    # dk, dv of the held block: they travel with it, one step behind. Each step computes this device's
    # share into zeros and adds the share that arrived only afterwards, so the step's compute does not wait
    # for the accumulators' transfer: it overlaps them, as it overlaps the next block's.
    zeros = varying_like((jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)), q, k, v, d_out)
    grads: tuple[jax.Array, ...] = zeros
    for index, step in enumerate(steps):
        last = index + 1 == len(steps)
        distance = 0 if last else steps[index + 1] - step
        following = None if last else _shift(ring, held, distance)
        dq, *share = _dispatch(ring, step, partial(_bwd_plan, ring),
                               (dq, *zeros, q, q_seg, out, lse, d_out, d_lse, delta, *held))
        grads = tuple(g + s for g, s in zip(grads, share, strict=True)) if index else tuple(share)
        if not last:
            grads = _shift(ring, grads, distance)
        held = following
    # Home: the block of device d - last step sits on d. The sums are final, so they travel in the
    # inputs' dtype (half the bytes of float32 for bf16): this last transfer has no compute to hide behind.
    dk, dv = _shift(ring, (grads[0].astype(k.dtype), grads[1].astype(v.dtype)), -steps[-1])
    return dq.astype(q.dtype), dk, dv, None, None


_ring = jax.custom_vjp(_ring_out, nondiff_argnums=(0,))
_ring.defvjp(_ring_fwd, _ring_bwd)


def _ring_lse_out(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any,
                  kv_seg: Any) -> tuple[jax.Array, jax.Array]:
    return _forward(ring, q, k, v, q_seg, kv_seg, jnp.float32)


def _ring_lse_fwd(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, q_seg: Any,
                  kv_seg: Any) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    out, lse = _forward(ring, q, k, v, q_seg, kv_seg, jnp.float32)
    return (out, lse), (q, k, v, q_seg, kv_seg, out, lse)


def _ring_lse_bwd(ring: _Ring, residuals: tuple[Any, ...], cotangents: tuple[jax.Array, jax.Array]) -> tuple[Any, ...]:
    d_out, d_lse = cotangents
    return _ring_bwd(ring, residuals, d_out, d_lse)


#: The ring's float32 output and merged lse, both differentiable: what sinks are applied to, once.
_ring_lse = jax.custom_vjp(_ring_lse_out, nondiff_argnums=(0,))
_ring_lse.defvjp(_ring_lse_fwd, _ring_lse_bwd)


def _apply_sinks(out: jax.Array, lse: jax.Array, sinks: jax.Array) -> jax.Array:
    """Each row of the merged float32 ``out`` scaled by ``e^lse / (e^lse + e^sink)`` (rows that see no key,
    ``lse = -inf``, stay zeros and give no gradient): the sink counted once, after the blocks are merged."""
    seen = lse != -jnp.inf
    sink = sinks.astype(jnp.float32)[None, :, None]
    factor = jnp.where(seen, jax.nn.sigmoid(jnp.where(seen, lse, 0.0) - sink), 0.0)
    return out * jnp.swapaxes(factor, 1, 2)[..., None]


def ring_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    axis_name: Any,
    causal: bool = False,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    softmax_scale: float | None = None,
    sinks: jax.Array | None = None,
    precision: Any = DEFAULT_PRECISION,
    layout: str = "contiguous",
    platform: str = "auto",
    cfg: Any = None,
) -> jax.Array:
    """Sequence-parallel :func:`ejk.flash_attention`, called inside ``shard_map``.

    ``q``, ``k``, ``v`` (and segment ids) are this device's blocks of sequences sharded along
    mesh axis ``axis_name``; the result is this device's block of
    ``flash_attention(gathered q, gathered k, gathered v, ...)``, forward and gradients.
    Masks apply to global positions (bottom-right aligned, as in ``flash_attention``).

    Args:
        q: ``[B, Sq/n, Hq, D]``: local queries.
        k: ``[B, Sk/n, Hkv, D]``: local keys (they travel around the ring).
        v: ``[B, Sk/n, Hkv, Dv]``.
        axis_name: The mesh axis the sequence is sharded along (of size ``n``).
        causal, sliding_window, logits_soft_cap, softmax_scale: As for ``flash_attention``, on
            the gathered sequence (window sides are clamped to the global lengths).
        q_segment_ids: ``[B, Sq/n]`` local ids; with ``kv_segment_ids`` ``[B, Sk/n]``.
        sinks: ``[Hq]`` attention-sink logits, as for ``flash_attention`` (replicated: every device
            holds all of them). The blocks are merged without them and the sink enters each row's
            denominator once; differentiable (the cotangent is this device's part of the sum:
            ``shard_map`` sums it over the axis when ``sinks`` is replicated).
        precision: As for ``flash_attention`` (default ``"highest"``), for every local block.
        layout: Which positions a local block holds: ``"contiguous"`` (device ``i`` holds rows
            ``i·S/n … (i+1)·S/n - 1``), ``"zigzag"`` or ``"striped"`` (balanced causal work; see
            :func:`ejk.parallel.to_layout` to permute a sequence into them).
        platform: ``"auto"`` or a platform to force for the local blocks.
        cfg: An explicit config for every local ``flash_attention_lse`` call.

    Returns:
        ``[B, Sq/n, Hq, Dv]`` in ``q.dtype``: the local block of the output, in the same layout.

    Raises:
        ValueError: for bad arguments (naming the argument), or when called outside ``shard_map``
            / with an axis name that is not bound.
    """
    scale, _ = check_flash_attention_args(q, k, v, causal=bool(causal), softmax_scale=softmax_scale,
                                          sliding_window=None, logits_soft_cap=logits_soft_cap,
                                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=None)
    check_sinks(_OP, sinks, int(q.shape[2]))
    precision_name = attention_precision(_OP, precision, q.dtype)
    try:
        num_shards = int(lax.axis_size(axis_name))
    except (NameError, KeyError, ValueError) as exc:
        raise ValueError(f"{_OP}: axis_name {axis_name!r} is not a bound mesh axis; call ring_attention inside "
                         f"jax.shard_map over a mesh with that axis ({exc})") from None
    q_len, kv_len = int(q.shape[1]), int(k.shape[1])
    if q_len == 0 or kv_len == 0:
        raise ValueError(f"{_OP}: local q and k need at least one row each, got {q_len} and {kv_len}")
    check_layout(layout, q_len, name="q")
    check_layout(layout, kv_len, name="k")
    window = normalize_window(_OP, "sliding_window", sliding_window, causal=bool(causal),
                              max_left=num_shards * kv_len - 1, max_right=num_shards * q_len - 1)
    ring = _Ring(axis_name=axis_name, num_shards=num_shards, layout=layout, q_len=q_len, kv_len=kv_len,
                 causal=bool(causal), window=window, scale=scale,
                 cap=None if logits_soft_cap is None else float(logits_soft_cap), platform=platform, cfg=cfg,
                 precision=precision_name)
    if q_segment_ids is None or kv_segment_ids is None:
        q_segment_ids = kv_segment_ids = None
    if sinks is not None:
        merged, lse = _ring_lse(ring, q, k, v, q_segment_ids, kv_segment_ids)
        return _apply_sinks(merged, lse, sinks).astype(q.dtype)
    out: jax.Array = _ring(ring, q, k, v, q_segment_ids, kv_segment_ids)
    return out
