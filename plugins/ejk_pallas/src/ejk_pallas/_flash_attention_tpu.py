"""Flash attention as Pallas Mosaic TPU kernels, forward and backward — **untested on TPU hardware**.

Written to the same contract as the Triton-lowered GPU kernel and checked on the CPU in the TPU
interpret mode (``interpret=pltpu.InterpretParams()``) only. Layout inside: ``[B, H, S, D]``
(the wrapper transposes), so every block's last two dims are ``(rows, head dim)``.

* forward: grid ``(batch, q head, query block, key block)``, the key axis ``arbitrary`` with the
  online-softmax state (``m``, ``l``, ``acc``) in VMEM scratch; saves the base-2 log-sum-exp;
* backward: ``delta = rowsum(dO·O)`` (XLA), a dk/dv kernel with grid ``(batch, kv head, key
  block, q head of the group, query block)`` accumulating in VMEM (GQA without repeating k / v),
  and a dq kernel with the forward's grid.

Blocks that a causal mask or sliding window hides entirely are skipped (``pl.when``), and their
index maps clamp to the nearest needed block so the pipeline issues no copy for them. Rows that
see no key give zeros and zero gradients. Registered as ``pallas/tpu:mosaic_tpu`` (and for the
``cpu`` backend in interpret mode, where it runs under the TPU interpreter).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.config.validators import multiple_of
from ejk.ops import FLASH_RESIDUALS, sinks_backward, without_residuals
from ejk.tiling import cdiv as _cdiv
from ejk_pallas import _env
from ejk_pallas._flash_attention import _LOG2E, _key_blocks, _make_mask, _Mask, _pad, _query_blocks
from ejk_pallas._vmap import fold_vmap_into_batch

__all__ = [
    "RESIDUALS",
    "TpuFlashAttentionConfig",
    "backward",
    "capability",
    "config_space",
    "forward",
    "forward_with_residuals",
    "heuristic_config",
]

#: Residual format: inputs, output and base-2 log-sum-exp ``[B, Hq, Sq]`` (the GPU kernel's too).
RESIDUALS = FLASH_RESIDUALS

_DTYPES = ("bfloat16", "float16", "float32")
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b



_block = multiple_of(8)


@attrs.frozen(kw_only=True)
class TpuFlashAttentionConfig:
    """Tile sizes of the Mosaic TPU flash attention (clamped to the rounded sequence lengths).

    Attributes:
        block_q: Query rows per block (forward and dq).
        block_k: Keys per block (forward and dq).
        bwd_block_q: Query rows per step of the dk/dv kernel.
        bwd_block_k: Keys per program of the dk/dv kernel.
    """

    block_q: int = attrs.field(validator=_block)
    block_k: int = attrs.field(validator=_block)
    bwd_block_q: int = attrs.field(default=128, validator=_block)
    bwd_block_k: int = attrs.field(default=128, validator=_block)


def _fit(block: int, length: int) -> int:
    return max(8, min(block, _cdiv(length, 8) * 8))


def _pltpu() -> Any:
    from jax.experimental.pallas import tpu as pltpu

    return pltpu


def _when(cond: Any) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """``pl.when`` with a type (Pallas's decorator is untyped)."""
    return _pl().when(cond)  # type: ignore[no-any-return]


def _pl() -> Any:
    from jax.experimental import pallas

    return pallas


def _interpret() -> Any:
    return _pltpu().InterpretParams() if _env.use_interpreter() else False


def _visible(mask: _Mask, row0: Any, col0: Any, shape: tuple[int, int], q_seg: Any, kv_seg: Any, *,
             check_cols: bool = True) -> Any:
    i = row0 + lax.broadcasted_iota(jnp.int32, shape, 0)
    j = col0 + lax.broadcasted_iota(jnp.int32, shape, 1)
    conds = []
    if check_cols:
        conds.append(j < mask.sk)
    if mask.right is not None:
        conds.append(j <= i + (mask.offset + mask.right))
    if mask.left is not None:
        conds.append(j >= i + (mask.offset - mask.left))
    if mask.segments:
        conds.append(q_seg == kv_seg)  # [bq, 1] == [1, bk]
    return functools.reduce(jnp.logical_and, conds) if conds else None


def _dot_precision(q: Any, precision: str) -> Any:
    """The kernels' dot precision: the call's for float32 inputs (``None``, the MXU's default, for 16-bit
    ones, whose products are exact)."""
    return lax.Precision(precision) if jnp.dtype(q.dtype) == jnp.float32 else None


def _z(q: Any, k: Any, scale: float, cap: float | None, prec: Any = None) -> tuple[Any, Any]:
    s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32, precision=prec)
    if cap is None:
        return s * (scale * _LOG2E), None
    t = jnp.tanh(s * (scale / cap))
    return t * (cap * _LOG2E), t


def _clamp(j: Any, lo: Any, hi: Any, n: int) -> Any:
    """Block index ``j`` clamped to ``[lo, hi)`` (``lo`` when the range is empty) and to ``[0, n)``.

    Skipped blocks then map to a neighbour's index, so the pipeline copies nothing new for them.
    """
    return jnp.clip(jnp.minimum(jnp.maximum(j, lo), jnp.maximum(hi - 1, lo)), 0, n - 1)


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


def _fwd_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, sink_ref: Any, o_ref: Any,
                lse_ref: Any, m_sc: Any, l_sc: Any, acc_sc: Any, *, mask: _Mask, scale: float, cap: float | None,
                bq: int, bk: int, nk: int, prec: Any = None, sinks: bool = False) -> None:
    pl = _pl()
    qi, kj = pl.program_id(2), pl.program_id(3)
    row0, col0 = qi * bq, kj * bk
    lo, _, _, hi = _key_blocks(mask, row0, bq, bk, nk)

    @_when(kj == 0)
    def _init() -> None:
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @_when(jnp.logical_and(kj >= lo, kj < hi))
    def _step() -> None:
        z, _ = _z(q_ref[...], k_ref[...], scale, cap, prec)
        vis = _visible(mask, row0, col0, (bq, bk), qs_ref[...], ks_ref[...])
        if vis is not None:
            z = jnp.where(vis, z, -jnp.inf)
        m_prev = m_sc[...]  # [bq, 1]
        m_new = jnp.maximum(m_prev, jnp.max(z, axis=1, keepdims=True))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp2(m_prev - m_use)
        p = jnp.exp2(z - m_use)
        l_sc[...] = l_sc[...] * alpha + jnp.sum(p, axis=1, keepdims=True)
        v = v_ref[...]
        acc_sc[...] = acc_sc[...] * alpha + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32,
                                                    precision=prec)
        m_sc[...] = m_new

    @_when(kj == nk - 1)
    def _finish() -> None:
        denom, acc, m = l_sc[...], acc_sc[...], m_sc[...]
        empty = denom == 0.0
        if sinks:  # e^sink joins the denominator of every row that saw a key (sink_ref: base-2 logit, [1, 1])
            sink = sink_ref[...]
            top = jnp.where(empty, 0.0, jnp.maximum(m, sink))
            alpha = jnp.where(empty, 1.0, jnp.exp2(m - top))
            acc = acc * alpha
            denom = jnp.where(empty, denom, denom * alpha + jnp.exp2(sink - top))
            m = jnp.where(empty, m, top)
        o_ref[...] = (acc / jnp.where(empty, 1.0, denom)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log2(jnp.where(empty, 1.0, denom)))


def _dkdv_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, do_ref: Any, lse_ref: Any,
                 delta_ref: Any, dk_ref: Any, dv_ref: Any, dk_sc: Any, dv_sc: Any, *, mask: _Mask, scale: float,
                 cap: float | None, group: int, bq: int, bk: int, nq: int,
                 prec: Any = None) -> None:
    pl = _pl()
    kj, g, qi = pl.program_id(2), pl.program_id(3), pl.program_id(4)
    row0, col0 = qi * bq, kj * bk
    lo, _, _, hi = _query_blocks(mask, col0, bk, bq, nq)

    @_when(jnp.logical_and(g == 0, qi == 0))
    def _init() -> None:
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    @_when(jnp.logical_and(qi >= lo, qi < hi))
    def _step() -> None:
        q, do = q_ref[...], do_ref[...]
        z, tanh = _z(q, k_ref[...], scale, cap, prec)
        vis = _visible(mask, row0, col0, (bq, bk), qs_ref[...], ks_ref[...], check_cols=False)
        if vis is not None:
            z = jnp.where(vis, z, -jnp.inf)
        p = jnp.exp2(z - lse_ref[...])  # lse [bq, 1]
        dv_sc[...] += lax.dot_general(p.astype(do.dtype), do, _TN, preferred_element_type=jnp.float32, precision=prec)
        dp = lax.dot_general(do, v_ref[...], _NT, preferred_element_type=jnp.float32, precision=prec)
        ds = p * (dp - delta_ref[...])
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        dk_sc[...] += lax.dot_general(ds.astype(q.dtype), q, _TN, preferred_element_type=jnp.float32, precision=prec)

    @_when(jnp.logical_and(g == group - 1, qi == nq - 1))
    def _finish() -> None:
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _dq_kernel(q_ref: Any, k_ref: Any, v_ref: Any, qs_ref: Any, ks_ref: Any, do_ref: Any, lse_ref: Any,
               delta_ref: Any, dq_ref: Any, dq_sc: Any, *, mask: _Mask, scale: float, cap: float | None, bq: int,
               bk: int, nk: int, prec: Any = None) -> None:
    pl = _pl()
    qi, kj = pl.program_id(2), pl.program_id(3)
    row0, col0 = qi * bq, kj * bk
    lo, _, _, hi = _key_blocks(mask, row0, bq, bk, nk)

    @_when(kj == 0)
    def _init() -> None:
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    @_when(jnp.logical_and(kj >= lo, kj < hi))
    def _step() -> None:
        k = k_ref[...]
        z, tanh = _z(q_ref[...], k, scale, cap, prec)
        vis = _visible(mask, row0, col0, (bq, bk), qs_ref[...], ks_ref[...])
        if vis is not None:
            z = jnp.where(vis, z, -jnp.inf)
        p = jnp.exp2(z - lse_ref[...])
        dp = lax.dot_general(do_ref[...], v_ref[...], _NT, preferred_element_type=jnp.float32, precision=prec)
        ds = p * (dp - delta_ref[...])
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        dq_sc[...] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32, precision=prec)

    @_when(kj == nk - 1)
    def _finish() -> None:
        dq_ref[...] = (dq_sc[...] * scale).astype(dq_ref.dtype)


# ----------------------------------------------------------------------------------------------
# Launches ([B, H, S, D] inside)
# ----------------------------------------------------------------------------------------------


def _bhsd(x: Any, seq_to: int) -> Any:
    return _pad(jnp.swapaxes(x, 1, 2), 2, seq_to)


def _segments(q_seg: Any, kv_seg: Any, batch: int, sqp: int, skp: int) -> tuple[Any, Any]:
    """``[B, Sqp, 1]`` and ``[B, 1, Skp]`` int32 (zeros, never compared, without segments)."""
    if q_seg is None or kv_seg is None:
        return jnp.zeros((batch, sqp, 1), jnp.int32), jnp.zeros((batch, 1, skp), jnp.int32)
    qs = _pad(q_seg.astype(jnp.int32), 1, sqp, -1)[:, :, None]
    ks = _pad(kv_seg.astype(jnp.int32), 1, skp, -2)[:, None, :]
    return qs, ks


def _params(*semantics: str) -> Any:
    return _pltpu().CompilerParams(dimension_semantics=semantics)


def _forward_impl(q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, sinks: Any = None, *, cfg: TpuFlashAttentionConfig,
                  causal: bool, softmax_scale: float, sliding_window: tuple[int, int] | None,
                  logits_soft_cap: float | None, interpret: Any, precision: str = "highest") -> tuple[Any, Any]:
    """``(out [B, Sq, Hq, Dv], lse [B, Hq, Sq] base 2)``; ``sinks`` ``[B, Hq]`` float32 join the final
    normalisation (and the lse)."""
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    bq, bk = _fit(cfg.block_q, sq), _fit(cfg.block_k, sk)
    sqp, skp = _cdiv(sq, bq) * bq, _cdiv(sk, bk) * bk
    nq, nk = sqp // bq, skp // bk
    mask = _make_mask(sq, sk, causal, sliding_window, q_seg is not None and kv_seg is not None)
    qs, ks = _segments(q_seg, kv_seg, batch, sqp, skp)
    pl, pltpu = _pl(), _pltpu()

    def kv_block(i: Any, j: Any) -> Any:
        lo, _, _, hi = _key_blocks(mask, i * bq, bq, bk, nk)
        return _clamp(j, lo, hi, nk)

    out, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, mask=mask, scale=float(softmax_scale), cap=logits_soft_cap, bq=bq, bk=bk,
                          prec=_dot_precision(q, precision), nk=nk, sinks=sinks is not None),
        grid=(batch, hq, nq, nk),
        in_specs=[
            pl.BlockSpec((None, None, bq, d), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, bk, d), lambda b, h, i, j: (b, h // group, kv_block(i, j), 0)),
            pl.BlockSpec((None, None, bk, dv), lambda b, h, i, j: (b, h // group, kv_block(i, j), 0)),
            pl.BlockSpec((None, bq, 1), lambda b, h, i, j: (b, i, 0)),
            pl.BlockSpec((None, 1, bk), lambda b, h, i, j: (b, 0, kv_block(i, j))),
            None if sinks is None else pl.BlockSpec((None, None, 1, 1), lambda b, h, i, j: (b, h, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, bq, dv), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, bq, 1), lambda b, h, i, j: (b, h, i, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((batch, hq, sqp, dv), q.dtype),
                   jax.ShapeDtypeStruct((batch, hq, sqp, 1), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                        pltpu.VMEM((bq, dv), jnp.float32)],
        compiler_params=_params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret,
        name="ejk_flash_attention_fwd_tpu",
    )(_bhsd(q, sqp), _bhsd(k, skp), _bhsd(v, skp), qs, ks,
      None if sinks is None else (sinks.astype(jnp.float32) * _LOG2E)[:, :, None, None])
    return jnp.swapaxes(out[:, :, :sq], 1, 2), lse[:, :, :sq, 0]


def _backward_impl(q: Any, k: Any, v: Any, q_seg: Any, kv_seg: Any, out: Any, lse: Any, d_out: Any, *,
                   cfg: TpuFlashAttentionConfig, causal: bool, softmax_scale: float,
                   sliding_window: tuple[int, int] | None, logits_soft_cap: float | None,
                   interpret: Any, d_lse: Any = None, precision: str = "highest") -> tuple[Any, Any, Any]:
    batch, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    mask = _make_mask(sq, sk, causal, sliding_window, q_seg is not None and kv_seg is not None)
    scale, cap = float(softmax_scale), logits_soft_cap
    # dk/dv blocks (bwd_*) and dq blocks (block_*): pad to a multiple of every block used.
    bq1, bk1 = _fit(cfg.bwd_block_q, sq), _fit(cfg.bwd_block_k, sk)
    bq2, bk2 = _fit(cfg.block_q, sq), _fit(cfg.block_k, sk)
    sqp = _cdiv(sq, max(bq1, bq2)) * max(bq1, bq2)
    while sqp % bq1 or sqp % bq2:
        sqp += 8
    skp = _cdiv(sk, max(bk1, bk2)) * max(bk1, bk2)
    while skp % bk1 or skp % bk2:
        skp += 8
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
    if d_lse is not None:  # the natural-lse cotangent: d_logits = p · (dp - delta + d_lse)
        delta = delta - d_lse.astype(jnp.float32)
    qt, kt, vt = _bhsd(q, sqp), _bhsd(k, skp), _bhsd(v, skp)
    dot_ = _bhsd(d_out.astype(q.dtype), sqp)
    lse4 = _pad(lse, 2, sqp, jnp.inf)[..., None]
    delta4 = _pad(delta, 2, sqp)[..., None]
    qs, ks = _segments(q_seg, kv_seg, batch, sqp, skp)
    pl, pltpu = _pl(), _pltpu()

    nq1, nk1 = sqp // bq1, skp // bk1

    def q_block(j: Any, i: Any) -> Any:
        lo, _, _, hi = _query_blocks(mask, j * bk1, bk1, bq1, nq1)
        return _clamp(i, lo, hi, nq1)

    dk, dv_ = pl.pallas_call(
        functools.partial(_dkdv_kernel, mask=mask, scale=scale, cap=cap, group=group, bq=bq1, bk=bk1, nq=nq1,
                          prec=_dot_precision(q, precision)),
        grid=(batch, hkv, nk1, group, nq1),
        in_specs=[
            pl.BlockSpec((None, None, bq1, d), lambda b, h, j, g, i: (b, h * group + g, q_block(j, i), 0)),
            pl.BlockSpec((None, None, bk1, d), lambda b, h, j, g, i: (b, h, j, 0)),
            pl.BlockSpec((None, None, bk1, dv), lambda b, h, j, g, i: (b, h, j, 0)),
            pl.BlockSpec((None, bq1, 1), lambda b, h, j, g, i: (b, q_block(j, i), 0)),
            pl.BlockSpec((None, 1, bk1), lambda b, h, j, g, i: (b, 0, j)),
            pl.BlockSpec((None, None, bq1, dv), lambda b, h, j, g, i: (b, h * group + g, q_block(j, i), 0)),
            pl.BlockSpec((None, None, bq1, 1), lambda b, h, j, g, i: (b, h * group + g, q_block(j, i), 0)),
            pl.BlockSpec((None, None, bq1, 1), lambda b, h, j, g, i: (b, h * group + g, q_block(j, i), 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, bk1, d), lambda b, h, j, g, i: (b, h, j, 0)),
            pl.BlockSpec((None, None, bk1, dv), lambda b, h, j, g, i: (b, h, j, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(kt.shape, k.dtype), jax.ShapeDtypeStruct(vt.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((bk1, d), jnp.float32), pltpu.VMEM((bk1, dv), jnp.float32)],
        compiler_params=_params("parallel", "parallel", "parallel", "arbitrary", "arbitrary"),
        interpret=interpret,
        name="ejk_flash_attention_dkdv_tpu",
    )(qt, kt, vt, qs, ks, dot_, lse4, delta4)

    nq2, nk2 = sqp // bq2, skp // bk2

    def kv_block(i: Any, j: Any) -> Any:
        lo, _, _, hi = _key_blocks(mask, i * bq2, bq2, bk2, nk2)
        return _clamp(j, lo, hi, nk2)

    (dq,) = pl.pallas_call(
        functools.partial(_dq_kernel, mask=mask, scale=scale, cap=cap, bq=bq2, bk=bk2, nk=nk2,
                          prec=_dot_precision(q, precision)),
        grid=(batch, hq, nq2, nk2),
        in_specs=[
            pl.BlockSpec((None, None, bq2, d), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, bk2, d), lambda b, h, i, j: (b, h // group, kv_block(i, j), 0)),
            pl.BlockSpec((None, None, bk2, dv), lambda b, h, i, j: (b, h // group, kv_block(i, j), 0)),
            pl.BlockSpec((None, bq2, 1), lambda b, h, i, j: (b, i, 0)),
            pl.BlockSpec((None, 1, bk2), lambda b, h, i, j: (b, 0, kv_block(i, j))),
            pl.BlockSpec((None, None, bq2, dv), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, bq2, 1), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, bq2, 1), lambda b, h, i, j: (b, h, i, 0)),
        ],
        out_specs=[pl.BlockSpec((None, None, bq2, d), lambda b, h, i, j: (b, h, i, 0))],
        out_shape=[jax.ShapeDtypeStruct(qt.shape, q.dtype)],
        scratch_shapes=[pltpu.VMEM((bq2, d), jnp.float32)],
        compiler_params=_params("parallel", "parallel", "parallel", "arbitrary"),
        interpret=interpret,
        name="ejk_flash_attention_dq_tpu",
    )(qt, kt, vt, qs, ks, dot_, lse4, delta4)
    back = jnp.swapaxes
    return back(dq[:, :, :sq], 1, 2), back(dk[:, :, :sk], 1, 2), back(dv_[:, :, :sk], 1, 2)


# ----------------------------------------------------------------------------------------------
# The registered functions
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: TpuFlashAttentionConfig | None, q: Any, k: Any, v: Any) -> TpuFlashAttentionConfig:
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
    precision: str = "highest",
    cfg: TpuFlashAttentionConfig | None = None,
) -> tuple[jax.Array, tuple[Any, ...]]:
    """The output and ``(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse)`` (``lse`` base 2, ``[B, Hq, Sq]``),
    the sinks appended when given: they join the kernel's final normalisation, so the lse includes
    them. ``precision`` sets the float32 dots (``lax.Precision``; untested on TPU hardware)."""
    if bias is not None:
        raise ValueError("pallas/tpu:mosaic_tpu does not support bias (its capability gate says so)")
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    seg = (q_segment_ids, kv_segment_ids) if has_seg else (None, None)
    batch, sq, hq, _ = q.shape
    extra = () if sinks is None else (sinks,)
    if min(batch, sq, hq, k.shape[1], v.shape[3]) == 0:
        out = jnp.zeros((batch, sq, hq, v.shape[3]), q.dtype)
        return out, (q, k, v, *seg, bias, out, jnp.full((batch, hq, sq), jnp.inf, jnp.float32), *extra)
    rows = None if sinks is None else jnp.broadcast_to(sinks.astype(jnp.float32), (batch, hq))
    out, lse = fold_vmap_into_batch(functools.partial(
        _forward_impl, cfg=_resolve(cfg, q, k, v), causal=causal, softmax_scale=softmax_scale,
        sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, interpret=_interpret(),
        precision=precision))(q, k, v, *seg, rows)
    return out, (q, k, v, *seg, bias, out, lse, *extra)


forward = without_residuals(forward_with_residuals)


def _backward(
    residuals: tuple[Any, ...],
    d_out: jax.Array,
    *,
    d_lse: jax.Array | None = None,
    cfg: TpuFlashAttentionConfig | None = None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    precision: str = "highest",
) -> tuple[Any, ...]:
    """``(dq, dk, dv, None, None, None)`` from the residuals of :func:`forward_with_residuals`.

    ``d_lse`` (``[B, Hq, Sq]``), the cotangent of ``ejk.flash_attention_lse``'s natural log-sum-exp
    (the VJP names ``"lse"`` in ``extra_cotangents``), is subtracted from ``delta = rowsum(dO · O)``.
    """
    q, k, v, q_seg, kv_seg, bias, out, lse = residuals
    if bias is not None:
        raise ValueError("this backward does not support bias (the residuals carry one)")
    if min(q.shape[0], q.shape[1], q.shape[2], k.shape[1], v.shape[3]) == 0:
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None, None, None
    impl = functools.partial(_backward_impl, cfg=_resolve(cfg, q, k, v), causal=causal, softmax_scale=softmax_scale,
                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, interpret=_interpret(),
                             precision=precision)

    def run(*arrays: Any) -> tuple[Any, Any, Any]:  # d_lse positional too: vmap folds it like the others
        return impl(*arrays[:-1], d_lse=arrays[-1])

    dq, dk, dv = fold_vmap_into_batch(run)(q, k, v, q_seg, kv_seg, out, lse, d_out, d_lse)
    return dq, dk, dv, None, None, None


#: The registered backward: :func:`_backward`, the sinks' cotangent appended (from the residuals).
backward = sinks_backward(_backward)


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
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: bfloat16 / float16 / float32, any head dim and lengths, GQA, causal, windows, soft
    cap, segment ids; not a bias. Needs a TPU (untested on hardware), or interpret mode on the CPU.
    """
    del causal, softmax_scale, sliding_window, logits_soft_cap, q_segment_ids, kv_segment_ids
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    if len(dtypes) > 1:
        return f"q, k, v must share one dtype (got {', '.join(sorted(dtypes))})"
    if bias is not None:
        return "bias not supported (use platform='xla' for attention with a bias)"
    if _env.use_interpreter():
        return None
    if jax.default_backend() != "tpu":
        return f"needs a TPU (JAX's default backend is {jax.default_backend()})"
    return None


def heuristic_config(q: Any, k: Any, v: Any, *rest: Any, **__: Any) -> TpuFlashAttentionConfig:
    """128 x 128 blocks everywhere (the MXU's tile); 32 x 32 in interpret mode. Not measured on hardware."""
    del q, k, v, rest
    if _env.use_interpreter():
        return TpuFlashAttentionConfig(block_q=32, block_k=32, bwd_block_q=32, bwd_block_k=32)
    return TpuFlashAttentionConfig(block_q=128, block_k=128, bwd_block_q=128, bwd_block_k=128)


def config_space(q: Any, k: Any, v: Any, *rest: Any, **__: Any) -> list[TpuFlashAttentionConfig]:
    """The heuristic's config, then larger key blocks (untimed on hardware)."""
    first = heuristic_config(q, k, v)
    if _env.use_interpreter():
        return [first]
    return [first, TpuFlashAttentionConfig(block_q=128, block_k=256), TpuFlashAttentionConfig(block_q=256,
                                                                                            block_k=256)]
