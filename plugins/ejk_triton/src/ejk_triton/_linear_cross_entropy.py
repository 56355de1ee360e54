"""``linear_cross_entropy`` as Triton kernels: the matmul tile fused with the online log-sum-exp.

Forward (``_lce_kernels.forward_kernel``): a grid of (token block, vocabulary split) programs; each
computes its logits tiles in registers and folds them into partial statistics ``[SPLITS, T]``,
merged here into ``(lse, z_label, z_sum)``. The splits give the GPU enough programs when ``T`` is
small; with ``T`` large one split (each program sweeps the whole vocabulary, and the programs of
one wave read the same ``w`` tiles from L2) does.

Backward: a scan over vocabulary chunks of ``chunk_v`` columns. For each,
``_lce_kernels.grad_logits_kernel`` recomputes the logits tiles and writes the chunk's logits
cotangent ``dz [T, chunk_v]`` in the operands' dtype (never the float32 logits), and the two
gradient products go to XLA's GEMM (cuBLAS): ``dx += dz @ w_chunkᵀ`` (float32 accumulator) and
``dw[:, chunk] = xᵀ @ dz``, written once. Two thirds of the backward's FLOPs run at the GEMM
library's speed, with no atomics; the temporaries are one ``dz`` chunk and the float32 ``dx``,
never ``T · V``. A ragged last chunk starts earlier and zeroes the columns the previous one
covered. Residuals ``(x, w, labels, lse)`` are shared with every implementation of
:data:`ejk.plugin.LINEAR_CROSS_ENTROPY_RESIDUALS` (ejk-xla's chunked one among them).
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import (
    LINEAR_CROSS_ENTROPY_RESIDUALS,
    VJP,
    cdiv,
    cotangent_like,
    fit_block,
    int_in,
    one_of,
    power_of_two,
    varying_like,
)
from ejk_triton import _device, _dots
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = ["LinearCrossEntropyConfig", "backward", "capability", "config_space", "forward",
           "forward_with_residuals", "heuristic_config", "vjp"]

_block = power_of_two(16)
Statistics = tuple[jax.Array, jax.Array, jax.Array]


@attrs.frozen(kw_only=True)
class LinearCrossEntropyConfig:
    """Tiles and launch parameters of the Triton linear cross-entropy (blocks clamped to the problem, >= 16).

    Attributes:
        block_t: Tokens per tile.
        block_v: Vocabulary columns per tile.
        block_h: Hidden-dim step of the tile's product.
        splits: Vocabulary splits of the forward grid (``0``: enough for two programs per SM).
        chunk_v: Vocabulary columns per backward chunk (its ``dz`` is ``T · chunk_v`` elements).
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the product loop.
    """

    block_t: int = attrs.field(default=128, validator=_block)
    block_v: int = attrs.field(default=128, validator=_block)
    block_h: int = attrs.field(default=64, validator=_block)
    splits: int = attrs.field(default=0, validator=int_in(0, 4096))
    chunk_v: int = attrs.field(default=4096, validator=_block)
    num_warps: int = attrs.field(default=8, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 8))


def _tiles(x: Any, w: Any, cfg: LinearCrossEntropyConfig) -> tuple[int, int, int]:
    return fit_block(cfg.block_t, x.shape[0]), fit_block(cfg.block_v, w.shape[1]), fit_block(cfg.block_h, x.shape[1])


def _common(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    dtype = _dots.common_dtype(x, w)
    return x.astype(dtype), w.astype(dtype)


def _constexprs(x: Any, w: Any, cap: float | None, precision: Any, cfg: LinearCrossEntropyConfig) -> dict[str, Any]:
    bt, bv, bh = _tiles(x, w, cfg)
    return dict(T=x.shape[0], H=x.shape[1], V=w.shape[1], BLOCK_T=bt, BLOCK_V=bv, BLOCK_H=bh,
                CAP=0.0 if cap is None else float(cap),
                DOT_PREC=_dots.dot_precision(_dots.common_dtype(x, w), precision),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _statistics(x: jax.Array, w: jax.Array, labels: jax.Array, cap: float | None, precision: Any,
                cfg: LinearCrossEntropyConfig) -> Statistics:
    t, v = x.shape[0], w.shape[1]
    args = _constexprs(x, w, cap, precision, cfg)
    bt, bv = args["BLOCK_T"], args["BLOCK_V"]
    blocks = cdiv(v, bv)
    splits = cfg.splits or cdiv(2 * _device.persistent_programs(1 << 30), cdiv(t, bt))
    per_split = cdiv(blocks, max(1, min(splits, blocks))) * bv
    splits = cdiv(v, per_split)
    partial = jax.ShapeDtypeStruct((splits, t), jnp.float32)

    def run(x: jax.Array, w: jax.Array, labels: jax.Array) -> tuple[jax.Array, ...]:
        return launch(kernels("_lce_kernels").forward_kernel, grid=(cdiv(t, bt), splits), inputs=(x, w, labels),
                      out_shapes=(partial,) * 4, SPLIT_V=per_split, **args)

    top, total, z_label, z_sum = sequential_vmap(run)(*_common(x, w), labels.astype(jnp.int32))
    best = jnp.max(top, axis=0)
    lse = best + jnp.log(jnp.sum(total * jnp.exp(top - best), axis=0))
    return lse, jnp.sum(z_label, axis=0), jnp.sum(z_sum, axis=0)


def forward_with_residuals(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Any = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> tuple[Statistics, tuple[jax.Array, ...]]:
    """``((lse, z_label, z_sum), (x, w, labels, lse))``."""
    cfg = cfg if cfg is not None else heuristic_config(x, w)
    if x.shape[0] == 0:
        empty = jnp.zeros((0,), jnp.float32)
        return (empty, empty, empty), (x, w, labels, empty)
    stats = _statistics(x, w, labels, logit_soft_cap, precision, cfg)
    return stats, (x, w, labels, stats[0])


def forward(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Any = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> Statistics:
    """Per-token ``(lse, z_label, z_sum)`` of ``x @ w`` (soft-capped), each ``[T]`` float32."""
    return forward_with_residuals(x, w, labels, logit_soft_cap=logit_soft_cap, precision=precision, cfg=cfg)[0]


def backward(
    residuals: tuple[jax.Array, ...], cotangents: tuple[Any, Any, Any], *, logit_soft_cap: float | None = None,
    precision: Any = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> tuple[jax.Array, jax.Array, None]:
    """``(dx, dw, None)`` from the residuals and the statistics' cotangents (``None`` counts as zeros)."""
    x, w, labels, lse = residuals
    cfg = cfg if cfg is not None else heuristic_config(x, w)
    t, h = x.shape
    v = w.shape[1]
    if t == 0:
        return cotangent_like(jnp.zeros_like(x), x), cotangent_like(jnp.zeros_like(w), w), None
    d_lse, d_label, d_sum = (jnp.zeros_like(lse) if d is None else d.astype(jnp.float32) for d in cotangents)
    args = _constexprs(x, w, logit_soft_cap, precision, cfg)
    chunk = min(cfg.chunk_v, v)
    xc, wc = _common(x, w)
    dtype = xc.dtype
    grid = (cdiv(t, args["BLOCK_T"]), cdiv(chunk, args["BLOCK_V"]))
    starts = jnp.minimum(jnp.arange(cdiv(v, chunk), dtype=jnp.int32) * chunk, v - chunk)
    nominal = jnp.arange(cdiv(v, chunk), dtype=jnp.int32) * chunk
    dot = {"precision": precision, "preferred_element_type": jnp.float32}

    def grad_logits(*arrays: jax.Array) -> tuple[jax.Array, ...]:
        return launch(kernels("_lce_kernels").grad_logits_kernel, grid=grid, inputs=arrays,
                      out_shapes=(jax.ShapeDtypeStruct((t, chunk), dtype),), CHUNK=chunk, **args)

    def step(carry: tuple[jax.Array, jax.Array], cols: jax.Array) -> tuple[tuple[jax.Array, jax.Array], None]:
        dx, dw = carry
        (dz,) = sequential_vmap(grad_logits)(xc, wc, labels.astype(jnp.int32), lse, d_lse, d_label, d_sum, cols)
        w_chunk = jax.lax.dynamic_slice_in_dim(wc, cols[0], chunk, axis=1)
        dx = dx + jnp.matmul(dz, w_chunk.T, **dot)
        fresh = (cols[0] + jnp.arange(chunk, dtype=jnp.int32) >= cols[1])[None, :]
        earlier = jax.lax.dynamic_slice_in_dim(dw, cols[0], chunk, axis=1)
        written = jnp.where(fresh, jnp.matmul(xc.T, dz, **dot).astype(w.dtype), earlier)
        return (dx, jax.lax.dynamic_update_slice_in_dim(dw, written, cols[0], 1)), None

    init = varying_like((jnp.zeros((t, h), jnp.float32), jnp.zeros((h, v), w.dtype)), x, w, labels, lse, d_lse)
    (dx, dw), _ = jax.lax.scan(step, init, jnp.stack([starts, nominal], axis=1))
    return cotangent_like(dx.astype(x.dtype), x), cotangent_like(dw, w), None


#: The custom VJP, residuals shared with every implementation of the tag.
vjp = VJP(fwd=forward_with_residuals, bwd=backward, residuals=LINEAR_CROSS_ENTROPY_RESIDUALS)


def capability(x: Any, w: Any, labels: Any, **_: Any) -> str | None:
    """Why the kernels cannot run a call, or ``None``: bfloat16 / float16 / float32 operands, each
    below 2**30 elements; an NVIDIA GPU of compute capability 8.0+ (or the interpreter)."""
    del labels
    return _dots.gate((("x", x), ("w", w)), ())


def heuristic_config(x: Any, w: Any, **_: Any) -> LinearCrossEntropyConfig:
    """128 x 128 tiles stepping 64 of the hidden dim, 8 warps, 3 stages (16-bit); 64-wide steps of 32 for float32."""
    if jnp.dtype(_dots.common_dtype(x, w)) == jnp.float32:
        return LinearCrossEntropyConfig(block_t=64, block_v=64, block_h=32, num_warps=4, num_stages=2)
    return LinearCrossEntropyConfig()


def config_space(x: Any, w: Any, **_: Any) -> list[LinearCrossEntropyConfig]:
    """A few tile shapes around the heuristic (clipped duplicates dropped)."""
    seen: dict[tuple[int, ...], LinearCrossEntropyConfig] = {}
    for bt, bv, bh, warps, stages in ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 3),
                                      (128, 64, 64, 4, 4), (64, 64, 32, 4, 2)):
        cfg = LinearCrossEntropyConfig(block_t=bt, block_v=bv, block_h=bh, num_warps=warps, num_stages=stages)
        seen.setdefault((*_tiles(x, w, cfg), warps, stages), cfg)
    return list(seen.values())
