"""``grouped_matmul`` (mixture of experts) as Triton kernels, forward and backward.

Rows of ``lhs`` form consecutive groups; group ``i`` is multiplied by ``rhs[i]``. The group
boundaries (``offsets`` ``[g + 1]``, sizes sanitised: negative sizes count as 0 and rows past
``m`` are dropped, so any input is well defined) are computed on the device; nothing of size
``[g, m, n]`` is built.

- forward: one launch of the persistent ``grouped_matmul_kernel`` (``_grouped_kernels``): about
  one program per SM walks the (group, row tile, column tile) work list, so empty groups cost
  nothing and rows past ``sum(group_sizes)`` are written as zeros; up to :data:`FLAT_GROUPS`
  groups the item loop and the contraction loop run as one software pipeline;
- ``d lhs = d out @ rhs[group]ᵀ``: the same kernel, ``rhs`` read transposed through strides;
- ``d rhs[i] = lhs_iᵀ @ d out_i``: ``grouped_outer_kernel``, one program per (group, tile),
  reducing over the group's rows (an empty group's gradient is zeros).

Both backward products use the forward's ``precision`` (see ``_dots``) and accumulate in
float32. Under ``jax.vmap`` the launches run once per mapped element.

``activation="swiglu"`` fuses the gated activation into the forward's epilogue (two accumulators per
output tile, the gate and up columns, ``N / 2`` output columns); its backward recomputes the product
(``ejk.plugin.gated_gradients``) and runs the plain backward on the activation's cotangent.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import (
    GROUPED_MATMUL_RESIDUALS,
    cdiv,
    fit_block,
    gated_gradients,
    int_in,
    one_of,
    operand_vjp,
    power_of_two,
)
from ejk_triton import _device, _dots, _env
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = [
    "GroupedMatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "heuristic_config",
    "outer_args",
    "product_args",
    "vjp",
]

_block = power_of_two(16)


@attrs.frozen(kw_only=True)
class GroupedMatmulConfig:
    """Tiles and launch parameters of the Triton grouped matmul (blocks clamped to the problem, never below 16).

    The forward and ``d lhs`` kernels compute ``[block_m, block_n]`` output tiles with a
    ``block_k`` contraction step; the ``d rhs`` kernel computes ``[block_m, block_n]`` tiles of
    ``d rhs[i]`` (``k`` by ``n``), reducing over the group's rows ``block_k`` at a time.

    Attributes:
        block_m: Rows per output tile.
        block_n: Columns per output tile.
        block_k: Contraction step.
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the contraction loop.
        programs_per_sm: Programs of the persistent kernel per streaming multiprocessor.
    """

    block_m: int = attrs.field(default=128, validator=_block)
    block_n: int = attrs.field(default=128, validator=_block)
    block_k: int = attrs.field(default=64, validator=_block)
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 8))
    programs_per_sm: int = attrs.field(default=1, validator=int_in(1, 8))


# ----------------------------------------------------------------------------------------------
# Launches
# ----------------------------------------------------------------------------------------------


def _offsets(group_sizes: jax.Array, m: int) -> jax.Array:
    """``[g + 1]`` int32 group boundaries: group ``i`` owns rows ``offsets[i]:offsets[i + 1]``."""
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])


def _programs(cfg: GroupedMatmulConfig, m: int, n: int, groups: int, bm: int, bn: int) -> int:
    """Persistent programs: ``programs_per_sm`` per SM, at most the work list's bound."""
    return _device.persistent_programs((cdiv(m, bm) + groups) * cdiv(n, bn), cfg.programs_per_sm)


#: Up to this many groups the forward kernel holds the work list in registers (one flattened
#: software pipeline over items); beyond it the kernel walks the groups.
FLAT_GROUPS = 1024


def _flat_width(groups: int) -> int:
    """``G_FLAT``: the register work list's length (a power of two, at least 16), or 0 to walk the groups."""
    return max(16, 1 << (groups - 1).bit_length()) if groups <= FLAT_GROUPS else 0


def product_args(*, m: int, n: int, k: int, groups: int, transpose_w: bool, dtype: Any, out_dtype: Any,
                 precision: Any, cfg: GroupedMatmulConfig, gated: bool = False) -> dict[str, Any]:
    """``launch``'s arguments for ``grouped_matmul_kernel``: ``[m, k] x [g, k, n]`` (``[g, n, k]``: transposed);
    ``gated``: the SwiGLU of the product's two column halves, out ``[m, n / 2]``."""
    n_out = n // 2 if gated else n
    bm, bn, bk = fit_block(cfg.block_m, m), fit_block(cfg.block_n, n_out), fit_block(cfg.block_k, k)
    programs = _programs(cfg, m, n_out, groups, bm, bn)
    s_rk, s_rn = (1, k) if transpose_w else (n, 1)
    return dict(
        grid=(programs,), out_shapes=(jax.ShapeDtypeStruct((m, n_out), out_dtype),), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, M=m, N=n, K=k, G=groups, S_LM=k, S_LK=1, S_RG=k * n, S_RK=s_rk, S_RN=s_rn,
        PROGRAMS=programs, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_PREC=_dots.dot_precision(dtype, precision),
        G_FLAT=_flat_width(groups), GATED=gated,
    )


def outer_args(*, m: int, n: int, k: int, groups: int, dtype: Any, out_dtype: Any, precision: Any,
               cfg: GroupedMatmulConfig) -> dict[str, Any]:
    """``launch``'s arguments for ``grouped_outer_kernel``: ``[m, k]ᵀ x [m, n]`` per group, out ``[g, k, n]``."""
    bk, bn, bm = fit_block(cfg.block_m, k), fit_block(cfg.block_n, n), fit_block(cfg.block_k, m)
    return dict(
        grid=(groups * cdiv(k, bk) * cdiv(n, bn),), out_shapes=(jax.ShapeDtypeStruct((groups, k, n), out_dtype),),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, K=k, N=n, S_XM=k, S_XK=1, S_YM=n, S_YN=1,
        BLOCK_K=bk, BLOCK_N=bn, BLOCK_M=bm, DOT_PREC=_dots.dot_precision(dtype, precision),
    )


def _grouped_product(x: jax.Array, w: jax.Array, offsets: jax.Array, *, transpose_w: bool, out_dtype: Any,
                     precision: Any, cfg: GroupedMatmulConfig, gated: bool = False) -> jax.Array:
    """``out[r] = x[r] @ w[group(r)]`` (``w[group(r)]ᵀ`` with ``transpose_w``); rows in no group are 0.

    ``x`` is ``[m, a]``; ``w`` is ``[g, a, b]`` (``[g, b, a]`` with ``transpose_w``); out ``[m, b]``
    (``gated``: the SwiGLU of the product's two column halves, ``[m, b / 2]``).
    """
    m, k = x.shape
    groups = w.shape[0]
    n = w.shape[1] if transpose_w else w.shape[2]
    n_out = n // 2 if gated else n
    if m * n_out == 0 or groups == 0 or k == 0:  # nothing to write, no group owns a row, or empty sums
        return jnp.zeros((m, n_out), out_dtype)
    dtype = _dots.common_dtype(x, w)
    args = product_args(m=m, n=n, k=k, groups=groups, transpose_w=transpose_w, dtype=dtype, out_dtype=out_dtype,
                        precision=precision, cfg=cfg, gated=gated)

    def run(lhs: jax.Array, rhs: jax.Array, offs: jax.Array) -> tuple[jax.Array, ...]:
        return launch(kernels("_grouped_kernels").grouped_matmul_kernel, inputs=(lhs, rhs, offs), **args)

    (out,) = sequential_vmap(run)(x.astype(dtype), w.astype(dtype), offsets)
    return out


def _grouped_outer(x: jax.Array, dy: jax.Array, offsets: jax.Array, groups: int, *, out_dtype: Any, precision: Any,
                   cfg: GroupedMatmulConfig) -> jax.Array:
    """``out[i] = x_iᵀ @ dy_i`` over group ``i``'s rows: ``x`` ``[m, k]``, ``dy`` ``[m, n]``, out ``[g, k, n]``."""
    m, k = x.shape
    n = dy.shape[1]
    if groups * k * n == 0 or m == 0:
        return jnp.zeros((groups, k, n), out_dtype)
    dtype = _dots.common_dtype(x, dy)
    args = outer_args(m=m, n=n, k=k, groups=groups, dtype=dtype, out_dtype=out_dtype, precision=precision, cfg=cfg)

    def run(lhs: jax.Array, d_out: jax.Array, offs: jax.Array) -> tuple[jax.Array, ...]:
        return launch(kernels("_grouped_kernels").grouped_outer_kernel, inputs=(lhs, d_out, offs), **args)

    (out,) = sequential_vmap(run)(x.astype(dtype), dy.astype(dtype), offsets)
    return out


# ----------------------------------------------------------------------------------------------
# The implementation and its VJP
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: GroupedMatmulConfig | None, lhs: Any, rhs: Any, group_sizes: Any,
             activation: str | None = None) -> GroupedMatmulConfig:
    return heuristic_config(lhs, rhs, group_sizes, activation=activation) if cfg is None else cfg


def forward(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
    activation: str | None = None,
    cfg: GroupedMatmulConfig | None = None,
) -> jax.Array:
    """Row-grouped matmul: consecutive row groups of ``lhs``, group ``i`` times ``rhs[i]``.

    Args:
        lhs: ``[m, k]``.
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]`` integers (non-negative, ``sum <= m``); rows past the sum are zeros.
        precision: A pair of ``lax.Precision`` names (lhs, rhs), or one name; see ``_dots``.
        preferred_element_type: The output dtype; ``None`` means ``lhs.dtype``.
        activation: ``None``, or ``"swiglu"``: ``silu(z[:, :n/2]) * z[:, n/2:]`` of the float32 product,
            in the kernel's epilogue.
        cfg: Tiles; ``None`` means :func:`heuristic_config`.

    Returns:
        ``[m, n]`` in ``preferred_element_type`` (float32 accumulation; ``[m, n / 2]`` with an activation).
    """
    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    cfg = _resolve(cfg, lhs, rhs, group_sizes, activation)
    return _grouped_product(lhs, rhs, _offsets(group_sizes, lhs.shape[0]), transpose_w=False, out_dtype=out_dtype,
                            precision=precision, cfg=cfg, gated=activation is not None)


def gradients(
    operands: tuple[jax.Array, jax.Array, jax.Array],
    d_out: jax.Array,
    *,
    cfg: GroupedMatmulConfig | None = None,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)`` in the dtypes of ``lhs`` and ``rhs`` (``group_sizes`` is integer: no gradient)."""
    del preferred_element_type
    lhs, rhs, group_sizes = operands
    cfg = _resolve(cfg, lhs, rhs, group_sizes)
    offsets = _offsets(group_sizes, lhs.shape[0])
    d_lhs = _grouped_product(d_out, rhs, offsets, transpose_w=True, out_dtype=lhs.dtype, precision=precision, cfg=cfg)
    d_rhs = _grouped_outer(lhs, d_out, offsets, rhs.shape[0], out_dtype=rhs.dtype, precision=precision, cfg=cfg)
    return d_lhs, d_rhs, None


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward (a gated call's through
#: ``gated_gradients``: the product recomputed, then the plain backward).
vjp = operand_vjp(forward, gated_gradients(forward, gradients), GROUPED_MATMUL_RESIDUALS)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(lhs: Any, rhs: Any, group_sizes: Any, *, precision: Any = None,
               preferred_element_type: Any = None, activation: str | None = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: any sizes (edges are masked; empty groups, rows past the sum, ``k = 0``),
    bfloat16 / float16 / float32 operands (mixed ones are cast to their common type), every
    precision (see ``_dots``) and output dtype, operands and outputs below 2**30 elements, and
    ``activation="swiglu"``. Needs an NVIDIA GPU (compute capability 8.0+), except in the interpreter mode.
    """
    del precision, activation  # the op validated the activation and rhs's even columns
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        return f"group_sizes of dtype {jnp.dtype(group_sizes.dtype).name} not supported (integers only)"
    if preferred_element_type is not None and jnp.dtype(preferred_element_type).name not in _dots.DTYPES:
        return f"preferred_element_type {jnp.dtype(preferred_element_type).name} not supported"
    m, k = (int(d) for d in lhs.shape)
    n = int(rhs.shape[2])
    return _dots.gate((("lhs", lhs), ("rhs", rhs)), (("out", m * n), ("d lhs", m * k)))


# (block_m, block_n, block_k, num_warps, num_stages), in order of preference for large groups.
_TILES_16 = (
    (128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3),
    (64, 256, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 32, 4, 2),
)
_TILES_32 = (
    (128, 128, 32, 8, 3), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (32, 64, 32, 4, 2),
)
_INTERPRETER = GroupedMatmulConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


def _make(t: tuple[int, int, int, int, int]) -> GroupedMatmulConfig:
    return GroupedMatmulConfig(block_m=t[0], block_n=t[1], block_k=t[2], num_warps=t[3], num_stages=t[4])


def _fitting(lhs: Any, rhs: Any, gated: bool = False) -> list[GroupedMatmulConfig]:
    """The dtype's tiles that fit shared memory. Gated (SwiGLU) tiles compute two ``block_n``-wide products
    (gate and up) a tile: they keep tiles whose doubled width is in the table's range."""
    itemsize = _dots.common_dtype(lhs, rhs).itemsize
    table = [_make(t) for t in (_TILES_32 if itemsize == 4 else _TILES_16)]
    if gated:
        widest = max(c.block_n for c in table)
        table = [c for c in table if 2 * c.block_n <= widest] or table
    width = 2 if gated else 1
    limit = _device.smem_limit()

    def smem(c: GroupedMatmulConfig) -> int:
        return _dots.smem_bytes(c.block_m, width * c.block_n, c.block_k, c.num_stages, itemsize, flattened=True)

    return [c for c in table if smem(c) <= limit] or [min(table, key=smem)]


def config_space(lhs: Any, rhs: Any, group_sizes: Any, *, activation: str | None = None,
                 **_: Any) -> list[GroupedMatmulConfig]:
    """Autotuning candidates: the dtype's tile table pruned by shared memory, the heuristic's first.

    Args:
        lhs: ``[m, k]`` (anything with ``.shape`` and ``.dtype``).
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]``.
        activation: The op's; a gated call's tiles are half as wide (see :func:`_fitting`).
        **_: The op's other static arguments, ignored.
    """
    if _env.interpreting_on_cpu():
        return [_INTERPRETER]
    first = heuristic_config(lhs, rhs, group_sizes, activation=activation)
    return [first, *(c for c in _fitting(lhs, rhs, activation is not None) if c != first)]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, *, activation: str | None = None,
                     **_: Any) -> GroupedMatmulConfig:
    """A tile by shape and device, not timed here.

    Row tiles never straddle groups, so a tile much taller than the average group wastes work:
    the first fitting entry of the dtype's table (16-bit on Hopper: 128x256x64, 8 warps, 4
    stages) whose height is at most twice the average group (``m / g``, at least 64 rows)
    and whose tile count (at equal groups) covers the SMs; else the one with the most tiles.
    A gated call (``activation``) picks among tiles half as wide (two products a tile), counted
    over its ``n / 2`` output columns. In the interpreter mode (CPU), 16x32x32 tiles.

    Args: as for :func:`config_space`.
    """
    del group_sizes
    if _env.interpreting_on_cpu():
        return _INTERPRETER
    gated = activation is not None
    m, groups, n = int(lhs.shape[0]), max(int(rhs.shape[0]), 1), int(rhs.shape[2]) // (2 if gated else 1)
    average = max(cdiv(m, groups), 1)
    table = _fitting(lhs, rhs, gated)
    fitting = [c for c in table if c.block_m <= max(64, 2 * average)] or table[-1:]

    def tiles(c: GroupedMatmulConfig) -> int:
        return groups * cdiv(average, c.block_m) * cdiv(n, c.block_n)

    sms = _device.sm_count()
    return next((c for c in fitting if tiles(c) >= sms), max(fitting, key=tiles))

