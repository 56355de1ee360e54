"""Flash attention as Pallas kernels for NVIDIA GPUs (Triton lowering), forward and backward.

FlashAttention-2 structure, written with ``pl.pallas_call`` and GPU-style ``BlockSpec`` grids:

* forward: one program per (query block, batch, q head) keeps an online softmax in float32
  (``exp2`` with ``log2(e)`` folded into the logit scale) and saves the base-2 log-sum-exp;
* backward: ``delta = rowsum(d_out · out)`` (a small XLA fusion), then a dk/dv kernel (one
  program per key block and kv head, looping over the q heads of its group: GQA without
  repeating k / v in memory, no atomics) and a dq kernel (one program per query block and
  q head), both reusing the saved output and log-sum-exp.

Causal masks and sliding windows bound every loop, so blocks that are fully masked are never
loaded, and each loop is split into the blocks that need a position mask (the diagonal / window
edges, the ragged end) and the interior blocks that do not. Rows that see no key give zeros
(log-sum-exp ``+inf``) and zero gradients. A bias broadcastable to ``[B, Hq, Sq, Sk]`` is read
through broadcast block specs (never expanded); its gradient comes
from a fourth kernel that writes ``dS`` as a float32 ``[B, Hq, Sq, Sk]`` buffer, summed over the
bias's broadcast dims (XLA can drop that kernel when the bias needs no gradient). Sequence lengths
are padded to the block sizes and head dims to a power of two >= 16 (only when needed; padded
keys are masked, padded rows discarded). The plugin registers :func:`forward` with the pair
:func:`forward_with_residuals` /
:func:`backward` (:data:`RESIDUALS` names their format), from which the core builds the
custom VJP, plus :func:`config_space`, :func:`heuristic_config` and :func:`capability`.

On a CPU, with ``EJK_PALLAS_INTERPRET=1``, the same kernels run through Pallas's interpret mode.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.config.validators import int_in, one_of, power_of_two
from ejk.devices import smem_per_block as _smem_limit
from ejk.ops import FLASH_RESIDUALS, sinks_backward, without_residuals
from ejk.tiling import cdiv as _cdiv
from ejk.tiling import fit_block as _fit
from ejk.tiling import padded_dim as _pad_dim
from ejk_pallas import _env

__all__ = [
    "RESIDUALS",
    "FlashAttentionConfig",
    "backward",
    "capability",
    "config_space",
    "forward",
    "forward_with_residuals",
    "heuristic_config",
]

#: The residual format of :func:`forward_with_residuals`: inputs, output and base-2 log-sum-exp.
RESIDUALS = FLASH_RESIDUALS

_LOG2E = math.log2(math.e)
_MAX_HEAD_DIM = 256
_DTYPES = ("bfloat16", "float16")







_block = power_of_two(16)
_warps = one_of(1, 2, 4, 8, 16)
_stages = int_in(1, 8)


@attrs.frozen(kw_only=True)
class FlashAttentionConfig:
    """Tile sizes and launch parameters of the Pallas (Triton-lowered) flash attention.

    Blocks are clamped to the (power-of-two rounded) sequence lengths, never below 16.

    Attributes:
        block_q: Forward: query rows per program.
        block_k: Forward: keys per inner-loop step.
        num_warps: Forward: warps per program.
        num_stages: Forward: software-pipelining stages of the key loop.
        bwd_block_q: Backward: query rows per step of the dk/dv kernel (and keys per step of the dq kernel).
        bwd_block_k: Backward: keys per program of the dk/dv kernel (and query rows per program of the dq kernel).
        bwd_num_warps: Backward: warps per program.
        bwd_num_stages: Backward: pipelining stages.
    """

    block_q: int = attrs.field(validator=_block)
    block_k: int = attrs.field(validator=_block)
    num_warps: int = attrs.field(default=4, validator=_warps)
    num_stages: int = attrs.field(default=2, validator=_stages)
    bwd_block_q: int = attrs.field(default=32, validator=_block)
    bwd_block_k: int = attrs.field(default=64, validator=_block)
    bwd_num_warps: int = attrs.field(default=4, validator=_warps)
    bwd_num_stages: int = attrs.field(default=2, validator=_stages)


# ----------------------------------------------------------------------------------------------
# Shapes and masks
# ----------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Mask:
    """Static description of which keys a query sees (bottom-right aligned, see KERNEL_CONTRACT.md).

    Query ``i`` sees key ``j`` iff ``j < sk``, ``j <= i + offset + right`` (when ``right`` is not
    ``None``), ``j >= i + offset - left`` (when ``left`` is not ``None``) and, with segments,
    ``q_seg[i] == kv_seg[j]``.
    """

    sq: int
    sk: int
    left: int | None
    right: int | None
    segments: bool

    @property
    def offset(self) -> int:
        return self.sk - self.sq

    def visible(self, rows: Any, cols: Any, q_seg: Any = None, kv_seg: Any = None, *,
                check_cols: bool = True) -> Any:
        """Boolean ``[len(rows), len(cols)]`` visibility from row / column position vectors."""
        i, j = rows[:, None], cols[None, :]
        conds = []
        if check_cols:
            conds.append(j < self.sk)
        if self.right is not None:
            conds.append(j <= i + (self.offset + self.right))
        if self.left is not None:
            conds.append(j >= i + (self.offset - self.left))
        if self.segments:
            conds.append(q_seg[:, None] == kv_seg[None, :])
        if not conds:
            return None
        return functools.reduce(jnp.logical_and, conds)


def _make_mask(q_len: int, kv_len: int, causal: bool, sliding_window: tuple[int, int] | None,
               segments: bool) -> _Mask:
    left = right = None
    if sliding_window is not None:
        left, right = int(sliding_window[0]), int(sliding_window[1])
    if causal:
        right = 0
    return _Mask(sq=q_len, sk=kv_len, left=left, right=right, segments=segments)


def _floor_div(x: Any, d: int, shift: int) -> Any:
    """``floor(x / d)`` for an int32 scalar ``x >= -shift`` (``lax.div`` truncates toward zero)."""
    m = _cdiv(shift, d) + 1
    return lax.div(x + m * d, d) - m


def _key_blocks(mask: _Mask, row0: Any, rows: int, bk: int, nk: int) -> tuple[Any, Any, Any, Any]:
    """For query rows ``[row0, row0 + rows)``: key blocks ``lo <= lo_full <= hi_full <= hi``.

    Blocks in ``[lo, hi)`` hold every visible key; those in ``[lo_full, hi_full)`` need no mask.
    """
    row1 = row0 + (rows - 1)
    shift = mask.sq + mask.sk + 2 * bk
    off = mask.offset
    hi: Any = nk
    lo: Any = 0
    hi_full: Any = min(nk, mask.sk // bk)
    lo_full: Any = 0
    if mask.right is not None:
        hi = jnp.clip(_floor_div(row1 + (off + mask.right), bk, shift) + 1, 0, nk)
        hi_full = jnp.minimum(hi_full, _floor_div(row0 + (off + mask.right + 1), bk, shift))
    if mask.left is not None:
        lo = jnp.clip(_floor_div(row0 + (off - mask.left), bk, shift), 0, nk)
        lo_full = _floor_div(row1 + (off - mask.left + bk - 1), bk, shift)
    if mask.right is None and mask.left is None:
        return lo, lo, hi_full, hi
    lo_full = jnp.minimum(jnp.maximum(lo_full, lo), hi)
    hi_full = jnp.maximum(jnp.minimum(hi_full, hi), lo_full)
    return lo, lo_full, hi_full, hi


def _query_blocks(mask: _Mask, col0: Any, cols: int, bq: int, nq: int) -> tuple[Any, Any, Any, Any]:
    """For keys ``[col0, col0 + cols)``: query blocks ``lo <= lo_full <= hi_full <= hi`` (see :func:`_key_blocks`).

    Keys past ``sk`` are not checked here: their dk / dv are discarded.
    """
    col1 = col0 + (cols - 1)
    shift = mask.sq + mask.sk + 2 * bq
    off = mask.offset
    lo: Any = 0
    hi: Any = nq
    lo_full: Any = 0
    hi_full: Any = nq
    if mask.right is not None:  # i >= j - off - right
        lo = jnp.clip(_floor_div(col0 - (off + mask.right), bq, shift), 0, nq)
        lo_full = _floor_div(col1 - (off + mask.right) + bq - 1, bq, shift)
    if mask.left is not None:  # i <= j - off + left
        hi = jnp.clip(_floor_div(col1 + (mask.left - off), bq, shift) + 1, 0, nq)
        hi_full = _floor_div(col0 + (mask.left - off + 1), bq, shift)
    if mask.right is None and mask.left is None:
        return lo, lo, hi, hi
    lo_full = jnp.minimum(jnp.maximum(lo_full, lo), hi)
    hi_full = jnp.maximum(jnp.minimum(hi_full, hi), lo_full)
    return lo, lo_full, hi_full, hi


def _logits(s: Any, scale: float, cap: float | None) -> tuple[Any, Any]:
    """Base-2 logits from raw ``q·k`` (float32), and ``tanh`` of the capped logits (or ``None``)."""
    if cap is None:
        return s * (scale * _LOG2E), None
    t = jnp.tanh(s * (scale / cap))
    return t * (cap * _LOG2E), t


def _q_block(i: Any, mask: _Mask, nq: int) -> Any:
    """The query block of grid row ``i``: with a causal / right-window bound, the last blocks (the most
    keys) come first, so the longest programs start early and the short ones fill the tail."""
    return nq - 1 - i if mask.right is not None else i


@attrs.frozen(kw_only=True)
class _Bias:
    """Which dims of a ``[Bb, Hb, Sqb, Skb]`` bias are full (the others are 1, broadcast)."""

    batch: bool
    heads: bool
    rows: bool
    cols: bool

    @classmethod
    def of(cls, bias: Any) -> _Bias | None:
        if bias is None:
            return None
        b, h, r, c = (int(n) > 1 for n in bias.shape)
        return cls(batch=b, heads=h, rows=r, cols=c)

    def pad(self, bias: Any, sqp: int, skp: int) -> Any:
        if self.rows:
            bias = _pad(bias, 2, sqp)
        if self.cols:
            bias = _pad(bias, 3, skp)
        return bias

    def spec(self, rows: int, skp: int, q_index: Any) -> Any:
        """The forward / dq kernels' block: ``rows`` query rows (or 1) by all keys (or 1)."""
        return pl().BlockSpec(
            (None, None, rows if self.rows else 1, skp if self.cols else 1),
            lambda i, b, h: (b if self.batch else 0, h if self.heads else 0, q_index(i) if self.rows else 0, 0))

    def tile(self, ref: Any, col0: Any, bk: int) -> Any:
        """Base-2 bias ``[rows | 1, bk | 1]`` of key block ``col0`` (forward / dq kernels)."""
        t = ref[:, pl().ds(col0, bk)] if self.cols else ref[...]
        return t.astype(jnp.float32) * _LOG2E


def _loop(lo: Any, hi: Any, body: Any, carry: Any) -> Any:
    if isinstance(lo, int) and isinstance(hi, int) and lo >= hi:
        return carry
    return lax.fori_loop(lo, hi, body, carry)


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


def _fwd_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, b_ref: Any, sink_ref: Any,
                o_ref: Any, lse_ref: Any, *, mask: _Mask, bias: _Bias | None, scale: float, cap: float | None,
                bq: int, bk: int, nk: int, nq: int, sinks: bool = False) -> None:
    row0 = _q_block(pl().program_id(0), mask, nq) * bq
    q = q_ref[...]
    q_seg = qs_ref[...] if mask.segments else None
    rows = row0 + jnp.arange(bq)
    dv = v_ref.shape[-1]

    def body(t: Any, carry: Any, *, masked: bool) -> Any:
        acc, m, denom = carry
        col0 = t * bk
        k = k_ref[pl().ds(col0, bk), :]
        v = v_ref[pl().ds(col0, bk), :]
        z, _ = _logits(jnp.dot(q, k.T, preferred_element_type=jnp.float32), scale, cap)
        if bias is not None:
            z = z + bias.tile(b_ref, col0, bk)
        if masked:
            kv_seg = ks_ref[pl().ds(col0, bk)] if mask.segments else None
            vis = mask.visible(rows, col0 + jnp.arange(bk), q_seg, kv_seg)
            if vis is not None:
                z = jnp.where(vis, z, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(z, axis=1))
        # A row may still see nothing (masks, or a -inf bias): keep exp2 away from (-inf) - (-inf).
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked or bias is not None else m_new
        alpha = jnp.exp2(m - m_use)
        p = jnp.exp2(z - m_use[:, None])
        denom = denom * alpha + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, m_new, denom

    carry = (jnp.zeros((bq, dv), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
             jnp.zeros((bq,), jnp.float32))
    lo, lo_full, hi_full, hi = _key_blocks(mask, row0, bq, bk, nk)
    masked_body = functools.partial(body, masked=True)
    full_body = masked_body if mask.segments else functools.partial(body, masked=False)
    carry = _loop(lo, lo_full, masked_body, carry)
    carry = _loop(lo_full, hi_full, full_body, carry)
    acc, m, denom = _loop(hi_full, hi, masked_body, carry)
    empty = denom == 0.0
    if sinks:  # e^sink joins the denominator of every row that saw a key (sink_ref: base-2 logits per row)
        sink = sink_ref[...]
        top = jnp.where(empty, 0.0, jnp.maximum(m, sink))
        alpha = jnp.where(empty, 1.0, jnp.exp2(m - top))
        acc = acc * alpha[:, None]
        denom = jnp.where(empty, denom, denom * alpha + jnp.exp2(sink - top))
        m = jnp.where(empty, m, top)
    o_ref[...] = (acc / jnp.where(empty, 1.0, denom)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log2(jnp.where(empty, 1.0, denom)))


def _dkdv_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, b_ref: Any, do_ref: Any,
                 lse_ref: Any, delta_ref: Any, dk_ref: Any, dv_ref: Any, *, mask: _Mask, bias: _Bias | None,
                 scale: float, cap: float | None, group: int, bq: int, bk: int, nq: int) -> None:
    col0 = pl().program_id(0) * bk
    k = k_ref[...]
    v = v_ref[...]
    cols = col0 + jnp.arange(bk)
    kv_seg = ks_ref[...] if mask.segments else None

    def step(g: Any, t: Any, carry: Any, *, masked: bool) -> Any:
        dk, dv = carry
        row0 = t * bq
        q = q_ref[pl().ds(row0, bq), g, :]
        do = do_ref[pl().ds(row0, bq), g, :]
        lse = lse_ref[g, pl().ds(row0, bq)]
        delta = delta_ref[g, pl().ds(row0, bq)]
        z, tanh = _logits(jnp.dot(q, k.T, preferred_element_type=jnp.float32), scale, cap)
        if bias is not None:  # block [G | 1, Sqp | 1, bk | 1]
            tile = b_ref[g if bias.heads else 0, pl().ds(row0, bq) if bias.rows else slice(None), :]
            z = z + tile.astype(jnp.float32) * _LOG2E
        if masked:
            q_seg = qs_ref[pl().ds(row0, bq)] if mask.segments else None
            vis = mask.visible(row0 + jnp.arange(bq), cols, q_seg, kv_seg, check_cols=False)
            if vis is not None:
                z = jnp.where(vis, z, -jnp.inf)
        p = jnp.exp2(z - lse[:, None])
        dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
        return dk, dv

    lo, lo_full, hi_full, hi = _query_blocks(mask, col0, bk, bq, nq)

    def head(g: Any, carry: Any) -> Any:
        masked_step = functools.partial(step, g, masked=True)
        full_step = masked_step if mask.segments else functools.partial(step, g, masked=False)
        carry = _loop(lo, lo_full, masked_step, carry)
        carry = _loop(lo_full, hi_full, full_step, carry)
        return _loop(hi_full, hi, masked_step, carry)

    carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dk, dv = head(0, carry) if group == 1 else lax.fori_loop(0, group, head, carry)
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, b_ref: Any, do_ref: Any, lse_ref: Any,
               delta_ref: Any, dq_ref: Any, *, mask: _Mask, bias: _Bias | None, scale: float, cap: float | None,
               bq: int, bk: int, nk: int, nq: int) -> None:
    row0 = _q_block(pl().program_id(0), mask, nq) * bq
    q = q_ref[...]
    do = do_ref[...]
    lse = lse_ref[...]
    delta = delta_ref[...]
    rows = row0 + jnp.arange(bq)
    q_seg = qs_ref[...] if mask.segments else None

    def body(t: Any, dq: Any, *, masked: bool) -> Any:
        col0 = t * bk
        k = k_ref[pl().ds(col0, bk), :]
        v = v_ref[pl().ds(col0, bk), :]
        z, tanh = _logits(jnp.dot(q, k.T, preferred_element_type=jnp.float32), scale, cap)
        if bias is not None:
            z = z + bias.tile(b_ref, col0, bk)
        if masked:
            kv_seg = ks_ref[pl().ds(col0, bk)] if mask.segments else None
            vis = mask.visible(rows, col0 + jnp.arange(bk), q_seg, kv_seg)
            if vis is not None:
                z = jnp.where(vis, z, -jnp.inf)
        p = jnp.exp2(z - lse[:, None])
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    lo, lo_full, hi_full, hi = _key_blocks(mask, row0, bq, bk, nk)
    masked_body = functools.partial(body, masked=True)
    full_body = masked_body if mask.segments else functools.partial(body, masked=False)
    dq = jnp.zeros(q.shape, jnp.float32)
    dq = _loop(lo, lo_full, masked_body, dq)
    dq = _loop(lo_full, hi_full, full_body, dq)
    dq = _loop(hi_full, hi, masked_body, dq)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dbias_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, b_ref: Any, do_ref: Any,
                  lse_ref: Any, delta_ref: Any, ds_ref: Any, *, mask: _Mask, bias: _Bias, scale: float,
                  cap: float | None, bq: int, bk: int, nk: int, nq: int) -> None:
    """``dS = P · (dP - delta)`` (the gradient of the biased logits) for one row block, all keys, float32.

    A kernel of its own, so that XLA can drop it when the bias needs no gradient.
    """
    row0 = _q_block(pl().program_id(0), mask, nq) * bq
    q = q_ref[...]
    do = do_ref[...]
    lse = lse_ref[...]
    delta = delta_ref[...]
    rows = row0 + jnp.arange(bq)
    q_seg = qs_ref[...] if mask.segments else None

    def zeros(t: Any, carry: Any) -> Any:
        ds_ref[:, pl().ds(t * bk, bk)] = jnp.zeros((bq, bk), jnp.float32)
        return carry

    def body(t: Any, carry: Any) -> Any:
        col0 = t * bk
        k = k_ref[pl().ds(col0, bk), :]
        v = v_ref[pl().ds(col0, bk), :]
        z, _ = _logits(jnp.dot(q, k.T, preferred_element_type=jnp.float32), scale, cap)
        z = z + bias.tile(b_ref, col0, bk)
        kv_seg = ks_ref[pl().ds(col0, bk)] if mask.segments else None
        vis = mask.visible(rows, col0 + jnp.arange(bk), q_seg, kv_seg)
        if vis is not None:
            z = jnp.where(vis, z, -jnp.inf)
        p = jnp.exp2(z - lse[:, None])
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds_ref[:, pl().ds(col0, bk)] = p * (dp - delta[:, None])
        return carry

    lo, _, _, hi = _key_blocks(mask, row0, bq, bk, nk)
    _loop(0, lo, zeros, 0)
    _loop(lo, hi, body, 0)
    _loop(hi, nk, zeros, 0)


# ----------------------------------------------------------------------------------------------
# Launches
# ----------------------------------------------------------------------------------------------


@functools.cache
def _pallas() -> Any:
    from jax.experimental import pallas

    return pallas


def pl() -> Any:
    """``jax.experimental.pallas``, imported on first use (keeps the plugin's import light)."""
    return _pallas()


def _compiler_params(num_warps: int, num_stages: int) -> Any:
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _pad(x: Any, axis: int, to: int, value: float = 0) -> Any:
    extra = to - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _segments(q_seg: Any, kv_seg: Any, batch: int, sqp: int, skp: int) -> tuple[Any, Any]:
    if q_seg is None or kv_seg is None:  # one int per row, never read
        return jnp.zeros((batch, sqp), jnp.int32), jnp.zeros((batch, skp), jnp.int32)
    return _pad(q_seg.astype(jnp.int32), 1, sqp, -1), _pad(kv_seg.astype(jnp.int32), 1, skp, -2)


def _forward_impl(q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, bias: Any, *, cfg: FlashAttentionConfig,
                  causal: bool,
                  softmax_scale: float, sliding_window: tuple[int, int] | None, logits_soft_cap: float | None,
                  interpret: bool, sinks: Any = None) -> tuple[Any, Any]:
    """``(out [B, Sq, Hq, Dv], lse [B, Hq, Sq] float32, base 2)``; ``sinks`` ``[Hq]`` join the final
    normalisation (and the lse)."""
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    bq, bk = _fit(cfg.block_q, sq), _fit(cfg.block_k, sk)
    sqp, skp, dp, dvp = _cdiv(sq, bq) * bq, _cdiv(sk, bk) * bk, _pad_dim(d), _pad_dim(dv)
    mask = _make_mask(sq, sk, causal, sliding_window, q_seg is not None and kv_seg is not None)
    qp = _pad(_pad(q, 1, sqp), 3, dp)
    kp = _pad(_pad(k, 1, skp), 3, dp)
    vp = _pad(_pad(v, 1, skp), 3, dvp)
    qs, ks = _segments(q_seg, kv_seg, batch, sqp, skp)
    p = pl()
    nq = sqp // bq
    layout = _Bias.of(bias)
    kernel = functools.partial(_fwd_kernel, mask=mask, bias=layout, scale=float(softmax_scale),
                               cap=logits_soft_cap, bq=bq, bk=bk, nk=skp // bk, nq=nq, sinks=sinks is not None)
    # The sinks as base-2 logits per row, laid out as the lse (a block per program, like it).
    sink_rows = None if sinks is None else jnp.broadcast_to(
        (sinks.astype(jnp.float32) * _LOG2E)[None, :, None], (batch, hq, sqp))

    def qi(i: Any) -> Any:
        return _q_block(i, mask, nq)

    out, lse = p.pallas_call(
        kernel,
        grid=(nq, batch, hq),
        in_specs=[
            p.BlockSpec((None, bq, None, dp), lambda i, b, h: (b, qi(i), h, 0)),
            p.BlockSpec((None, skp, None, dp), lambda i, b, h: (b, 0, h // group, 0)),
            p.BlockSpec((None, skp, None, dvp), lambda i, b, h: (b, 0, h // group, 0)),
            p.BlockSpec((None, bq), lambda i, b, h: (b, qi(i))),
            p.BlockSpec((None, skp), lambda i, b, h: (b, 0)),
            None if layout is None else layout.spec(bq, skp, qi),
            None if sink_rows is None else p.BlockSpec((None, None, bq), lambda i, b, h: (b, h, qi(i))),
        ],
        out_specs=[
            p.BlockSpec((None, bq, None, dvp), lambda i, b, h: (b, qi(i), h, 0)),
            p.BlockSpec((None, None, bq), lambda i, b, h: (b, h, qi(i))),
        ],
        out_shape=[jax.ShapeDtypeStruct((batch, sqp, hq, dvp), q.dtype),
                   jax.ShapeDtypeStruct((batch, hq, sqp), jnp.float32)],
        compiler_params=_compiler_params(cfg.num_warps, cfg.num_stages),
        interpret=interpret,
        name="ejk_flash_attention_fwd",
    )(qp, kp, vp, qs, ks, None if layout is None else layout.pad(bias, sqp, skp), sink_rows)
    return out[:, :sq, :, :dv], lse[:, :, :sq]


def _backward_impl(q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, bias: Any, out: Any, lse: Any, d_out: Any, *,
                   cfg: FlashAttentionConfig, causal: bool, softmax_scale: float,
                   sliding_window: tuple[int, int] | None, logits_soft_cap: float | None,
                   interpret: bool, d_lse: Any = None) -> tuple[Any, Any, Any, Any]:
    """``(dq, dk, dv, dbias)`` from the saved output and base-2 log-sum-exp (``dbias`` ``None`` without bias);
    ``d_lse``: the cotangent of the natural log-sum-exp, if any."""
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    # dk/dv: programs of bk keys, steps of bq rows; dq: programs of bk rows, steps of bq keys.
    bq_small, bk_big = cfg.bwd_block_q, cfg.bwd_block_k
    q_step, k_prog = _fit(bq_small, sq), _fit(bk_big, sk)
    q_prog, k_step = _fit(bk_big, sq), _fit(bq_small, sk)
    sqp = _cdiv(sq, max(q_step, q_prog)) * max(q_step, q_prog)
    skp = _cdiv(sk, max(k_step, k_prog)) * max(k_step, k_prog)
    dp, dvp = _pad_dim(d), _pad_dim(dv)
    mask = _make_mask(sq, sk, causal, sliding_window, q_seg is not None and kv_seg is not None)
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
    if d_lse is not None:  # the natural-lse cotangent: d_logits = p · (dp - delta + d_lse)
        delta = delta - d_lse.astype(jnp.float32)
    d_out = d_out.astype(q.dtype)
    qp = _pad(_pad(q, 1, sqp), 3, dp)
    kp = _pad(_pad(k, 1, skp), 3, dp)
    vp = _pad(_pad(v, 1, skp), 3, dvp)
    dop = _pad(_pad(d_out, 1, sqp), 3, dvp)
    lsep = _pad(lse, 2, sqp, jnp.inf)  # padded rows: p = 0
    deltap = _pad(delta, 2, sqp)
    qs, ks = _segments(q_seg, kv_seg, batch, sqp, skp)
    scale, cap = float(softmax_scale), logits_soft_cap
    layout = _Bias.of(bias)
    bias_p = None if layout is None else layout.pad(bias, sqp, skp)
    p = pl()
    params = _compiler_params(cfg.bwd_num_warps, cfg.bwd_num_stages)
    dkdv_bias_spec = None if layout is None else p.BlockSpec(
        (None, group if layout.heads else 1, sqp if layout.rows else 1, k_prog if layout.cols else 1),
        lambda j, b, h: (b if layout.batch else 0, h if layout.heads else 0, 0, j if layout.cols else 0))

    # dk / dv: grid (key blocks, batch, kv heads); the q heads of a group are one block of the
    # [B, Sq, Hkv, G, D] view, so k / v are read once per group and never repeated in memory.
    q5 = qp.reshape(batch, sqp, hkv, group, dp)
    do5 = dop.reshape(batch, sqp, hkv, group, dvp)
    lse4 = lsep.reshape(batch, hkv, group, sqp)
    delta4 = deltap.reshape(batch, hkv, group, sqp)
    dk, dv_ = p.pallas_call(
        functools.partial(_dkdv_kernel, mask=mask, bias=layout, scale=scale, cap=cap, group=group, bq=q_step,
                          bk=k_prog, nq=sqp // q_step),
        grid=(skp // k_prog, batch, hkv),
        in_specs=[
            p.BlockSpec((None, sqp, None, group, dp), lambda j, b, h: (b, 0, h, 0, 0)),
            p.BlockSpec((None, k_prog, None, dp), lambda j, b, h: (b, j, h, 0)),
            p.BlockSpec((None, k_prog, None, dvp), lambda j, b, h: (b, j, h, 0)),
            p.BlockSpec((None, sqp), lambda j, b, h: (b, 0)),
            p.BlockSpec((None, k_prog), lambda j, b, h: (b, j)),
            dkdv_bias_spec,
            p.BlockSpec((None, sqp, None, group, dvp), lambda j, b, h: (b, 0, h, 0, 0)),
            p.BlockSpec((None, None, group, sqp), lambda j, b, h: (b, h, 0, 0)),
            p.BlockSpec((None, None, group, sqp), lambda j, b, h: (b, h, 0, 0)),
        ],
        out_specs=[
            p.BlockSpec((None, k_prog, None, dp), lambda j, b, h: (b, j, h, 0)),
            p.BlockSpec((None, k_prog, None, dvp), lambda j, b, h: (b, j, h, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(kp.shape, k.dtype), jax.ShapeDtypeStruct(vp.shape, v.dtype)],
        compiler_params=params,
        interpret=interpret,
        name="ejk_flash_attention_dkdv",
    )(q5, kp, vp, qs, ks, bias_p, do5, lse4, delta4)

    nq = sqp // q_prog

    def qi(i: Any) -> Any:
        return _q_block(i, mask, nq)

    row_specs = [
        p.BlockSpec((None, q_prog, None, dp), lambda i, b, h: (b, qi(i), h, 0)),
        p.BlockSpec((None, skp, None, dp), lambda i, b, h: (b, 0, h // group, 0)),
        p.BlockSpec((None, skp, None, dvp), lambda i, b, h: (b, 0, h // group, 0)),
        p.BlockSpec((None, q_prog), lambda i, b, h: (b, qi(i))),
        p.BlockSpec((None, skp), lambda i, b, h: (b, 0)),
        None if layout is None else layout.spec(q_prog, skp, qi),
        p.BlockSpec((None, q_prog, None, dvp), lambda i, b, h: (b, qi(i), h, 0)),
        p.BlockSpec((None, None, q_prog), lambda i, b, h: (b, h, qi(i))),
        p.BlockSpec((None, None, q_prog), lambda i, b, h: (b, h, qi(i))),
    ]
    row_inputs = (qp, kp, vp, qs, ks, bias_p, dop, lsep, deltap)
    statics: dict[str, Any] = dict(mask=mask, bias=layout, scale=scale, cap=cap, bq=q_prog, bk=k_step,
                                   nk=skp // k_step, nq=nq)
    (dq,) = p.pallas_call(
        functools.partial(_dq_kernel, **statics),
        grid=(nq, batch, hq),
        in_specs=row_specs,
        out_specs=[p.BlockSpec((None, q_prog, None, dp), lambda i, b, h: (b, qi(i), h, 0))],
        out_shape=[jax.ShapeDtypeStruct(qp.shape, q.dtype)],
        compiler_params=params,
        interpret=interpret,
        name="ejk_flash_attention_dq",
    )(*row_inputs)
    dbias = None
    if layout is not None:
        # dS of the biased logits, materialised [B, Hq, Sq, Sk] float32 (only when the bias needs a
        # gradient: XLA can drop an unused kernel), then summed over the bias's broadcast dims.
        (ds,) = p.pallas_call(
            functools.partial(_dbias_kernel, **statics),
            grid=(nq, batch, hq),
            in_specs=row_specs,
            out_specs=[p.BlockSpec((None, None, q_prog, skp), lambda i, b, h: (b, h, qi(i), 0))],
            out_shape=[jax.ShapeDtypeStruct((batch, hq, sqp, skp), jnp.float32)],
            compiler_params=params,
            interpret=interpret,
            name="ejk_flash_attention_dbias",
        )(*row_inputs)
        ds = ds[:, :, :sq, :sk]
        axes = tuple(a for a in range(4) if bias.shape[a] == 1 and ds.shape[a] != 1)
        dbias = (jnp.sum(ds, axis=axes, keepdims=True) if axes else ds).astype(bias.dtype)
    return dq[:, :sq, :, :d], dk[:, :sk, :, :d], dv_[:, :sk, :, :dv], dbias


# ----------------------------------------------------------------------------------------------
# The registered functions
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: FlashAttentionConfig | None, q: Any, k: Any, v: Any) -> FlashAttentionConfig:
    return heuristic_config(q, k, v) if cfg is None else cfg


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
    cfg: FlashAttentionConfig | None = None,
) -> tuple[jax.Array, tuple[Any, ...]]:
    """The output and the residuals :func:`backward` needs.

    Arguments are those of ``ejk.flash_attention`` after the op layer's normalisation
    (``bias`` must be ``None``: the capability gate refuses it); ``sinks`` ``[Hq]`` join the
    kernel's final normalisation.

    Returns:
        ``(out, residuals)``: ``out`` ``[B, Sq, Hq, Dv]`` in ``q.dtype``; ``residuals`` =
        ``(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse)`` with ``lse`` the base-2
        log-sum-exp ``[B, Hq, Sq]`` float32 (``+inf`` for rows that see no key), the sinks appended
        when given (the lse then includes them).
    """
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    seg = (q_segment_ids, kv_segment_ids) if has_seg else (None, None)
    extra = () if sinks is None else (sinks,)
    batch, sq, hq, _ = q.shape
    if min(batch, sq, hq, k.shape[1], v.shape[3]) == 0:
        out = jnp.zeros((batch, sq, hq, v.shape[3]), q.dtype)
        return out, (q, k, v, *seg, bias, out, jnp.full((batch, hq, sq), jnp.inf, jnp.float32), *extra)
    out, lse = _forward_impl(q, k, v, *seg, bias, cfg=_resolve(cfg, q, k, v), causal=causal,
                             softmax_scale=softmax_scale,
                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                             interpret=_env.use_interpreter(), sinks=sinks)
    return out, (q, k, v, *seg, bias, out, lse, *extra)


forward = without_residuals(forward_with_residuals)


def _backward(
    residuals: tuple[Any, ...],
    d_out: jax.Array,
    *,
    d_lse: jax.Array | None = None,
    cfg: FlashAttentionConfig | None = None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
) -> tuple[Any, ...]:
    """Gradients from the residuals of :func:`forward_with_residuals` and the output cotangent.

    ``d_lse`` (``[B, Hq, Sq]``), the cotangent of ``ejk.flash_attention_lse``'s natural log-sum-exp
    (the VJP names ``"lse"`` in ``extra_cotangents``), is subtracted from ``delta = rowsum(dO · O)``.

    Returns:
        ``(dq, dk, dv, None, None, None)``: one cotangent per array argument in the order
        q, k, v, q_segment_ids, kv_segment_ids, bias.
    """
    q, k, v, q_seg, kv_seg, bias, out, lse = residuals
    if min(q.shape[0], q.shape[1], q.shape[2], k.shape[1], v.shape[3]) == 0:
        zero_bias = None if bias is None else jnp.zeros_like(bias)
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None, None, zero_bias
    dq, dk, dv, dbias = _backward_impl(q, k, v, q_seg, kv_seg, bias, out, lse, d_out, cfg=_resolve(cfg, q, k, v),
                                       causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                                       logits_soft_cap=logits_soft_cap, interpret=_env.use_interpreter(),
                                       d_lse=d_lse)
    return dq, dk, dv, None, None, dbias


#: The backward of :func:`forward_with_residuals`, the sinks' cotangent appended (computed from the
#: residuals: the kernels need no change, their lse includes the sinks).
backward = sinks_backward(_backward)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


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

    Supported: bfloat16 / float16 q, k, v (float32 accumulation) with head dims up to 256 (q/k and
    v may differ; non-powers of two are padded); any lengths; GQA / MQA; causal; sliding windows;
    soft cap; segment ids; a float bias broadcastable to ``[B, Hq, Sq, Sk]`` (its gradient, when
    asked for, goes through a float32 ``[B, Hq, Sq, Sk]`` buffer). Not supported: float32 inputs.
    Needs an NVIDIA GPU (compute capability 8.0+), except in interpret mode
    (``EJK_PALLAS_INTERPRET=1`` on a CPU).
    """
    del causal, softmax_scale, sliding_window, logits_soft_cap, q_segment_ids, kv_segment_ids
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16 and float16 only)"
    if len(dtypes) > 1:
        return f"q, k, v must share one dtype (got {', '.join(sorted(dtypes))})"
    for name, dim in (("head_dim", int(q.shape[3])), ("v head_dim", int(v.shape[3]))):
        if dim > _MAX_HEAD_DIM:
            return f"{name} {dim} not supported (at most {_MAX_HEAD_DIM})"
    if bias is not None and not jnp.issubdtype(bias.dtype, jnp.floating):
        return f"bias of dtype {jnp.dtype(bias.dtype).name} not supported (floating point only)"
    if _env.use_interpreter():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    raw = str(getattr(jax.devices()[0], "compute_capability", "") or "")
    try:
        major = int(raw.split(".")[0])
    except ValueError:
        return None
    return None if major >= 8 else f"needs an NVIDIA GPU of compute capability 8.0 or newer (found {raw})"


# (block_q, block_k, num_warps, num_stages) forward x (bwd_block_q, bwd_block_k, warps, stages) backward,
# by padded head dim; the first is the heuristic's choice. Tiles follow the usual FlashAttention-2
# choices on Hopper-class GPUs (128-row query tiles; 8 warps from D = 128); D = 128 timed on an H100.
_CANDIDATES: dict[int, tuple[tuple[tuple[int, int, int, int], tuple[int, int, int, int]], ...]] = {
    64: (((128, 64, 4, 3), (32, 128, 4, 2)), ((128, 128, 8, 3), (64, 128, 8, 2)), ((64, 64, 4, 3), (32, 64, 4, 2)),
         ((128, 32, 4, 3), (16, 64, 4, 2))),
    # The 32 x 64 / 4 warps / 3 stages backward measured fastest (benchmarks/results/kernel_defaults_h100.md).
    128: (((128, 64, 8, 3), (32, 64, 4, 3)), ((128, 64, 8, 3), (32, 128, 8, 2)), ((128, 128, 8, 2), (64, 128, 8, 2)),
          ((128, 32, 4, 3), (32, 64, 4, 2)), ((64, 64, 4, 3), (16, 64, 4, 2))),
    256: (((64, 64, 8, 2), (16, 64, 8, 2)), ((64, 32, 4, 3), (16, 32, 4, 2)), ((128, 32, 8, 2), (32, 32, 8, 1))),
}


def _make(fwd: tuple[int, int, int, int], bwd: tuple[int, int, int, int]) -> FlashAttentionConfig:
    return FlashAttentionConfig(block_q=fwd[0], block_k=fwd[1], num_warps=fwd[2], num_stages=fwd[3],
                                bwd_block_q=bwd[0], bwd_block_k=bwd[1], bwd_num_warps=bwd[2], bwd_num_stages=bwd[3])


def _dim_class(q: Any, v: Any) -> int:
    d = max(_pad_dim(int(q.shape[3])), _pad_dim(int(v.shape[3])))
    return 64 if d <= 64 else 128 if d <= 128 else 256


def _smem_bytes(cfg: FlashAttentionConfig, d: int, dv: int, itemsize: int) -> int:
    """Estimated shared memory (bytes) of the larger of the forward and dk/dv kernels' pipelined tiles."""
    d, dv = _pad_dim(d), _pad_dim(dv)
    fwd = (cfg.block_q * d + cfg.num_stages * cfg.block_k * (d + dv)) * itemsize
    bwd = (cfg.bwd_block_k * (d + dv) + cfg.bwd_num_stages * cfg.bwd_block_q * (d + dv)) * itemsize
    return max(fwd, bwd)


def _fitting(q: Any, v: Any) -> list[FlashAttentionConfig]:
    """The table's configs whose estimated tiles fit this GPU's shared memory (else the smallest one)."""
    d, dv, itemsize = int(q.shape[3]), int(v.shape[3]), jnp.dtype(q.dtype).itemsize
    configs = [_make(fwd, bwd) for fwd, bwd in _CANDIDATES[_dim_class(q, v)]]
    limit = _smem_limit()
    fitting = [c for c in configs if _smem_bytes(c, d, dv, itemsize) <= limit]
    return fitting or [min(configs, key=lambda c: _smem_bytes(c, d, dv, itemsize))]


def config_space(q: Any, k: Any, v: Any, *rest: Any, **__: Any) -> list[FlashAttentionConfig]:
    """Autotuning candidates by head dim (the heuristic's choice first), pruned by a shared-memory estimate.

    One small config in interpret mode.

    Args:
        q: ``[B, Sq, Hq, D]`` (anything with ``.shape`` and ``.dtype``).
        k: ``[B, Sk, Hkv, D]``.
        v: ``[B, Sk, Hkv, Dv]``.
        *rest: Further abstract arguments of the op, ignored.
        **__: Static arguments of the op, ignored.
    """
    del k, rest
    if _env.use_interpreter():
        return [heuristic_config(q, q, v)]
    return _fitting(q, v)


def heuristic_config(q: Any, k: Any, v: Any, *rest: Any, **__: Any) -> FlashAttentionConfig:
    """A default by head dim: FlashAttention-2 tiles usual on H100-class GPUs (D = 128 timed on an H100).

    D <= 64: 128 x 64 forward tiles, 4 warps, 3 stages; D <= 128: 128 x 64, 8 warps, 3 stages;
    D <= 256: 64 x 64, 8 warps, 2 stages. Backward: dk/dv programs of 128 keys stepping 32 rows
    (dq: 128 rows stepping 32 keys), at D = 128 64 keys stepping 32 rows with 4 warps and 3
    stages (the fastest on an H100), 64 / 16 at D = 256; the first that fits the GPU's shared
    memory (an estimate of the pipelined tiles) wins. In interpret mode (CPU), 32 x 32 tiles
    keep the number of interpreted grid steps small.

    Args: as for :func:`config_space`.
    """
    del k, rest
    if _env.use_interpreter():
        return FlashAttentionConfig(block_q=32, block_k=32, bwd_block_q=16, bwd_block_k=32)
    return _fitting(q, v)[0]
