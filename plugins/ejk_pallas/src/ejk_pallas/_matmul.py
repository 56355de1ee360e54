"""``matmul`` as a Pallas kernel for NVIDIA GPUs (Triton lowering), forward and backward.

One program per ``[block_m, block_n]`` output tile (grid ``(tiles, batch)``; the tile order is
swizzled in groups of ``group_m`` row tiles so that consecutive programs share rows of ``a`` and
columns of ``b`` in L2); the program loops over the contraction in ``block_k`` steps (a loop
Triton software-pipelines over ``num_stages``), accumulating in float32. Operands may be read
transposed in place (``[k, m]`` / ``[n, k]``), which the backward uses: ``d a = d c @ bᵀ`` and
``d b = aᵀ @ d c`` run through the same kernel (``_matmul_shapes`` maps ``jnp.matmul`` shapes).
Operands are zero-padded to whole tiles only when a dim is not a multiple of its tile.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import (
    MATMUL_RESIDUALS,
    cdiv,
    devices,
    fit_block,
    int_in,
    one_of,
    operand_vjp,
    power_of_two,
)
from ejk_pallas import _env, _mm
from ejk_pallas._flash_attention import pl
from ejk_pallas._matmul_shapes import matmul_backward, matmul_forward, shapes

__all__ = ["MatmulConfig", "capability", "config_space", "forward", "gradients", "heuristic_config", "vjp"]

_block = power_of_two(16)


@attrs.frozen(kw_only=True)
class MatmulConfig:
    """Tiles and launch parameters of the Pallas (Triton-lowered) matmul; blocks clamp to the problem (>= 16).

    Attributes:
        block_m: Rows of ``a`` per program.
        block_n: Columns of ``b`` per program.
        block_k: Contraction step.
        group_m: Row tiles per group of the swizzled program order.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the contraction loop.
    """

    block_m: int = attrs.field(default=128, validator=_block)
    block_n: int = attrs.field(default=128, validator=_block)
    block_k: int = attrs.field(default=64, validator=_block)
    group_m: int = attrs.field(default=8, validator=int_in(1, 64))
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 8))


def _swizzle(t: Any, tiles_m: int, tiles_n: int, group_m: int) -> tuple[Any, Any]:
    """Tile ``t`` of the program order -> ``(row tile, column tile)``, ``group_m`` row tiles at a time."""
    width = group_m * tiles_n
    group = t // width
    first = group * group_m
    size = jnp.minimum(tiles_m - first, group_m)
    local = t % width
    return first + local % size, local // size


def _kernel(a_ref: Any, b_ref: Any, o_ref: Any, *, ta: bool, tb: bool, bk: int, steps: int, precision: Any) -> None:
    def body(i: Any, acc: Any) -> Any:
        k0 = pl().multiple_of(i * bk, bk)
        x = a_ref[pl().ds(k0, bk), :] if ta else a_ref[:, pl().ds(k0, bk)]
        y = b_ref[:, pl().ds(k0, bk)] if tb else b_ref[pl().ds(k0, bk), :]
        dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
        return acc + _mm.dot(x, y, dims, precision, gpu=True)

    acc = lax.fori_loop(0, steps, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def _product(x: jax.Array, y: jax.Array, *, ta: bool = False, tb: bool = False, out_dtype: Any,
             precision: Any, cfg: MatmulConfig) -> jax.Array:
    """``[Z, m, n]``: ``x [Z, m, k]`` (``[Z, k, m]``: ``ta``) times ``y [Z, k, n]`` (``[Z, n, k]``: ``tb``)."""
    z = x.shape[0]
    m, k = (x.shape[2], x.shape[1]) if ta else x.shape[1:]
    n = y.shape[1] if tb else y.shape[2]
    if z * m * n == 0 or k == 0:
        return jnp.zeros((z, m, n), out_dtype)
    dtype = _mm.common_dtype(x, y)
    bm, bn, bk = fit_block(cfg.block_m, m), fit_block(cfg.block_n, n), fit_block(cfg.block_k, k)
    mp, np_, kp = cdiv(m, bm) * bm, cdiv(n, bn) * bn, cdiv(k, bk) * bk
    x = _mm.pad_to(x.astype(dtype), (z, kp, mp) if ta else (z, mp, kp))
    y = _mm.pad_to(y.astype(dtype), (z, np_, kp) if tb else (z, kp, np_))
    tm, tn = mp // bm, np_ // bn

    def tile(t: Any) -> tuple[Any, Any]:
        return _swizzle(t, tm, tn, cfg.group_m)

    p = pl()
    a_spec = (p.BlockSpec((None, kp, bm), lambda t, b: (b, 0, tile(t)[0])) if ta
              else p.BlockSpec((None, bm, kp), lambda t, b: (b, tile(t)[0], 0)))
    b_spec = (p.BlockSpec((None, bn, kp), lambda t, b: (b, tile(t)[1], 0)) if tb
              else p.BlockSpec((None, kp, bn), lambda t, b: (b, 0, tile(t)[1])))
    from jax.experimental.pallas import triton as plgpu

    out: jax.Array = p.pallas_call(
        functools.partial(_kernel, ta=ta, tb=tb, bk=bk, steps=kp // bk, precision=precision),
        grid=(tm * tn, z),
        in_specs=[a_spec, b_spec],
        out_specs=p.BlockSpec((None, bm, bn), lambda t, b: (b, *tile(t))),
        out_shape=_mm.out_struct((z, mp, np_), out_dtype, x),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_env.use_interpreter(),
        name="ejk_pallas_matmul",
    )(x, y)
    return out[:, :m, :n]


def _resolve(cfg: MatmulConfig | None, a: Any, b: Any) -> MatmulConfig:
    return heuristic_config(a, b) if cfg is None else cfg


def forward(a: jax.Array, b: jax.Array, *, precision: str | tuple[str, str] = ("highest", "highest"),
            preferred_element_type: Any = None, cfg: MatmulConfig | None = None) -> jax.Array:
    """``jnp.matmul(a, b)`` (broadcast batches, 1-D operands) with float32 accumulation, in ``preferred_element_type``
    (``None``: ``result_type(a, b)``)."""
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    product = functools.partial(_product, precision=precision, cfg=_resolve(cfg, a, b))
    return matmul_forward(product, a, b, out_dtype)


def gradients(operands: tuple[jax.Array, jax.Array], d_out: jax.Array, *, cfg: MatmulConfig | None = None,
              precision: str | tuple[str, str] = ("highest", "highest"),
              preferred_element_type: Any = None) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` in the dtypes of ``a`` and ``b``, through the forward's kernel (transposes read in place)."""
    del preferred_element_type
    a, b = operands
    product = functools.partial(_product, precision=precision, cfg=_resolve(cfg, a, b))
    return matmul_backward(product, a, b, d_out)


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, MATMUL_RESIDUALS)


def capability(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: every ``jnp.matmul`` shape, bfloat16 / float16 / float32 operands (mixed ones cast
    to their common type), every precision and output dtype, operands and outputs below 2**30
    elements. Needs an NVIDIA GPU (compute capability 8.0+), except in interpret mode.
    """
    del precision
    s = shapes(a, b)
    out = s.z * s.rows * s.n
    if s.z > 65535:
        return f"a batch of {s.z} products exceeds CUDA's grid limit (65535; fold the batch into the rows)"
    return _mm.gpu_gate((("a", a), ("b", b)), (("out", out), ("a broadcast", s.z * s.rows * s.k),
                                               ("b broadcast", s.z * s.k * s.n)), preferred_element_type)


# (block_m, block_n, block_k, group_m, num_warps, num_stages), preferred first for large products.
_TILES_16 = (
    (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4), (128, 256, 64, 8, 8, 4),
    (128, 128, 64, 8, 8, 4), (64, 256, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4),
    (64, 64, 64, 8, 4, 4), (32, 128, 64, 8, 4, 4), (16, 128, 128, 8, 4, 4),
)
_TILES_32 = (
    (128, 128, 32, 8, 8, 3), (128, 64, 32, 8, 4, 3), (64, 128, 32, 8, 4, 3), (64, 64, 32, 8, 4, 3),
    (32, 64, 32, 8, 4, 3), (16, 64, 32, 8, 4, 2),
)
_INTERPRETER = MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)


def smem_bytes(cfg: MatmulConfig, itemsize: int) -> int:
    """Shared memory of the pipelined main loop (bytes): ``stages`` buffers of both tiles."""
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * itemsize


def _make(t: tuple[int, ...]) -> MatmulConfig:
    return MatmulConfig(block_m=t[0], block_n=t[1], block_k=t[2], group_m=t[3], num_warps=t[4], num_stages=t[5])


def fitting(tiles_16: tuple[tuple[int, ...], ...], tiles_32: tuple[tuple[int, ...], ...],
            itemsize: int) -> list[MatmulConfig]:
    """The dtype's table pruned to what fits the GPU's shared memory (at least its smallest entry)."""
    table = [_make(t) for t in (tiles_32 if itemsize == 4 else tiles_16)]
    limit = devices.smem_per_block()
    return [c for c in table if smem_bytes(c, itemsize) <= limit] or [min(table, key=lambda c: smem_bytes(c,
                                                                                                       itemsize))]


def config_space(a: Any, b: Any, **_: Any) -> list[MatmulConfig]:
    """Autotuning candidates: the dtype's tile table pruned by a shared-memory estimate, the heuristic's first."""
    if _env.use_interpreter():
        return [_INTERPRETER]
    first = heuristic_config(a, b)
    return [first, *(c for c in fitting(_TILES_16, _TILES_32, _mm.common_dtype(a, b).itemsize) if c != first)]


def heuristic_config(a: Any, b: Any, **_: Any) -> MatmulConfig:
    """The first fitting tile (16-bit: 128x256x64, 8 warps, 3 stages) whose tile count covers the SMs,
    skipping tiles taller than twice the rows; else the one with the most tiles. 16x16x16 in interpret mode."""
    if _env.use_interpreter():
        return _INTERPRETER
    s = shapes(a, b)
    table = fitting(_TILES_16, _TILES_32, _mm.common_dtype(a, b).itemsize)
    short = [c for c in table if c.block_m <= max(16, 2 * s.rows)] or table[-1:]

    def tiles(c: MatmulConfig) -> int:
        return s.z * cdiv(s.rows, fit_block(c.block_m, s.rows)) * cdiv(s.n, fit_block(c.block_n, s.n))

    sms = devices.sm_count()
    return next((c for c in short if tiles(c) >= sms), max(short, key=tiles))
