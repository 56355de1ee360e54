"""Flash attention as Triton kernels (FlashAttention-2 style), forward and backward.

The forward kernel keeps an online softmax per block of query rows and saves the base-2
log-sum-exp; the backward pass runs three kernels that reuse the saved output and
log-sum-exp: ``delta = rowsum(d_out · out)``, then dk / dv (one program per key block and kv
head, looping over the q heads of its group: GQA without repeating k / v, no atomics), then dq
(one program per query block and q head; it also accumulates the bias gradient, summing the
bias's broadcast heads, rows and keys in the kernel and its broadcast batch afterwards). Causal and sliding-window masks
bound every loop, so fully masked blocks are never loaded, and only the edge blocks of a loop
compute position masks. See ``_attention_kernels`` for the kernels. Under ``jax.vmap`` the
mapped axis is folded into the batch (one launch; jax-triton's call itself does not batch).

The plugin registers :func:`forward` with the pair :func:`forward_with_residuals` /
:func:`backward` (:data:`RESIDUALS` names their format), from which the core builds the custom
VJP, plus :func:`config_space`, :func:`heuristic_config` and :func:`capability`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.custom_batching
import jax.numpy as jnp

from ejk.config.validators import int_in, one_of, power_of_two
from ejk.ops import FLASH_RESIDUALS, sinks_backward, without_residuals
from ejk.tiling import cdiv as _cdiv
from ejk.tiling import fit_block as _fit
from ejk.tiling import padded_dim as _head_dim
from ejk_triton import _env
from ejk_triton._device import compute_capability_reason as _compute_capability_reason
from ejk_triton._device import smem_limit as _smem_limit
from ejk_triton._dots import dot_precision
from ejk_triton._launch import kernels, launch

#: The residual format of :func:`forward_with_residuals`: inputs, output and base-2 log-sum-exp.
RESIDUALS = FLASH_RESIDUALS

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

_MAX_HEAD_DIM = 256
_MAX_GRID_Y = 65535







_block = power_of_two(16)
_warps = one_of(1, 2, 4, 8, 16)
_stages = int_in(1, 8)


@attrs.frozen(kw_only=True)
class FlashAttentionConfig:
    """Tile sizes and launch parameters of the Triton flash attention.

    Blocks are clamped to the (power-of-two rounded) sequence lengths, never below 16.

    Attributes:
        block_m: Forward: query rows per program.
        block_n: Forward: keys per inner-loop step.
        num_warps: Forward: warps per program.
        num_stages: Forward: software-pipelining stages of the key loop.
        bwd_block_m: Backward: query rows per step of the dk/dv kernel (and keys per step of the dq kernel).
        bwd_block_n: Backward: keys per program of the dk/dv kernel (and query rows per program of the dq kernel).
        bwd_num_warps: Backward: warps per program.
        bwd_num_stages: Backward: pipelining stages.
    """

    block_m: int = attrs.field(validator=_block)
    block_n: int = attrs.field(validator=_block)
    num_warps: int = attrs.field(default=4, validator=_warps)
    num_stages: int = attrs.field(default=2, validator=_stages)
    bwd_block_m: int = attrs.field(default=32, validator=_block)
    bwd_block_n: int = attrs.field(default=64, validator=_block)
    bwd_num_warps: int = attrs.field(default=4, validator=_warps)
    bwd_num_stages: int = attrs.field(default=2, validator=_stages)


# ----------------------------------------------------------------------------------------------
# Shapes, constexprs and blocks
# ----------------------------------------------------------------------------------------------


def _bias_strides(bias: Any) -> tuple[int, int, int, int]:
    """Element strides of a contiguous ``[Bb, Hb, Sqb, Skb]`` bias, 0 along its broadcast dims."""
    shape = tuple(int(n) for n in bias.shape)
    strides = [1] * 4
    for axis in (2, 1, 0):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return tuple(0 if n == 1 else s for n, s in zip(shape, strides, strict=True))  # type: ignore[return-value]


def _constexprs(
    q: Any, k: Any, v: Any, bias: Any, has_seg: bool, *, causal: bool, softmax_scale: float,
    sliding_window: tuple[int, int] | None, logits_soft_cap: float | None, precision: str = "highest",
) -> dict[str, Any]:
    """The kernels' shared ``constexpr`` arguments for one call."""
    _, q_len, q_heads, head_dim = (int(n) for n in q.shape)
    kv_len, kv_heads = int(k.shape[1]), int(k.shape[2])
    v_dim = int(v.shape[3])
    reach = q_len + kv_len  # a wider window changes nothing; keeps the constants small
    left, right = (0, 0) if sliding_window is None else (min(int(sliding_window[0]), reach),
                                                         min(int(sliding_window[1]), reach))
    bias_strides = _bias_strides(bias) if bias is not None else (0, 0, 0, 0)
    return dict(
        SCALE=float(softmax_scale), CAP=float(logits_soft_cap or 1.0), SQ=q_len, SK=kv_len, HQ=q_heads,
        GROUP=q_heads // kv_heads, D=head_dim, DV=v_dim, HEAD_DIM=_head_dim(head_dim), HEAD_DIM_V=_head_dim(v_dim),
        BIAS_SB=bias_strides[0], BIAS_SH=bias_strides[1], BIAS_SQ=bias_strides[2], BIAS_SK=bias_strides[3],
        CAUSAL=bool(causal), WINDOW=sliding_window is not None, WIN_L=left, WIN_R=right,
        HAS_CAP=logits_soft_cap is not None, HAS_BIAS=bias is not None, HAS_SEG=has_seg,
        DOT_PREC=dot_precision(q.dtype, precision),  # 16-bit operands ignore it
    )


def _dbias_layout(q: Any, bias: Any) -> tuple[tuple[int, ...], dict[str, Any]]:
    """Shape and ``constexpr`` strides of the bias-gradient buffer the dq kernel accumulates into.

    The buffer is ``[B, Hb, Sqb, Skb]`` float32: the bias's shape with the full batch. Heads, rows
    and keys the bias broadcasts over are summed in the kernel (stride 0, atomics where programs
    meet); the batch is summed by the caller, so a vmap folded into the batch stays per-example.
    """
    if bias is None:
        return (1,), dict(DBIAS_SB=0, DBIAS_SH=0, DBIAS_SQ=0, DBIAS_SK=0, DBIAS_ATOMIC=False)
    batch, q_heads = int(q.shape[0]), int(q.shape[2])
    heads, rows, cols = (int(n) for n in bias.shape[1:])
    strides = dict(
        DBIAS_SB=heads * rows * cols, DBIAS_SH=rows * cols if heads > 1 else 0,
        DBIAS_SQ=cols if rows > 1 else 0, DBIAS_SK=1 if cols > 1 else 0,
        DBIAS_ATOMIC=heads == 1 and q_heads > 1,  # the q heads of one batch row meet on one element
    )
    return (batch, heads, rows, cols), strides


def _optional_inputs(q: jax.Array, q_seg: Any, kv_seg: Any, bias: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Segment ids as int32 and the bias; ``q`` stands in (never read) for absent ones."""
    if q_seg is None or kv_seg is None:
        q_seg = kv_seg = q
    else:
        q_seg, kv_seg = q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32)
    return q_seg, kv_seg, q if bias is None else bias


def _resolve(cfg: FlashAttentionConfig | None, q: Any, k: Any, v: Any, bias: Any, causal: bool) -> FlashAttentionConfig:
    return heuristic_config(q, k, v, None, None, bias, causal=causal) if cfg is None else cfg


# ----------------------------------------------------------------------------------------------
# Forward and backward
# ----------------------------------------------------------------------------------------------


def _forward_kernels(cfg: FlashAttentionConfig, static: dict[str, Any], q: jax.Array, k: jax.Array, v: jax.Array,
                     q_segment_ids: jax.Array | None, kv_segment_ids: jax.Array | None,
                     bias: jax.Array | None, sinks: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Launch the forward kernel: ``(out, lse)`` (``sinks``: ``[B, Hq]`` float32 or ``None``)."""
    batch, q_len, q_heads, _ = q.shape
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    q_seg, kv_seg, bias_arg = _optional_inputs(q, q_segment_ids, kv_segment_ids, bias)
    consts = _constexprs(q, k, v, bias, has_seg, **static)
    block_m, block_n = _fit(cfg.block_m, q_len), _fit(cfg.block_n, k.shape[1])
    out, lse = launch(
        kernels().flash_fwd_kernel,
        grid=(_cdiv(q_len, block_m), batch * q_heads),
        inputs=(q, k, v, q_seg, kv_seg, bias_arg, q if sinks is None else sinks),
        out_shapes=(jax.ShapeDtypeStruct((batch, q_len, q_heads, v.shape[3]), q.dtype),
                    jax.ShapeDtypeStruct((batch, q_heads, q_len), jnp.float32)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_SINKS=sinks is not None, **consts,
    )
    return out, lse


def _backward_kernels(cfg: FlashAttentionConfig, static: dict[str, Any], q: jax.Array, k: jax.Array,
                      v: jax.Array, q_segment_ids: jax.Array | None, kv_segment_ids: jax.Array | None,
                      bias: jax.Array | None, out: jax.Array, lse: jax.Array,
                      d_out: jax.Array, d_lse: jax.Array | None = None) -> tuple[jax.Array, ...]:
    """Launch the three backward kernels: ``(dq, dk, dv, dbias, delta)`` (:func:`_dbias_layout`; ``[1]`` without
    bias; ``delta`` the ``[B, Hq, Sq]`` float32 ``rowsum(d_out · out) − d_lse`` the kernels used).

    ``d_lse`` (``[B, Hq, Sq]``), the cotangent of a natural log-sum-exp output, enters the logits'
    gradient as ``p · (dp - delta + d_lse)``: it is subtracted from ``delta``.
    """
    batch, q_len, q_heads, _ = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    q_seg, kv_seg, bias_arg = _optional_inputs(q, q_segment_ids, kv_segment_ids, bias)
    consts = _constexprs(q, k, v, bias, has_seg, **static)
    mod = kernels()
    pre_m = _fit(64, q_len)
    (delta,) = launch(
        mod.flash_bwd_preprocess_kernel, grid=(_cdiv(q_len, pre_m), batch * q_heads), inputs=(out, d_out),
        out_shapes=(jax.ShapeDtypeStruct((batch, q_heads, q_len), jnp.float32),), num_warps=4, num_stages=1,
        SQ=q_len, HQ=q_heads, DV=consts["DV"], HEAD_DIM_V=consts["HEAD_DIM_V"], BLOCK_M=pre_m,
    )
    if d_lse is not None:
        delta = delta - d_lse.astype(jnp.float32)
    common = (q, k, v, q_seg, kv_seg, bias_arg, d_out, lse, delta)
    warps, stages = cfg.bwd_num_warps, cfg.bwd_num_stages
    dkdv_m, dkdv_n = _fit(cfg.bwd_block_m, q_len), _fit(cfg.bwd_block_n, kv_len)
    dk, dv = launch(
        mod.flash_bwd_dkdv_kernel, grid=(_cdiv(kv_len, dkdv_n), batch * kv_heads), inputs=common,
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        num_warps=warps, num_stages=stages, BLOCK_M=dkdv_m, BLOCK_N=dkdv_n, **consts,
    )
    dq_m, dq_n = _fit(cfg.bwd_block_n, q_len), _fit(cfg.bwd_block_m, kv_len)
    dbias_shape, dbias_consts = _dbias_layout(q, bias)
    dq, ds = launch(
        mod.flash_bwd_dq_kernel, grid=(_cdiv(q_len, dq_m), batch * q_heads), inputs=common,
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(dbias_shape, jnp.float32)),
        num_warps=warps, num_stages=stages, zeroed_outputs=(1,) if bias is not None else (),
        BLOCK_M=dq_m, BLOCK_N=dq_n, **consts, **dbias_consts,
    )
    return dq, dk, dv, ds, delta


def _fold_vmap(fn: Callable[..., tuple[jax.Array, ...]]) -> Callable[..., tuple[jax.Array, ...]]:
    """``fn`` (arrays with a leading batch dim, or ``None``) with a vmap rule that folds the mapped axis into the batch.

    jax-triton's call does not batch, and one launch over ``V · B`` sequences beats ``V`` launches.
    Unmapped arguments are broadcast along the mapped axis, except a bias broadcast over the batch
    (leading dim 1), which stays broadcast; a mapped bias of batch 1 is broadcast to the batch.
    Outputs that are not batch-shaped (the ``[1]`` placeholder) are broadcast back.
    """
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def rule(axis_size: int, in_batched: Any, *args: Any) -> tuple[tuple[jax.Array, ...], tuple[bool, ...]]:
        batch = args[0].shape[1] if in_batched[0] else args[0].shape[0]
        merged: list[Any] = []
        for x, mapped in zip(args, in_batched, strict=True):
            if x is None:
                merged.append(None)
                continue
            if not mapped:
                if x.shape[0] == 1 and batch != 1:  # broadcast over the batch: valid for the merged batch too
                    merged.append(x)
                    continue
                x = jnp.broadcast_to(x, (axis_size, *x.shape))
            elif x.shape[1] == 1 and batch != 1:
                x = jnp.broadcast_to(x, (axis_size, batch, *x.shape[2:]))
            merged.append(x.reshape(axis_size * x.shape[1], *x.shape[2:]))
        outs = wrapped(*merged)
        result = tuple(o.reshape(axis_size, batch, *o.shape[1:]) if o.shape[0] == axis_size * batch
                       else jnp.broadcast_to(o, (axis_size, *o.shape)) for o in outs)
        return result, tuple(True for _ in result)

    return wrapped


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
    cfg: FlashAttentionConfig | None = None,
) -> tuple[jax.Array, tuple[Any, ...]]:
    """The output and the residuals :func:`backward` needs.

    Arguments are those of :func:`flash_attention` (already normalised by the op layer); ``sinks``
    ``[Hq]`` enter the kernel's final normalisation, ``precision`` sets the float32 dots
    (``"highest"``: IEEE, ``"high"``: 3xTF32, ``"default"``: TF32).

    Returns:
        ``(out, residuals)``: ``out`` ``[B, Sq, Hq, Dv]`` in ``q.dtype``; ``residuals`` =
        ``(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse)`` with ``lse`` the base-2
        log-sum-exp ``[B, Hq, Sq]`` float32 (``+inf`` for rows that see no key), the sinks
        appended when given (the lse then includes them: ``ejk.plugin.FLASH_RESIDUALS``).
    """
    has_seg = q_segment_ids is not None and kv_segment_ids is not None
    seg = (q_segment_ids, kv_segment_ids) if has_seg else (None, None)
    extra = () if sinks is None else (sinks,)
    batch, q_len, q_heads, _ = q.shape
    if min(batch, q_len, q_heads, k.shape[1], v.shape[3]) == 0:  # nothing to launch: rows see no key
        out = jnp.zeros((batch, q_len, q_heads, v.shape[3]), q.dtype)
        return out, (q, k, v, *seg, bias, out, jnp.full((batch, q_heads, q_len), jnp.inf, jnp.float32), *extra)
    cfg = _resolve(cfg, q, k, v, bias, causal)
    static = dict(causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                  logits_soft_cap=logits_soft_cap, precision=precision)
    rows = None if sinks is None else jnp.broadcast_to(sinks.astype(jnp.float32), (batch, q_heads))
    out, lse = _fold_vmap(functools.partial(_forward_kernels, cfg, static))(q, k, v, *seg, bias, rows)
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
    precision: str = "highest",
    return_delta: bool = False,
) -> tuple[Any, ...]:
    """Gradients from the residuals of :func:`forward_with_residuals` and the output cotangent.

    ``d_lse`` (``[B, Hq, Sq]``), the cotangent of ``ejk.flash_attention_lse``'s natural log-sum-exp
    (the core passes it: the VJP names ``"lse"`` in ``extra_cotangents``), enters the logits'
    gradient as ``p · (dp - delta + d_lse)``: it is subtracted from ``delta``.

    Returns:
        ``(dq, dk, dv, None, None, dbias)``: one cotangent per array argument in the order
        q, k, v, q_segment_ids, kv_segment_ids, bias (``dbias`` is ``None`` without a bias); with
        ``return_delta``, the kernels' ``[B, Hq, Sq]`` ``rowsum(d_out · out) − d_lse`` appended.
    """
    q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse = residuals
    if min(q.shape[0], q.shape[1], q.shape[2], k.shape[1], v.shape[3]) == 0:
        zero_bias = None if bias is None else jnp.zeros_like(bias)
        empty = (jnp.zeros(lse.shape, jnp.float32),) if return_delta else ()
        return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v), None, None, zero_bias, *empty
    static = dict(causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                  logits_soft_cap=logits_soft_cap, precision=precision)
    cfg = _resolve(cfg, q, k, v, bias, causal)
    run = _fold_vmap(functools.partial(_backward_kernels, cfg, static))
    dq, dk, dv, ds, delta = run(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse, d_out.astype(q.dtype), d_lse)
    dbias = None
    if bias is not None:
        axes = tuple(a for a in range(4) if bias.shape[a] == 1 and ds.shape[a] != 1)
        dbias = (jnp.sum(ds, axis=axes, keepdims=True) if axes else ds).astype(bias.dtype)
    return (dq, dk, dv, None, None, dbias, *((delta,) if return_delta else ()))


#: The backward of :func:`forward_with_residuals`: ``(dq, dk, dv, None, None, dbias, dsinks)`` (the sinks'
#: cotangent from the lse and the kernels' own ``delta``: the kernels need no change, their lse includes the sinks).
backward = sinks_backward(_backward, delta=True)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------

_DTYPES = ("bfloat16", "float16", "float32")
_MAX_HEAD_DIM_F32 = 128


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

    Supported: bfloat16 / float16 q, k, v with head dims up to 256 (q/k and v may differ), float32
    (IEEE float32 dots, slower) up to 128; any lengths; GQA / MQA; causal; sliding windows; soft
    cap; segment ids; a float bias broadcastable to ``[B, Hq, Sq, Sk]`` (its gradient accumulates
    in a float32 buffer of the bias's shape with the full batch). Needs an NVIDIA GPU (compute
    capability 8.0+), except in the interpreter mode (``EJK_TRITON_INTERPRET=1``).
    """
    del causal, softmax_scale, sliding_window, logits_soft_cap, q_segment_ids, kv_segment_ids
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    if len(dtypes) > 1:
        return f"q, k, v must share one dtype (got {', '.join(sorted(dtypes))})"
    limit = _MAX_HEAD_DIM_F32 if "float32" in dtypes else _MAX_HEAD_DIM
    for name, dim in (("head_dim", int(q.shape[3])), ("v head_dim", int(v.shape[3]))):
        if dim > limit:
            return f"{name} {dim} not supported{' in float32' if 'float32' in dtypes else ''} (at most {limit})"
    if int(q.shape[0]) * int(q.shape[2]) > _MAX_GRID_Y:
        return f"batch × q heads = {int(q.shape[0]) * int(q.shape[2])} exceeds the grid limit {_MAX_GRID_Y}"
    if bias is not None and not jnp.issubdtype(bias.dtype, jnp.floating):
        return f"bias of dtype {jnp.dtype(bias.dtype).name} not supported (floating point only)"
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return _compute_capability_reason()


def _smem_bytes(cfg: FlashAttentionConfig, head_dim: int, v_dim: int, itemsize: int = 2,
                bias_itemsize: int = 0) -> int:
    """Largest shared-memory footprint (bytes) of the three main kernels' pipelined tiles.

    Matches what triton 3.6 reports for sm_90 on the tables below (within 1 KiB; the bias
    term, ``stages`` bias tiles, over-counts the forward's by one tile).
    """
    d = _head_dim(head_dim) + _head_dim(v_dim)
    fwd = (cfg.block_m * _head_dim(head_dim) + cfg.num_stages * cfg.block_n * d) * itemsize
    fwd += cfg.num_stages * cfg.block_m * cfg.block_n * bias_itemsize
    bwd = (cfg.bwd_block_n * d + cfg.bwd_num_stages * cfg.bwd_block_m * d) * itemsize
    bwd += cfg.bwd_num_stages * cfg.bwd_block_m * cfg.bwd_block_n * bias_itemsize
    return max(fwd, bwd)


def _fitting(q: Any, v: Any, bias: Any, causal: bool) -> list[FlashAttentionConfig]:
    """The candidate configs whose tiles fit this GPU's shared memory, in table order."""
    d, dv = int(q.shape[3]), int(v.shape[3])
    itemsize = jnp.dtype(q.dtype).itemsize
    bias_itemsize = 0 if bias is None else jnp.dtype(bias.dtype).itemsize
    limit = _smem_limit()
    configs = [_make(fwd, bwd) for fwd, bwd in _candidates(q, v, causal)]
    fitting = [c for c in configs if _smem_bytes(c, d, dv, itemsize, bias_itemsize) <= limit]
    if fitting:
        return list(dict.fromkeys(fitting))
    return [min(configs, key=lambda c: _smem_bytes(c, d, dv, itemsize, bias_itemsize))]


_Tiles = tuple[tuple[int, int, int, int], tuple[int, int, int, int]]

# (block_m, block_n, num_warps, num_stages) forward x (bwd_block_m, bwd_block_n, warps, stages) backward.
# Each line compiles for sm_90 without register spills (ptxas, triton 3.6) and fits the shared memory;
# the last of each is the small fallback for GPUs with 99 KiB per block (it spills a little at D = 256).
_GPU_CANDIDATES: dict[int, tuple[_Tiles, ...]] = {
    64: (((128, 64, 4, 3), (32, 128, 4, 3)), ((128, 128, 8, 3), (64, 128, 8, 2)), ((128, 64, 8, 3), (32, 64, 4, 3)),
         ((64, 64, 4, 3), (32, 128, 8, 3)), ((128, 32, 4, 4), (16, 128, 4, 3)), ((128, 128, 4, 2), (32, 128, 4, 4)),
         ((64, 32, 4, 2), (16, 64, 4, 2))),
    # The backward's dk/dv accumulators ([128, 128] float32 each) need 8 warps at D = 128 to stay in registers.
    # 32 x 64 / 4 warps / 3 stages measured the fastest backward without a causal mask, 64 x 128 / 8 warps /
    # 1 stage with one (see _CAUSAL_FIRST; benchmarks/results/kernel_defaults_h100.md).
    128: (((128, 64, 8, 3), (32, 64, 4, 3)), ((128, 64, 8, 3), (64, 128, 8, 1)), ((128, 64, 8, 3), (32, 128, 8, 3)),
          ((128, 128, 8, 2), (64, 128, 8, 2)), ((128, 32, 4, 3), (32, 128, 8, 2)), ((64, 64, 4, 3), (16, 128, 8, 3)),
          ((128, 64, 8, 2), (64, 64, 8, 2)), ((64, 32, 4, 2), (16, 64, 4, 2))),
    256: (((64, 64, 8, 2), (16, 64, 8, 2)), ((64, 32, 4, 3), (16, 64, 8, 2)), ((128, 32, 8, 2), (16, 64, 8, 2)),
          ((64, 64, 8, 1), (16, 64, 8, 2)), ((64, 32, 4, 1), (16, 64, 8, 1))),
}

# float32 tiles take twice the shared memory, and IEEE float32 dots run on FMA units with their
# operands in registers (they spill at every size tried): small tiles, a correct but slow path.
_GPU_CANDIDATES_F32: dict[int, tuple[_Tiles, ...]] = {
    64: (((64, 32, 4, 2), (16, 64, 4, 2)), ((128, 32, 8, 2), (32, 32, 4, 2)), ((64, 64, 4, 2), (32, 64, 4, 2))),
    128: (((64, 32, 8, 2), (16, 64, 8, 2)), ((32, 32, 4, 2), (16, 32, 4, 2)), ((64, 64, 8, 2), (32, 64, 8, 1))),
}


#: Per head-dim class, the candidate that goes first when the mask is causal (measured on an H100).
_CAUSAL_FIRST = {128: ((128, 64, 8, 3), (64, 128, 8, 1))}


def _candidates(q: Any, v: Any, causal: bool) -> tuple[_Tiles, ...]:
    dim = _dim_class(q, v)
    if jnp.dtype(q.dtype) == jnp.float32:
        return _GPU_CANDIDATES_F32[min(dim, 128)]
    table = _GPU_CANDIDATES[dim]
    first = _CAUSAL_FIRST.get(dim) if causal else None
    return table if first is None else (first, *(c for c in table if c != first))


def _dim_class(q: Any, v: Any) -> int:
    d = max(_head_dim(int(q.shape[3])), _head_dim(int(v.shape[3])))
    return 64 if d <= 64 else 128 if d <= 128 else 256


def _make(fwd: tuple[int, int, int, int], bwd: tuple[int, int, int, int]) -> FlashAttentionConfig:
    return FlashAttentionConfig(block_m=fwd[0], block_n=fwd[1], num_warps=fwd[2], num_stages=fwd[3],
                                bwd_block_m=bwd[0], bwd_block_n=bwd[1], bwd_num_warps=bwd[2], bwd_num_stages=bwd[3])


def config_space(q: Any, k: Any, v: Any, *rest: Any, causal: bool = False, **__: Any) -> list[FlashAttentionConfig]:
    """Autotuning candidates (tables for Hopper-class GPUs), pruned by a shared-memory estimate.

    Args:
        q: ``[B, Sq, Hq, D]`` (anything with ``.shape`` and ``.dtype``).
        k: ``[B, Sk, Hkv, D]``.
        v: ``[B, Sk, Hkv, Dv]``.
        *rest: Further abstract arguments of the op: ``q_segment_ids, kv_segment_ids, bias``
            (the bias's tiles count against shared memory).
        causal: Whether the mask is causal (it changes which tiles go first).
        **__: Other static arguments of the op, ignored.

    Returns:
        A handful of distinct configs, the heuristic's choice first.
    """
    del k
    if _env.interpret_mode() and not _env.nvidia_gpu()[0]:
        return [heuristic_config(q, q, v)]
    return _fitting(q, v, rest[2] if len(rest) > 2 else None, causal)


def heuristic_config(q: Any, k: Any, v: Any, *rest: Any, causal: bool = False, **__: Any) -> FlashAttentionConfig:
    """A default by head dim and mask (D = 128 timed on an H100; the others are the usual FlashAttention-2 tiles).

    D <= 64: 128 x 64 forward tiles, 4 warps, 3 stages; D <= 128: 128 x 64, 8 warps, 3 stages;
    D <= 256: 64 x 64, 8 warps, 2 stages (shared memory). Backward (dk/dv tiles; dq uses them
    transposed): D <= 64: 32 x 128; D <= 128: 32 x 64, 4 warps, 3 stages, or with a causal mask
    64 x 128, 8 warps, 1 stage (with more stages triton 3.6 serialises that kernel's warpgroup
    MMAs, ptxas warning C7515); D = 256: 16 x 64. float32 uses 64 x 32 tiles. The first of these
    that fits the GPU's shared memory (with a bias's tiles counted) wins. In the interpreter mode
    (CPU), 32 x 32 tiles keep the number of Python-level steps small.

    Args: as for :func:`config_space`.
    """
    del k
    if _env.interpret_mode() and not _env.nvidia_gpu()[0]:
        return FlashAttentionConfig(block_m=32, block_n=32, bwd_block_m=16, bwd_block_n=32)
    return _fitting(q, v, rest[2] if len(rest) > 2 else None, causal)[0]
