"""Packed variable-length flash attention as Triton kernels, forward and backward.

The grid runs over blocks of *packed* query rows (and q heads), not over sequences, so no
``max_seqlen`` is needed and a new packing of the same shapes reuses the compiled kernels. Each
packed row ``i`` sees the key interval ``[lo[i], hi[i])`` (:func:`ejk.plugin.varlen_row_ranges`,
computed in O(T) from the offsets: per-sequence causal masks and windows included); both ends are
non-decreasing, so a block of rows loops over the key blocks covering ``[lo[first], hi[last])``
only: blocks outside the sequences' band (and, with causal masks and windows, outside the band
they allow) are never loaded. Why packed row blocks rather than a (sequence, block) grid: where
sequences are multiples of the block (the usual packing) no program straddles two sequences and
none is idle; otherwise one block per boundary works on the union of two neighbours' ranges,
about what a per-sequence grid's partial last blocks waste, without a block table to build. The
backward pass saves the output and the base-2 log-sum-exp (sink included) and runs two kernels:
dk / dv (one program per key block and kv head, looping over the q heads of its group, GQA
without repeating k / v, over the query rows that see the block: a contiguous range found with
``searchsorted``), then dq (one program per query block and q head), after a kernel for ``delta =
rowsum(d_out · out)``; the sinks' gradient ``-Σ_rows 2^{sink·log2 e - lse2} · delta`` is computed in JAX.
Every ``searchsorted`` here is unrolled into one fused computation: the default method is an XLA
while loop, a kernel launch (or more) per level of the binary search.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import cdiv, cotangent_like, fit_block, int_in, one_of, padded_dim, power_of_two, varlen_row_ranges
from ejk_triton import _env
from ejk_triton._device import compute_capability_reason
from ejk_triton._device import smem_limit as _smem_limit
from ejk_triton._dots import dot_precision
from ejk_triton._launch import kernels, launch

__all__ = ["VarlenAttentionConfig", "capability", "config_space", "flash_attention_varlen", "heuristic_config"]

_LOG2E = 1.4426950408889634
_MAX_HEAD_DIM = 256
_MAX_HEAD_DIM_F32 = 128
_MAX_GRID_Y = 65535
_MAX_ELEMENTS = 2**30  # int32 offsets inside the kernels

_block = power_of_two(16)
_warps = one_of(1, 2, 4, 8, 16)
_stages = int_in(1, 8)


@attrs.frozen(kw_only=True)
class VarlenAttentionConfig:
    """Tile sizes and launch parameters of the Triton varlen attention (blocks clamped to the packed lengths).

    Attributes:
        block_m: Forward: packed query rows per program.
        block_n: Forward: keys per loop step.
        num_warps: Forward: warps per program.
        num_stages: Forward: pipelining stages of the key loop.
        bwd_block_m: Backward: query rows per step of the dk/dv kernel (keys per step of the dq kernel).
        bwd_block_n: Backward: keys per program of the dk/dv kernel (query rows per program of the dq kernel).
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


@attrs.frozen
class _Static:
    scale: float
    cap: float | None
    precision: str
    cfg: VarlenAttentionConfig
    reverse: bool = False  # causal / windowed: row blocks run last-first (the longest first in each sequence)


class _Intervals(NamedTuple):
    """What the kernels need to know about the visible keys, beyond ``lo`` / ``hi`` (all int32, traced).

    ``hull``: non-decreasing ``(lo', hi')`` with ``lo' <= lo`` and ``hi' >= hi`` (the rows that see a key
    block are a contiguous range of it); ``inner``: non-decreasing ``(lo'', hi'')`` with ``lo'' >= lo`` and
    ``hi'' <= hi`` (the rows that see a key block whole, found the same way). A block of rows reads its
    bounds from them, ``hull_lo[first]``, ``hull_hi[last]``, ``inner_lo[last]``, ``inner_hi[first]``, instead
    of reducing over its rows. With segment ids, ``ids`` (q, k) and ``inexact`` (:func:`inexact_prefix`).
    """

    hull_lo: jax.Array
    hull_hi: jax.Array
    inner_lo: jax.Array
    inner_hi: jax.Array
    qseg: jax.Array | None = None
    kseg: jax.Array | None = None
    inexact: jax.Array | None = None


def inexact_prefix(exact: jax.Array) -> jax.Array:
    """``[T + 1]`` int32: how many of the first ``i`` rows have intervals that are not exact (``exact`` 0),
    so that a range of rows ``[a, b)`` is exact iff ``prefix[b] == prefix[a]``."""
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(1 - exact.astype(jnp.int32), dtype=jnp.int32)])


def _consts(st: _Static, q: Any, k: Any, v: Any) -> dict[str, Any]:
    tq, hq, d = (int(n) for n in q.shape)
    tk, hkv, dv = int(k.shape[0]), int(k.shape[1]), int(v.shape[2])
    return dict(TQ=tq, TK=tk, HQ=hq, GROUP=hq // hkv, D=d, DV=dv, HEAD_DIM=padded_dim(d), HEAD_DIM_V=padded_dim(dv),
                SCALE=st.scale, CAP=float(st.cap or 1.0), HAS_CAP=st.cap is not None,
                DOT_PREC=dot_precision(q.dtype, st.precision))


def _seg_args(q: jax.Array, ivals: _Intervals) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Segment ids and the inexact prefix as int32, or ``q`` standing in (never read) without them."""
    if ivals.qseg is None or ivals.kseg is None or ivals.inexact is None:
        return q, q, q
    return ivals.qseg.astype(jnp.int32), ivals.kseg.astype(jnp.int32), ivals.inexact


def _search(sorted_values: jax.Array, queries: jax.Array, side: str) -> jax.Array:
    """``searchsorted`` as one fused computation (the default method is an XLA while loop: a launch per level)."""
    return jnp.searchsorted(sorted_values, queries, side=side, method="scan_unrolled").astype(jnp.int32)


def _forward(st: _Static, q: jax.Array, k: jax.Array, v: jax.Array, lo: jax.Array, hi: jax.Array, ivals: _Intervals,
             sinks: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """``(out [TQ, HQ, DV], lse2 [HQ, TQ])``."""
    tq, hq, _ = q.shape
    block_m, block_n = fit_block(st.cfg.block_m, tq), fit_block(st.cfg.block_n, k.shape[0])
    sink_arg = q if sinks is None else sinks.astype(jnp.float32)  # q stands in (never read) without sinks
    bounds = (ivals.hull_lo, ivals.hull_hi, ivals.inner_lo, ivals.inner_hi)
    out, lse = launch(
        kernels("_varlen_kernels").varlen_fwd_kernel, grid=(cdiv(tq, block_m) * hq,),
        inputs=(q, k, v, lo, hi, *bounds, *_seg_args(q, ivals), sink_arg),
        out_shapes=(jax.ShapeDtypeStruct((tq, hq, v.shape[2]), q.dtype), jax.ShapeDtypeStruct((hq, tq), jnp.float32)),
        num_warps=st.cfg.num_warps, num_stages=st.cfg.num_stages, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_SINKS=sinks is not None, HAS_SEG=ivals.qseg is not None, REVERSE=st.reverse, **_consts(st, q, k, v),
    )
    return out, lse


def key_block_rows(lo: jax.Array, hi: jax.Array, hull_lo: jax.Array, hull_hi: jax.Array, inner_lo: jax.Array,
                   inner_hi: jax.Array, inexact: jax.Array | None, tk: int, block_m: int,
                   block_n: int) -> tuple[jax.Array, ...]:
    """Per key block ``[start, start + block_n)``: ``(q_lo, q_hi, full_lo, full_hi, exact)``, int32 each.

    Rows ``[q_lo, q_hi)`` may see the block (``q_lo`` a multiple of ``block_m``), rows ``[full_lo, full_hi)``
    see all of it, and ``exact`` is 1 where every row of ``[q_lo, q_hi)`` has an exact interval (all 1
    without segment ids; ``inexact``: :func:`inexact_prefix`)."""
    del lo, hi
    starts = jnp.arange(cdiv(tk, block_n), dtype=jnp.int32) * block_n
    # hi' > start and lo' < start + n: a contiguous range of rows, as both hulls are non-decreasing.
    q_lo = _search(hull_hi, starts, "right") // block_m * block_m
    q_hi = _search(hull_lo, starts + block_n, "left")
    # lo'' <= start and hi'' >= start + n (hence lo <= start, hi >= start + n): contiguous too.
    full_lo = _search(inner_hi, starts + block_n, "left")
    full_hi = _search(inner_lo, starts, "right")
    if inexact is None:
        flags = jnp.ones_like(starts)
    else:
        flags = (inexact[jnp.maximum(q_hi, q_lo)] == inexact[q_lo]).astype(jnp.int32)
    return q_lo, q_hi, full_lo, full_hi, flags


def _backward(st: _Static, residuals: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, lo, hi, ivals, sinks, out, lse = residuals
    tq, hq, _ = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    d_out = d_out.astype(q.dtype)
    consts = dict(_consts(st, q, k, v), HAS_SEG=ivals.qseg is not None)
    qseg, kseg, inexact = _seg_args(q, ivals)
    bounds = (ivals.hull_lo, ivals.hull_hi, ivals.inner_lo, ivals.inner_hi)
    cfg = st.cfg
    mod = kernels("_varlen_kernels")
    pre_m = fit_block(64, tq)
    (delta,) = launch(
        mod.varlen_bwd_preprocess_kernel, grid=(cdiv(tq, pre_m) * hq,), inputs=(out, d_out),
        out_shapes=(jax.ShapeDtypeStruct((hq, tq), jnp.float32),), num_warps=4, num_stages=1,
        TQ=tq, HQ=hq, DV=consts["DV"], HEAD_DIM_V=consts["HEAD_DIM_V"], BLOCK_M=pre_m,
    )
    m, n = fit_block(cfg.bwd_block_m, tq), fit_block(cfg.bwd_block_n, tk)
    q_lo, q_hi, full_lo, full_hi, kexact = key_block_rows(lo, hi, ivals.hull_lo, ivals.hull_hi, ivals.inner_lo,
                                                          ivals.inner_hi, ivals.inexact, tk, m, n)
    dk, dv = launch(
        mod.varlen_bwd_dkdv_kernel, grid=(cdiv(tk, n) * hkv,),
        inputs=(q, k, v, lo, hi, qseg, kseg, kexact, q_lo, q_hi, full_lo, full_hi, d_out, lse, delta),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages, BLOCK_M=m, BLOCK_N=n, **consts,
    )
    dq_m, dq_n = fit_block(cfg.bwd_block_n, tq), fit_block(cfg.bwd_block_m, tk)
    (dq,) = launch(
        mod.varlen_bwd_dq_kernel, grid=(cdiv(tq, dq_m) * hq,),
        inputs=(q, k, v, lo, hi, *bounds, qseg, kseg, inexact, d_out, lse, delta),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages, BLOCK_M=dq_m, BLOCK_N=dq_n, REVERSE=st.reverse,
        **consts,
    )
    d_sinks = None
    if sinks is not None:
        weight = jnp.exp2(sinks.astype(jnp.float32)[:, None] * _LOG2E - lse)  # lse includes the sink: finite
        d_sinks = cotangent_like(-jnp.sum(weight * delta, axis=1).astype(sinks.dtype), sinks)
    return dq, dk, dv, None, None, None, d_sinks


def _fa(st: _Static, q: Any, k: Any, v: Any, lo: Any, hi: Any, ivals: _Intervals, sinks: Any) -> jax.Array:
    return _forward(st, q, k, v, lo, hi, ivals, sinks)[0]


def _fa_fwd(st: _Static, q: Any, k: Any, v: Any, lo: Any, hi: Any, ivals: _Intervals,
            sinks: Any) -> tuple[jax.Array, Any]:
    out, lse = _forward(st, q, k, v, lo, hi, ivals, sinks)
    return out, (q, k, v, lo, hi, ivals, sinks, out, lse)


_varlen = jax.custom_vjp(_fa, nondiff_argnums=(0,))
_varlen.defvjp(_fa_fwd, _backward)


def flash_attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    sinks: jax.Array | None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    precision: str,
    cfg: VarlenAttentionConfig | None = None,
) -> jax.Array:
    """Packed varlen attention (arguments normalised, see KERNEL_CONTRACT.md); ``max_seqlen_*`` unused.

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del max_seqlen_q, max_seqlen_k
    tq, hq, _ = q.shape
    tk, dv = v.shape[0], v.shape[2]
    if min(tq, hq, tk, dv) == 0:
        return jnp.zeros((tq, hq, dv), q.dtype)
    cfg = heuristic_config(q, k, v, causal=causal) if cfg is None else cfg
    st = _Static(scale=float(softmax_scale), cap=None if logits_soft_cap is None else float(logits_soft_cap),
                 precision=precision, cfg=cfg, reverse=causal or sliding_window is not None)
    lo, hi = varlen_row_ranges(cu_seqlens_q, cu_seqlens_k, tq, tk, causal=causal, sliding_window=sliding_window)
    out: jax.Array = _varlen(st, q, k, v, lo, hi, _Intervals(lo, hi, lo, hi), sinks)
    return out


def attend_intervals(q: jax.Array, k: jax.Array, v: jax.Array, lo: jax.Array, hi: jax.Array, *,
                     hull: tuple[jax.Array, jax.Array] | None = None,
                     inner: tuple[jax.Array, jax.Array] | None = None,
                     segment_ids: tuple[jax.Array, jax.Array] | None = None, exact: jax.Array | None = None,
                     sinks: jax.Array | None = None, softmax_scale: float, logits_soft_cap: float | None,
                     precision: str, cfg: VarlenAttentionConfig, reverse: bool = False) -> jax.Array:
    """Differentiable packed attention where row ``i`` sees keys ``lo[i] <= j < hi[i]`` (and, with
    ``segment_ids = (q_ids, k_ids)``, only those of its id).

    ``hull`` / ``inner``: non-decreasing ``(lo', hi')`` with ``lo' <= lo``, ``hi' >= hi`` / ``(lo'', hi'')``
    with ``lo'' >= lo``, ``hi'' <= hi`` (both required when ``lo`` / ``hi`` are not non-decreasing
    themselves). ``exact`` (with segment ids; all 0 when absent): per row, 1 where ``[lo, hi)`` holds
    keys of the row's id only; blocks of such rows skip the id compare. ``reverse``: run row blocks
    last-first (causal / windowed intervals, where later rows see more keys)."""
    st = _Static(scale=float(softmax_scale), cap=None if logits_soft_cap is None else float(logits_soft_cap),
                 precision=precision, cfg=cfg, reverse=reverse)
    hull_lo, hull_hi = (lo, hi) if hull is None else hull
    inner_lo, inner_hi = (lo, hi) if inner is None else inner
    qseg, kseg = (None, None) if segment_ids is None else segment_ids
    inexact = None
    if qseg is not None:
        inexact = inexact_prefix(jnp.zeros(lo.shape, jnp.int32) if exact is None else exact)
    ivals = _Intervals(hull_lo, hull_hi, inner_lo, inner_hi, qseg, kseg, inexact)
    out: jax.Array = _varlen(st, q, k, v, lo, hi, ivals, sinks)
    return out


_DTYPES = ("bfloat16", "float16", "float32")


def capability(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: bfloat16 / float16 with head dims up to 256, float32 (every precision) up to 128;
    any packing, GQA / MQA, causal, windows, soft cap, sinks. Needs an NVIDIA GPU (compute
    capability 8.0+), except in the interpreter mode (``EJK_TRITON_INTERPRET=1``).
    """
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    unsupported = sorted(dtypes - set(_DTYPES))
    if unsupported:
        return f"{', '.join(unsupported)} not supported (bfloat16, float16 and float32 only)"
    limit = _MAX_HEAD_DIM_F32 if "float32" in dtypes else _MAX_HEAD_DIM
    for name, dim in (("head_dim", int(q.shape[2])), ("v head_dim", int(v.shape[2]))):
        if dim > limit:
            return f"{name} {dim} not supported{' in float32' if 'float32' in dtypes else ''} (at most {limit})"
    if int(q.shape[1]) > _MAX_GRID_Y:
        return f"{int(q.shape[1])} q heads exceed the grid limit {_MAX_GRID_Y}"
    for name, x in (("q", q), ("k", k), ("v", v)):
        size = 1
        for n in x.shape:
            size *= int(n)
        if size >= _MAX_ELEMENTS:
            return f"{name} has {size} elements; the kernels index with int32 (fewer than 2**30 elements each)"
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return compute_capability_reason()


# (block_m, block_n, warps, stages) forward x (bwd_block_m, bwd_block_n, warps, stages) backward, by head-dim
# class: the tiles of ejk-triton's dense flash attention for the same head dims and mask (the loops are the same
# shape), in the same order; its measurements (benchmarks/results/kernel_defaults_h100.md) pick the first.
_Tiles = tuple[tuple[int, int, int, int], tuple[int, int, int, int]]
_GPU_CANDIDATES: dict[int, tuple[_Tiles, ...]] = {
    64: (((128, 64, 4, 3), (32, 128, 4, 3)), ((128, 128, 8, 3), (64, 128, 8, 2)), ((64, 64, 4, 3), (32, 64, 4, 3)),
         ((64, 32, 4, 2), (16, 64, 4, 2))),
    128: (((128, 64, 8, 3), (32, 64, 4, 3)), ((128, 64, 8, 3), (64, 128, 8, 1)), ((128, 128, 8, 2), (64, 128, 8, 2)),
          ((64, 64, 4, 3), (16, 128, 8, 3)), ((64, 32, 4, 2), (16, 64, 4, 2))),
    256: (((64, 64, 8, 2), (16, 64, 8, 2)), ((64, 32, 4, 3), (16, 64, 8, 2)), ((64, 32, 4, 1), (16, 64, 8, 1))),
}
#: Per head-dim class, the candidate that goes first for causal calls (as for the dense kernels).
_CAUSAL_FIRST: dict[int, _Tiles] = {128: ((128, 64, 8, 3), (64, 128, 8, 1))}
_GPU_CANDIDATES_F32: dict[int, tuple[_Tiles, ...]] = {
    64: (((64, 32, 4, 2), (16, 64, 4, 2)), ((128, 32, 8, 2), (32, 32, 4, 2)), ((64, 64, 4, 2), (32, 64, 4, 2))),
    128: (((64, 32, 8, 2), (16, 64, 8, 2)), ((32, 32, 4, 2), (16, 32, 4, 2)), ((64, 64, 8, 2), (32, 64, 8, 1))),
}


def _smem_bytes(cfg: VarlenAttentionConfig, d: int, dv: int, itemsize: int) -> int:
    dims = padded_dim(d) + padded_dim(dv)
    fwd = (cfg.block_m * padded_dim(d) + cfg.num_stages * cfg.block_n * dims) * itemsize
    bwd = (cfg.bwd_block_n * dims + cfg.bwd_num_stages * cfg.bwd_block_m * dims) * itemsize
    return max(fwd, bwd)


def _fitting(q: Any, v: Any, causal: bool) -> list[VarlenAttentionConfig]:
    d, dv = int(q.shape[2]), int(v.shape[2])
    itemsize = jnp.dtype(q.dtype).itemsize
    dim = max(padded_dim(d), padded_dim(dv))
    cls = 64 if dim <= 64 else 128 if dim <= 128 else 256
    table: tuple[_Tiles, ...]
    if jnp.dtype(q.dtype) == jnp.float32:
        table = _GPU_CANDIDATES_F32[min(cls, 128)]
    else:
        table = _GPU_CANDIDATES[cls]
        first = _CAUSAL_FIRST.get(cls) if causal else None
        table = table if first is None else (first, *(c for c in table if c != first))
    configs = [VarlenAttentionConfig(block_m=f[0], block_n=f[1], num_warps=f[2], num_stages=f[3], bwd_block_m=b[0],
                                     bwd_block_n=b[1], bwd_num_warps=b[2], bwd_num_stages=b[3]) for f, b in table]
    fitting = [c for c in configs if _smem_bytes(c, d, dv, itemsize) <= _smem_limit()]
    return fitting or [min(configs, key=lambda c: _smem_bytes(c, d, dv, itemsize))]


def config_space(q: Any, k: Any, v: Any, *_: Any, causal: bool = False, **__: Any) -> list[VarlenAttentionConfig]:
    """Autotuning candidates (Hopper-class tables), pruned by a shared-memory estimate; ``causal`` changes
    which goes first."""
    del k
    if _env.interpret_mode() and not _env.nvidia_gpu()[0]:
        return [heuristic_config(q, q, v)]
    return _fitting(q, v, causal)


def heuristic_config(q: Any, k: Any, v: Any, *_: Any, causal: bool = False, **__: Any) -> VarlenAttentionConfig:
    """The first fitting tiles of :func:`config_space`'s table: those ejk-triton's dense flash attention
    picks for the head dim and mask (D = 128: 128 x 64 forward tiles, 8 warps, 3 stages; backward 32 x 64,
    4 warps, 3 stages, or with a causal mask 64 x 128, 8 warps, 1 stage); 16 x 16 tiles in the
    interpreter mode on the CPU (tiny test shapes)."""
    del k
    if _env.interpret_mode() and not _env.nvidia_gpu()[0]:
        return VarlenAttentionConfig(block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16)
    return _fitting(q, v, causal)[0]


def compile_kernels(q: Any, k: Any, v: Any, *, cfg: VarlenAttentionConfig | None = None, sinks: bool = False,
                    segment_ids: bool = False, logits_soft_cap: float | None = None, precision: str = "highest",
                    causal: bool = False, arch: int = 90) -> dict[str, dict[str, int]]:
    """Compile the four kernels one call would launch for compute capability ``arch`` (no GPU needed;
    not in the interpreter mode): per kernel (``forward``, ``preprocess``, ``dkdv``, ``dq``) its shared memory in
    bytes, warps and stages. Arguments are abstract arrays (``jax.ShapeDtypeStruct``) and static values."""
    from ejk_triton import _aot, _varlen_kernels

    _aot._compiled_mode()
    cfg = heuristic_config(q, k, v, causal=causal) if cfg is None else cfg
    st = _Static(scale=1.0 / float(int(q.shape[2])) ** 0.5, cap=logits_soft_cap, precision=precision, cfg=cfg)
    consts = dict(_consts(st, q, k, v), HAS_SEG=segment_ids)
    tq, tk = int(q.shape[0]), int(k.shape[0])
    ptr, i32, f32 = _aot._ptr, _aot._ptr(jnp.int32), _aot._ptr(jnp.float32)
    seg = i32 if segment_ids else ptr(q.dtype)
    ints = [i32, i32, seg, seg]
    bounds = [i32, i32, i32, i32]
    qkv = [ptr(q.dtype), ptr(k.dtype), ptr(v.dtype)]
    m, n = fit_block(cfg.bwd_block_m, tq), fit_block(cfg.bwd_block_n, tk)
    return {
        "forward": _aot._compile(_varlen_kernels.varlen_fwd_kernel,
                                 [*qkv, i32, i32, *bounds, seg, seg, seg, f32, ptr(q.dtype), f32],
                                 dict(consts, HAS_SINKS=sinks, REVERSE=causal, BLOCK_M=fit_block(cfg.block_m, tq),
                                      BLOCK_N=fit_block(cfg.block_n, tk)), cfg.num_warps, cfg.num_stages, arch),
        "preprocess": _aot._compile(_varlen_kernels.varlen_bwd_preprocess_kernel, [ptr(q.dtype), ptr(q.dtype), f32],
                                    dict(TQ=tq, HQ=consts["HQ"], DV=consts["DV"], HEAD_DIM_V=consts["HEAD_DIM_V"],
                                         BLOCK_M=fit_block(64, tq)), 4, 1, arch),
        "dkdv": _aot._compile(_varlen_kernels.varlen_bwd_dkdv_kernel,
                              [*qkv, *ints, i32, i32, i32, i32, i32, ptr(q.dtype), f32, f32, ptr(k.dtype),
                               ptr(v.dtype)],
                              dict(consts, BLOCK_M=m, BLOCK_N=n), cfg.bwd_num_warps, cfg.bwd_num_stages, arch),
        "dq": _aot._compile(_varlen_kernels.varlen_bwd_dq_kernel,
                            [*qkv, i32, i32, *bounds, seg, seg, seg, ptr(q.dtype), f32, f32, ptr(q.dtype)],
                            dict(consts, REVERSE=causal, BLOCK_M=fit_block(cfg.bwd_block_n, tq),
                                 BLOCK_N=fit_block(cfg.bwd_block_m, tk)), cfg.bwd_num_warps, cfg.bwd_num_stages, arch),
    }
