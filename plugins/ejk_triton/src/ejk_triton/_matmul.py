"""``matmul`` as a Triton kernel: ``jnp.matmul`` shapes, float32 accumulation, forward and backward.

The kernel (``_matmul_kernels.matmul_kernel``) computes ``c[z] = sum_r a[z, r] @ b[z, r]`` with
operands addressed through strides; this module maps ``jnp.matmul``'s shapes onto it without
copies where it can:

- 1-D operands become a row (``a``) or a column (``b``), squeezed from the result;
- when ``b`` has no batch (or only size-1 batch dims), ``a``'s batch is folded into its rows:
  one 2-D product;
- when only ``b`` is batched, ``a`` is read with batch stride 0;
- otherwise each operand is broadcast to the common batch (a copy only where its own batch
  dims are broadcast).

Backward: ``d a = d c @ bᵀ`` and ``d b = aᵀ @ d c``, transposes through strides. Broadcast
batches are summed: folded into the contraction where the layout allows (``d b`` of an
unbatched ``b`` is one product over all rows; ``d a`` of an unbatched ``a`` sums the batch in
the kernel, its ``RED`` axis), else computed per batch in float32 and summed. The gradients
run without split-K (``split_k=1`` whatever the config says).
Under ``jax.vmap`` the launches run once per mapped element (``_launch.sequential_vmap``).

Split-K (``MatmulConfig.split_k > 1``): the contraction of each output tile is shared by that many
programs, each writing float32 partial sums ``[split_k, batch, m, n]`` that ``jnp.sum`` adds (one
XLA fusion with the cast). For skinny products (decode: few rows, so few output tiles) it puts
more programs on the weights than there are tiles.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.plugin import MATMUL_RESIDUALS, cdiv, fit_block, int_in, next_pow2, one_of, operand_vjp, power_of_two
from ejk_triton import _device, _dots, _env
from ejk_triton._launch import kernels, launch, sequential_vmap

__all__ = [
    "MatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "heuristic_config",
    "kernel_args",
    "vjp",
]

_block = power_of_two(16)


def _split_not_persistent(cfg: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if value > 1 and cfg.persistent:
        raise ValueError(f"MatmulConfig.{attribute.name} is {value} but persistent=True needs split_k=1 "
                         "(split-K runs one program per tile and split)")


@attrs.frozen(kw_only=True)
class MatmulConfig:
    """Tiles and launch parameters of the Triton matmul (blocks are clamped to the problem, never below 16).

    Attributes:
        block_m: Rows of ``a`` per program.
        block_n: Columns of ``b`` per program.
        block_k: Contraction step.
        group_m: Row tiles per group of the program order (consecutive programs share rows of ``a``).
        num_warps: Warps per program.
        num_stages: Software-pipelining stages of the contraction loop.
        persistent: About one program per SM walks the tiles (``tile, tile + programs, …``), the tile
            loop and the contraction loop flattened into one software pipeline, so the next tile's
            loads start during this one's epilogue; ``False``: one program per tile.
        split_k: Programs per output tile along the contraction; each writes float32 partial sums that
            one XLA reduction adds in a fixed order (deterministic); 1: off. Needs ``persistent=False``;
            clamped to the contraction's ``block_k`` steps.
    """

    block_m: int = attrs.field(default=128, validator=_block)
    block_n: int = attrs.field(default=128, validator=_block)
    block_k: int = attrs.field(default=64, validator=_block)
    group_m: int = attrs.field(default=8, validator=int_in(1, 64))
    num_warps: int = attrs.field(default=4, validator=one_of(1, 2, 4, 8, 16))
    num_stages: int = attrs.field(default=3, validator=int_in(1, 8))
    persistent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    split_k: int = attrs.field(default=1, validator=[one_of(1, 2, 4, 8, 16), _split_not_persistent])


# ----------------------------------------------------------------------------------------------
# The product: operands as strided views, one launch
# ----------------------------------------------------------------------------------------------


class _View(NamedTuple):
    """An operand of the kernel: a contiguous array and the element strides of its logical dims."""

    array: jax.Array
    z: int  # batch (0: broadcast)
    r: int  # batch summed inside the kernel
    row: int  # rows of a (m) / rows of b (k)
    col: int  # columns of a (k) / columns of b (n)


def _matrix(x: jax.Array, *, transpose: bool = False, batched: bool = False, summed: bool = False) -> _View:
    """A ``[..., r, c]`` array as a view of ``x`` (``transpose``: of ``xᵀ``), batch strides as asked."""
    rows, cols = x.shape[-2], x.shape[-1]
    size = rows * cols
    row, col = (1, cols) if transpose else (cols, 1)
    return _View(x, size if batched else 0, size if summed else 0, row, col)


def kernel_args(*, batch: int, red: int, m: int, n: int, k: int, a: tuple[int, int, int, int],
                b: tuple[int, int, int, int], dtype: Any, out_dtype: Any, precision: Any,
                cfg: MatmulConfig) -> dict[str, Any]:
    """``launch``'s arguments (grid, output, warps, stages, constexprs) for one product.

    Args:
        batch, red, m, n, k: Sizes (``red``: batches summed inside the kernel).
        a: Element strides of ``a`` (batch, summed batch, rows, columns).
        b: Element strides of ``b`` (batch, summed batch, rows, columns).
        dtype: The operands' (common) dtype.
        out_dtype: The output's dtype.
        precision: As for :func:`forward`.
        cfg: Tiles.

    With ``splits = min(cfg.split_k, k steps) > 1`` the grid is ``(programs, splits)`` and the output
    float32 partial sums ``[splits, batch, m, n]``.
    """
    bm, bn, bk = fit_block(cfg.block_m, m), fit_block(cfg.block_n, n), fit_block(cfg.block_k, k)
    tiles = batch * cdiv(m, bm) * cdiv(n, bn)
    programs = _device.persistent_programs(tiles) if cfg.persistent else tiles
    splits = max(1, min(cfg.split_k, cdiv(k, bk)))
    out = jax.ShapeDtypeStruct((splits, batch, m, n), jnp.float32) if splits > 1 else jax.ShapeDtypeStruct(
        (batch, m, n), out_dtype)
    return dict(
        grid=(programs, splits) if splits > 1 else (programs,),
        out_shapes=(out,),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        M=m, N=n, K=k, RED=red, SA_Z=a[0], SA_R=a[1], SA_M=a[2], SA_K=a[3], SB_Z=b[0], SB_R=b[1], SB_K=b[2],
        SB_N=b[3], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        DOT_PREC=_dots.dot_precision(dtype, precision), TILES=tiles, PROGRAMS=programs, SPLIT_K=splits,
    )


def _product(a: _View, b: _View, *, batch: int, red: int, m: int, n: int, k: int, out_dtype: Any,
             precision: Any, cfg: MatmulConfig) -> jax.Array:
    """``[batch, m, n]`` in ``out_dtype``: ``sum_r a[z, r] @ b[z, r]`` for each ``z``."""
    if batch * m * n == 0 or red * k == 0:
        return jnp.zeros((batch, m, n), out_dtype)
    dtype = _dots.common_dtype(a.array, b.array)
    args = kernel_args(batch=batch, red=red, m=m, n=n, k=k, a=a[1:], b=b[1:], dtype=dtype, out_dtype=out_dtype,
                       precision=precision, cfg=cfg)

    def run(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
        return launch(kernels("_matmul_kernels").matmul_kernel, inputs=(x, y), **args)

    (out,) = sequential_vmap(run)(a.array.astype(dtype), b.array.astype(dtype))
    if args["SPLIT_K"] > 1:  # float32 partial sums of the splits
        out = jnp.sum(out, axis=0).astype(out_dtype)
    return out


# ----------------------------------------------------------------------------------------------
# jnp.matmul shapes
# ----------------------------------------------------------------------------------------------


class _Shapes(NamedTuple):
    """The matrix form of a call: ``a`` ``[*a_batch, m, k]`` @ ``b`` ``[*b_batch, k, n]``."""

    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]
    batch: tuple[int, ...]  # broadcast batch
    m: int
    k: int
    n: int
    a_vector: bool
    b_vector: bool

    @property
    def a_folds(self) -> bool:
        """``b`` has no batch to speak of: ``a``'s batch folds into its rows."""
        return math.prod(self.b_batch) == 1

    @property
    def a_shared(self) -> bool:
        """Only ``b`` is batched: ``a`` is read with batch stride 0."""
        return not self.a_folds and math.prod(self.a_batch) == 1

    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, *(() if self.a_vector else (self.m,)), *(() if self.b_vector else (self.n,)))


def _shapes(a: Any, b: Any) -> _Shapes:
    a_shape = (1, *a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = (*b.shape, 1) if b.ndim == 1 else tuple(b.shape)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    return _Shapes(a_shape[:-2], b_shape[:-2], batch, a_shape[-2], a_shape[-1], b_shape[-1], a.ndim == 1, b.ndim == 1)


def _as_matrices(a: jax.Array, b: jax.Array, s: _Shapes) -> tuple[jax.Array, jax.Array]:
    return a.reshape(*s.a_batch, s.m, s.k), b.reshape(*s.b_batch, s.k, s.n)


def _full_batch(x: jax.Array, batch: tuple[int, ...]) -> jax.Array:
    """``x`` ``[..., r, c]`` broadcast to ``[prod(batch), r, c]`` (a copy only if its batch is broadcast)."""
    rows, cols = x.shape[-2:]
    if tuple(x.shape[:-2]) != batch:
        x = jnp.broadcast_to(x, (*batch, rows, cols))
    return x.reshape(math.prod(batch), rows, cols)


def _forward(a: jax.Array, b: jax.Array, s: _Shapes, out_dtype: Any, precision: Any, cfg: MatmulConfig) -> jax.Array:
    a3, b3 = _as_matrices(a, b, s)
    common = dict(red=1, k=s.k, n=s.n, out_dtype=out_dtype, precision=precision, cfg=cfg)
    nbatch = math.prod(s.batch)
    if s.a_folds:
        rows = math.prod(s.a_batch) * s.m
        out = _product(_matrix(a3.reshape(rows, s.k)), _matrix(b3.reshape(s.k, s.n)), batch=1, m=rows, **common)
    elif s.a_shared:
        out = _product(_matrix(a3), _matrix(b3, batched=True), batch=nbatch, m=s.m, **common)
    else:
        out = _product(_matrix(_full_batch(a3, s.batch), batched=True),
                       _matrix(_full_batch(b3, s.batch), batched=True), batch=nbatch, m=s.m, **common)
    return out.reshape(s.out_shape())


def _sum_to(x: jax.Array, batch: tuple[int, ...], target: tuple[int, ...], dtype: Any) -> jax.Array:
    """``x`` ``[prod(batch), r, c]`` summed over the batch dims ``target`` broadcasts, as ``[*target, r, c]``."""
    x = x.reshape(*batch, *x.shape[-2:])
    lead = len(batch) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target) if t == 1 and batch[lead + i] != 1)
    return jnp.sum(x, axis=axes).reshape(*target, *x.shape[-2:]).astype(dtype) if axes else x.astype(dtype)


def _backward(a: jax.Array, b: jax.Array, d_out: jax.Array, s: _Shapes, precision: Any,
              cfg: MatmulConfig) -> tuple[jax.Array, jax.Array]:
    cfg = attrs.evolve(cfg, split_k=1)
    a3, b3 = _as_matrices(a, b, s)
    nbatch = math.prod(s.batch)
    dc = d_out.reshape(nbatch, s.m, s.n)
    if s.a_folds:  # one 2-D product each way over all rows
        rows = math.prod(s.a_batch) * s.m
        dc2, a2, b2 = dc.reshape(rows, s.n), a3.reshape(rows, s.k), b3.reshape(s.k, s.n)
        da = _product(_matrix(dc2), _matrix(b2, transpose=True), batch=1, red=1, m=rows, n=s.k, k=s.n,
                      out_dtype=a.dtype, precision=precision, cfg=cfg)
        db = _product(_matrix(a2, transpose=True), _matrix(dc2), batch=1, red=1, m=s.k, n=s.n, k=rows,
                      out_dtype=b.dtype, precision=precision, cfg=cfg)
        return da.reshape(a.shape), db.reshape(b.shape)
    if s.a_shared:  # d a sums the batch inside the kernel; d b is one product per batch
        da = _product(_matrix(dc, summed=True), _matrix(b3.reshape(nbatch, s.k, s.n), transpose=True, summed=True),
                      batch=1, red=nbatch, m=s.m, n=s.k, k=s.n, out_dtype=a.dtype, precision=precision, cfg=cfg)
        db = _product(_matrix(a3.reshape(s.m, s.k), transpose=True), _matrix(dc, batched=True), batch=nbatch, red=1,
                      m=s.k, n=s.n, k=s.m, out_dtype=b.dtype, precision=precision, cfg=cfg)
        return da.reshape(a.shape), db.reshape(b.shape)
    # Both batched: per batch, then the broadcast batch dims summed in float32.
    a_full, b_full = _full_batch(a3, s.batch), _full_batch(b3, s.batch)
    a_sums, b_sums = tuple(s.a_batch) != s.batch, tuple(s.b_batch) != s.batch
    da = _product(_matrix(dc, batched=True), _matrix(b_full, transpose=True, batched=True), batch=nbatch, red=1,
                  m=s.m, n=s.k, k=s.n, out_dtype=jnp.float32 if a_sums else a.dtype, precision=precision, cfg=cfg)
    db = _product(_matrix(a_full, transpose=True, batched=True), _matrix(dc, batched=True), batch=nbatch, red=1,
                  m=s.k, n=s.n, k=s.m, out_dtype=jnp.float32 if b_sums else b.dtype, precision=precision, cfg=cfg)
    return (_sum_to(da, s.batch, s.a_batch, a.dtype).reshape(a.shape),
            _sum_to(db, s.batch, s.b_batch, b.dtype).reshape(b.shape))


# ----------------------------------------------------------------------------------------------
# The implementation and its VJP
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: MatmulConfig | None, a: Any, b: Any) -> MatmulConfig:
    return heuristic_config(a, b) if cfg is None else cfg


def forward(
    a: jax.Array,
    b: jax.Array,
    *,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
    cfg: MatmulConfig | None = None,
) -> jax.Array:
    """``jnp.matmul(a, b)`` (broadcast batch dimensions, 1-D operands) with float32 accumulation.

    Args:
        a: ``[..., m, k]`` or ``[k]``.
        b: ``[..., k, n]`` or ``[k]``.
        precision: A pair of ``lax.Precision`` names (lhs, rhs), or one name; see ``_dots``.
        preferred_element_type: The output dtype; ``None`` means ``result_type(a, b)``.
        cfg: Tiles; ``None`` means :func:`heuristic_config`.

    Returns:
        ``jnp.matmul``'s shape in ``preferred_element_type``.
    """
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    return _forward(a, b, _shapes(a, b), out_dtype, precision, _resolve(cfg, a, b))


def gradients(
    operands: tuple[jax.Array, jax.Array],
    d_out: jax.Array,
    *,
    cfg: MatmulConfig | None = None,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` in the dtypes of ``a`` and ``b``: ``d c @ bᵀ`` and ``aᵀ @ d c``, broadcast batches summed."""
    del preferred_element_type
    a, b = operands
    return _backward(a, b, d_out, _shapes(a, b), precision, _resolve(cfg, a, b))


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, MATMUL_RESIDUALS)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def capability(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Supported: every ``jnp.matmul`` shape (any sizes: edges are masked), bfloat16 / float16 /
    float32 operands (mixed ones are cast to their common type), every precision (see ``_dots``)
    and output dtype, operands and outputs (broadcast batches included) below 2**30 elements.
    Needs an NVIDIA GPU (compute capability 8.0+), except in the interpreter mode.
    """
    del precision
    s = _shapes(a, b)
    out = math.prod(s.batch) * s.m * s.n
    full = math.prod(s.batch) * max(s.m * s.k, s.k * s.n)  # broadcast copies and float32 partial gradients
    if preferred_element_type is not None and jnp.dtype(preferred_element_type).name not in _dots.DTYPES:
        return f"preferred_element_type {jnp.dtype(preferred_element_type).name} not supported"
    return _dots.gate((("a", a), ("b", b)), (("out", out), ("a broadcast to the batch", full)))


# (block_m, block_n, block_k, group_m, num_warps, num_stages[, persistent]), in order of preference for big
# products. 16-bit operands on Hopper: 128x256x64 with 8 warps and 3 stages is the usual large-GEMM tile;
# persistent, it measured faster than one program per tile (benchmarks/results/kernel_defaults_h100.md).
_TILES_16 = (
    (128, 256, 64, 8, 8, 3, True), (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4),
    (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (64, 256, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4), (32, 128, 64, 8, 4, 4), (16, 128, 128, 8, 4, 4),
    (64, 64, 32, 8, 4, 2),
)
# float32 operands: twice the bytes per element, and IEEE products run on the FMA units.
_TILES_32 = (
    (128, 128, 32, 8, 8, 3), (128, 64, 32, 8, 4, 3), (64, 128, 32, 8, 4, 3), (64, 64, 32, 8, 4, 3),
    (32, 64, 32, 8, 4, 3), (16, 64, 32, 8, 4, 2), (32, 32, 32, 8, 4, 2),
)
_INTERPRETER = MatmulConfig(block_m=32, block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)


def _make(t: tuple[Any, ...]) -> MatmulConfig:
    return MatmulConfig(block_m=t[0], block_n=t[1], block_k=t[2], group_m=t[3], num_warps=t[4], num_stages=t[5],
                        persistent=len(t) > 6 and t[6])


def _fitting(a: Any, b: Any) -> list[MatmulConfig]:
    """The table of this dtype pruned to what fits the GPU's shared memory (at least its smallest entry)."""
    itemsize = _dots.common_dtype(a, b).itemsize
    table = [_make(t) for t in (_TILES_32 if itemsize == 4 else _TILES_16)]
    limit = _device.smem_limit()

    def smem(c: MatmulConfig) -> int:
        return _dots.smem_bytes(c.block_m, c.block_n, c.block_k, c.num_stages, itemsize, flattened=c.persistent)

    return [c for c in table if smem(c) <= limit] or [min(table, key=smem)]


#: Rows (``a``'s batch folded in) up to which a product is skinny: one row tile, split-K candidates.
_SKINNY_ROWS = 64
#: Contraction each split keeps at least: in the heuristic, and in the autotuning space.
_SPLIT_MIN_K = 512
_SPACE_SPLIT_MIN_K = 256
#: ... and per row of ``a``, so the float32 partial sums stay small beside the operands.
_SPLIT_K_PER_ROW = 64


def _rows_and_batch(a: Any, b: Any) -> tuple[int, int]:
    """The kernel's rows and batch for a call (``a``'s batch folded into rows where ``b`` has none)."""
    s = _shapes(a, b)
    return (math.prod(s.a_batch) * s.m, 1) if s.a_folds else (s.m, math.prod(s.batch))


def _skinny(a: Any, b: Any, rows: int, block_n: int, split_k: int = 1) -> MatmulConfig:
    """One row tile covering ``rows`` (16 to 64) by ``block_n``: contraction steps of 256 bytes a row, as
    many stages (up to 4) as shared memory holds."""
    itemsize = _dots.common_dtype(a, b).itemsize
    block_m, block_k = max(16, next_pow2(rows)), 256 // itemsize
    stages = 4
    while stages > 2 and _dots.smem_bytes(block_m, block_n, block_k, stages, itemsize) > _device.smem_limit():
        stages -= 1
    return MatmulConfig(block_m=block_m, block_n=block_n, block_k=block_k, group_m=8, num_warps=4,
                        num_stages=stages, split_k=split_k)


def _split_k(tiles: int, k: int, rows: int) -> int:
    """The fewest splits (a power of two, at most 16) that bring ``tiles`` to three quarters of the SMs,
    each split keeping ``_SPLIT_MIN_K`` of the contraction and ``_SPLIT_K_PER_ROW`` per row."""
    least = max(_SPLIT_MIN_K, _SPLIT_K_PER_ROW * rows)
    split = 1
    while split < 16 and 4 * tiles * split < 3 * _device.sm_count() and k // (2 * split) >= least:
        split *= 2
    return split


def config_space(a: Any, b: Any, **_: Any) -> list[MatmulConfig]:
    """Autotuning candidates: the dtype's tile table pruned by shared memory, the heuristic's first; for
    skinny products (up to 64 rows) also one row tile by 64 or 128 columns, split 1 to 16 ways (each split
    keeping at least 256 of the contraction).

    Args:
        a: ``[..., m, k]`` or ``[k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[..., k, n]`` or ``[k]``.
        **_: Static arguments of the op, ignored.
    """
    if _env.interpreting_on_cpu():
        return [_INTERPRETER]
    first = heuristic_config(a, b)
    rows, k = _rows_and_batch(a, b)[0], _shapes(a, b).k
    skinny = [] if rows > _SKINNY_ROWS else [
        _skinny(a, b, rows, block_n, split) for block_n in (64, 128) for split in (1, 2, 4, 8, 16)
        if split == 1 or k // split >= _SPACE_SPLIT_MIN_K]
    space = [first]
    for c in (*skinny, *_fitting(a, b)):
        if c not in space:
            space.append(c)
    return space


def heuristic_config(a: Any, b: Any, **_: Any) -> MatmulConfig:
    """A tile by shape and device, not timed here: the first fitting tile that leaves no SM idle, split-K
    where the output has too few tiles.

    Skinny products (up to 64 rows, decode): one row tile (16, 32 or 64 rows) by 64 columns. Otherwise
    walks the dtype's table (16-bit on Hopper starts at 128x256x64, 8 warps, 3 stages, persistent) and
    takes the first tile whose tile count covers the GPU's SMs, skipping tiles taller than the rows;
    when none does, the one with the most tiles. Then, with fewer tiles than three quarters of the SMs
    (and not persistent), split-K: the fewest splits that reach that, each keeping at least 512 of the
    contraction and 64 per row. In the interpreter mode (CPU), 32x32x32 tiles.

    Args: as for :func:`config_space`.
    """
    if _env.interpreting_on_cpu():
        return _INTERPRETER
    s = _shapes(a, b)
    rows, batch = _rows_and_batch(a, b)

    def tiles(c: MatmulConfig) -> int:
        return batch * cdiv(rows, fit_block(c.block_m, rows)) * cdiv(s.n, fit_block(c.block_n, s.n))

    sms = _device.sm_count()
    if rows <= _SKINNY_ROWS:
        cfg = _skinny(a, b, rows, 64)
    else:
        fitting = [c for c in _fitting(a, b) if c.block_m <= max(16, 2 * rows)] or _fitting(a, b)[-1:]
        cfg = next((c for c in fitting if tiles(c) >= sms), max(fitting, key=tiles))
    if cfg.persistent:
        return cfg
    return attrs.evolve(cfg, split_k=_split_k(tiles(cfg), s.k, rows))
