"""``matmul`` as the CuTe DSL Hopper GEMM (``kernels.matmul``): ``jnp.matmul`` shapes, float32 accumulation.

The kernel computes ``c[l] = A[l] @ B[l]`` for ``[L, M, K]`` / ``[L, K, N]`` operands, each read
as-is or transposed: ``cutlass.jax.TensorSpec.mode`` presents a row-major JAX buffer in either
majorness, so no operand is ever copied to transpose it. This module maps ``jnp.matmul``'s shapes
onto it:

- when ``b`` has no batch (or only size-1 batch dims), ``a``'s batch folds into its rows: one
  2-D product;
- otherwise both operands are broadcast to the common batch (a copy only where an operand's own
  batch dims are broadcast) and the kernel runs over the batch (its ``L`` mode).

Backward: ``d a = d c @ bᵀ`` and ``d b = aᵀ @ d c`` through the same kernel (``bᵀ`` and ``aᵀ``
are the other majorness of the residual buffers). Broadcast batches are summed in float32 after
per-batch products written in float32. Residuals: the two operands (``"matmul:inputs"``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from ejk.plugin import MATMUL_RESIDUALS, cdiv, int_in, one_of, operand_vjp
from ejk_cute import _compile, _device, _status

__all__ = [
    "MatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "heuristic_config",
    "product",
    "smem_bytes",
    "vjp",
]

#: Operand dtypes the kernel takes (both operands the same).
DTYPES = ("bfloat16", "float16")
#: Output dtypes (float32 accumulation, rounded once).
OUT_DTYPES = ("bfloat16", "float16", "float32")
#: TMA needs every stride but the unit one to be a multiple of 16 bytes: 8 16-bit elements.
ALIGN = 8
#: Largest operand or output (elements): the kernel's layouts index with int32.
MAX_ELEMENTS = 2**31
_BLOCK_K = 64
_EPI_STAGES = 2
_BARRIER_BYTES = 1024


@attrs.frozen(kw_only=True)
class MatmulConfig:
    """Tile, cluster and pipeline depth of the CuTe Hopper GEMM.

    Attributes:
        tile_m: Output rows per CTA (64: one consumer warpgroup; 128, 256: two, each half the rows).
        tile_n: Output columns per CTA.
        cluster_m: CTAs of a cluster along M (they share ``b``'s slices through TMA multicast).
        cluster_n: CTAs of a cluster along N (they share ``a``'s slices).
        stages: Depth of the shared-memory ring of ``[tile, 64]`` K-slices.
        swizzle: Output tiles per group of the persistent walk (consecutive tiles share operands in L2).
    """

    tile_m: int = attrs.field(default=128, validator=one_of(64, 128, 256))
    tile_n: int = attrs.field(default=256, validator=one_of(64, 128, 256))
    cluster_m: int = attrs.field(default=2, validator=one_of(1, 2))
    cluster_n: int = attrs.field(default=1, validator=one_of(1, 2))
    stages: int = attrs.field(default=4, validator=int_in(2, 8))
    swizzle: int = attrs.field(default=8, validator=one_of(1, 2, 4, 8, 16))

    def __attrs_post_init__(self) -> None:
        # Each consumer thread holds tile_m * tile_n / 256 float32 accumulators; 128 is the most
        # that leaves registers for the epilogue (232 per thread).
        if self.tile_m * self.tile_n > 128 * 256:
            raise ValueError(f"tile_m * tile_n = {self.tile_m}x{self.tile_n} needs too many accumulator registers; "
                             "use at most 128x256 or 256x128")
        if self.tile_m == 64 and self.tile_n < 128:
            raise ValueError("a 64-row tile needs tile_n >= 128 (64x64 leaves wgmma idle)")


def smem_bytes(cfg: MatmulConfig, in_itemsize: int = 2, out_itemsize: int = 2) -> int:
    """Shared memory of a config (bytes): the ring, the epilogue buffers and the barriers."""
    ring = cfg.stages * (cfg.tile_m + cfg.tile_n) * _BLOCK_K * in_itemsize
    epi_m = min(128 if cfg.tile_m >= 128 else 64, cfg.tile_m)
    epi = _EPI_STAGES * epi_m * min(32, cfg.tile_n) * out_itemsize
    return ring + epi + _BARRIER_BYTES


# ----------------------------------------------------------------------------------------------
# One launch: c[l] = A[l] @ B[l], operands read as-is or transposed
# ----------------------------------------------------------------------------------------------


@functools.cache
def _kernel() -> Any:
    _compile.import_cutlass()
    from ejk_cute.kernels import matmul

    return matmul


def _spec(transposed: bool) -> Any:
    """The ``TensorSpec`` of a row-major ``[L, r, c]`` buffer seen as ``(r, c, L)`` (or ``(c, r, L)``)."""
    from cutlass.jax import TensorSpec

    return TensorSpec(mode=(2, 1, 0) if transposed else (1, 2, 0), divisibility=ALIGN)


def product(x: jax.Array, y: jax.Array, *, x_t: bool = False, y_t: bool = False, out_dtype: Any,
            cfg: MatmulConfig) -> jax.Array:
    """``[L, M, N]``: ``op(x[l]) @ op(y[l])`` where ``op`` transposes when ``x_t`` / ``y_t`` says so.

    Args:
        x: ``[L, M, K]`` (``[L, K, M]`` when ``x_t``), bfloat16 or float16, last dim a multiple of 8.
        y: ``[L, K, N]`` (``[L, N, K]`` when ``y_t``), ``x``'s dtype, last dim a multiple of 8.
        x_t, y_t: Read the operand transposed (its other majorness; no copy).
        out_dtype: bfloat16, float16 or float32.
        cfg: The kernel's config.
    """
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0]:
        raise ValueError(f"product takes [L, r, c] operands of one batch, got {x.shape} and {y.shape}")
    batch = x.shape[0]
    m, k = (x.shape[2], x.shape[1]) if x_t else (x.shape[1], x.shape[2])
    k_y, n = (y.shape[2], y.shape[1]) if y_t else (y.shape[1], y.shape[2])
    if k != k_y:
        raise ValueError(f"product: contraction sizes differ ({k} and {k_y})")
    if batch * m * n == 0 or k == 0:
        return jnp.zeros((batch, m, n), out_dtype)
    kernel = _kernel()
    call = _compile.cutlass_call(
        kernel.launch, outputs=jax.ShapeDtypeStruct((batch, m, n), out_dtype),
        # The kernel's b is (N, K, L): y as stored is K-major only when it is read transposed.
        input_spec=(_spec(x_t), _spec(not y_t)), output_spec=(_spec(False),),
        tile_m=cfg.tile_m, tile_n=cfg.tile_n, cluster_m=cfg.cluster_m, cluster_n=cfg.cluster_n,
        stages=cfg.stages, swizzle=cfg.swizzle,
        max_clusters=max(1, _device.sm_count() // (cfg.cluster_m * cfg.cluster_n)))
    return call(x, y)  # type: ignore[no-any-return]


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
    def folds(self) -> bool:
        """``b`` has no batch to speak of: ``a``'s batch folds into its rows."""
        return math.prod(self.b_batch) == 1

    @property
    def rows(self) -> int:
        """Rows of one launch's output (``a``'s whole batch when it folds)."""
        return math.prod(self.a_batch) * self.m if self.folds else self.m

    @property
    def launches(self) -> int:
        """The kernel's batch (``L``)."""
        return 1 if self.folds else math.prod(self.batch)

    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, *(() if self.a_vector else (self.m,)), *(() if self.b_vector else (self.n,)))


def _shapes(a: Any, b: Any) -> _Shapes:
    a_shape = (1, *a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = (*b.shape, 1) if b.ndim == 1 else tuple(b.shape)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    return _Shapes(a_shape[:-2], b_shape[:-2], batch, a_shape[-2], a_shape[-1], b_shape[-1], a.ndim == 1, b.ndim == 1)


def _operands(a: jax.Array, b: jax.Array, s: _Shapes) -> tuple[jax.Array, jax.Array]:
    """``a``, ``b`` as ``[L, rows, k]``, ``[L, k, n]`` (broadcast to the batch unless ``a`` folds)."""
    if s.folds:
        return a.reshape(1, s.rows, s.k), b.reshape(1, s.k, s.n)
    a3 = jnp.broadcast_to(a.reshape(*s.a_batch, s.m, s.k), (*s.batch, s.m, s.k))
    b3 = jnp.broadcast_to(b.reshape(*s.b_batch, s.k, s.n), (*s.batch, s.k, s.n))
    return a3.reshape(s.launches, s.m, s.k), b3.reshape(s.launches, s.k, s.n)


def _sum_to(x: jax.Array, batch: tuple[int, ...], target: tuple[int, ...], dtype: Any) -> jax.Array:
    """``x`` ``[prod(batch), r, c]`` summed over the batch dims ``target`` broadcasts, as ``[*target, r, c]``."""
    x = x.reshape(*batch, *x.shape[-2:])
    lead = len(batch) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target) if t == 1 and batch[lead + i] != 1)
    return jnp.sum(x, axis=axes).reshape(*target, *x.shape[-2:]).astype(dtype) if axes else x.astype(dtype)


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
    """``jnp.matmul(a, b)`` for 16-bit operands, float32 accumulation, one rounding to the output dtype.

    Args:
        a: ``[..., m, k]`` or ``[k]``, bfloat16 or float16.
        b: ``[..., k, n]``, ``a``'s dtype.
        precision: Accepted for the op's signature: 16-bit products are exact in float32 at every precision.
        preferred_element_type: The output dtype; ``None`` means ``result_type(a, b)``.
        cfg: Tiles; ``None`` means :func:`heuristic_config`.
    """
    del precision
    out_dtype = jnp.result_type(a, b) if preferred_element_type is None else preferred_element_type
    s = _shapes(a, b)
    x, y = _operands(a, b, s)
    return product(x, y, out_dtype=out_dtype, cfg=_resolve(cfg, a, b)).reshape(s.out_shape())


def gradients(
    operands: tuple[jax.Array, jax.Array],
    d_out: jax.Array,
    *,
    cfg: MatmulConfig | None = None,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` in the dtypes of ``a`` and ``b``: ``d c @ bᵀ`` and ``aᵀ @ d c``, broadcast batches summed."""
    del precision, preferred_element_type
    a, b = operands
    s = _shapes(a, b)
    cfg = _resolve(cfg, a, b)
    x, y = _operands(a, b, s)
    dc = d_out.astype(a.dtype).reshape(s.launches, s.rows, s.n)
    a_sums = not s.folds and tuple(s.a_batch) != s.batch
    b_sums = not s.folds and tuple(s.b_batch) != s.batch
    da = product(dc, y, y_t=True, out_dtype=jnp.float32 if a_sums else a.dtype, cfg=cfg)
    db = product(x, dc, x_t=True, out_dtype=jnp.float32 if b_sums else b.dtype, cfg=cfg)
    if not s.folds:
        da = _sum_to(da, s.batch, s.a_batch, a.dtype)
        db = _sum_to(db, s.batch, s.b_batch, b.dtype)
    return da.reshape(a.shape), db.reshape(b.shape)


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, MATMUL_RESIDUALS)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def shape_reason(a: Any, b: Any, preferred_element_type: Any = None) -> str | None:
    """Why the kernel cannot take these operands (dtypes, TMA alignment, sizes), else ``None``; no device check."""
    names = (("a", a), ("b", b))
    for name, x in names:
        if jnp.dtype(x.dtype).name not in DTYPES:
            return f"{name} of dtype {jnp.dtype(x.dtype).name} not supported (bfloat16 or float16 only)"
    if jnp.dtype(a.dtype) != jnp.dtype(b.dtype):
        return f"a and b must share a dtype (got {jnp.dtype(a.dtype).name} and {jnp.dtype(b.dtype).name})"
    if preferred_element_type is not None and jnp.dtype(preferred_element_type).name not in OUT_DTYPES:
        return f"preferred_element_type {jnp.dtype(preferred_element_type).name} not supported"
    s = _shapes(a, b)
    if s.b_vector:
        return "a 1-D b (a column) is not supported: TMA needs n to be a multiple of 8"
    for dim, size in (("k", s.k), ("n", s.n)):
        if size % ALIGN:
            return f"{dim} = {size} is not a multiple of {ALIGN} (TMA needs 16-byte aligned rows)"
    largest = max(math.prod(s.batch) * max(s.m * s.k, s.k * s.n, s.m * s.n), 1)
    if largest >= MAX_ELEMENTS:
        return f"an operand or output has {largest} elements; the kernel indexes with int32 (fewer than 2**31)"
    return None


def capability(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Needs nvidia-cutlass-dsl and an sm_90+ NVIDIA GPU; bfloat16 or float16 operands of one dtype
    (every precision: their products are exact in float32), any output dtype of the op, ``k`` and
    ``n`` multiples of 8 (TMA's 16-byte row alignment; ``m`` and the batch are free), and no operand
    or output of 2**31 elements or more.
    """
    del precision
    return _status.runtime_reason() or shape_reason(a, b, preferred_element_type)


#: (tile_m, tile_n) in order of preference for large products; 128x256 is Hopper's large-GEMM tile.
TILES = ((128, 256), (256, 128), (128, 128))
#: (cluster_m, cluster_n): pairs of CTAs share one operand's slices through TMA multicast.
CLUSTERS = ((2, 1), (1, 2), (1, 1))
_MAX_STAGES = 6


def deepest(tile_m: int, tile_n: int, cluster_m: int, cluster_n: int, out_itemsize: int = 2,
            swizzle: int = 8) -> MatmulConfig:
    """The config of this tile and cluster with the deepest ring that fits shared memory (at most 6 stages)."""
    limit = _device.smem_capacity()
    for stages in range(_MAX_STAGES, 1, -1):
        cfg = MatmulConfig(tile_m=tile_m, tile_n=tile_n, cluster_m=cluster_m, cluster_n=cluster_n, stages=stages,
                           swizzle=swizzle)
        if smem_bytes(cfg, 2, out_itemsize) <= limit:
            return cfg
    raise ValueError(f"tile {tile_m}x{tile_n} does not fit shared memory with 2 stages")


def _out_itemsize(a: Any, b: Any, preferred_element_type: Any) -> int:
    dtype = jnp.result_type(a.dtype, b.dtype) if preferred_element_type is None else preferred_element_type
    return int(jnp.dtype(dtype).itemsize)


def config_space(a: Any, b: Any, *, preferred_element_type: Any = None, **_: Any) -> list[MatmulConfig]:
    """Autotuning candidates: every tile x cluster with its deepest fitting ring, the heuristic's first.

    Args:
        a: ``[..., m, k]`` or ``[k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[..., k, n]``.
        preferred_element_type: The output dtype (its size counts in the epilogue's shared memory).
        **_: Other static arguments of the op, ignored.
    """
    size = _out_itemsize(a, b, preferred_element_type)
    first = heuristic_config(a, b, preferred_element_type=preferred_element_type)
    space = [deepest(*t, *c, out_itemsize=size) for t in TILES for c in CLUSTERS]
    return [first, *(c for c in space if c != first)]


def heuristic_config(a: Any, b: Any, *, preferred_element_type: Any = None, **_: Any) -> MatmulConfig:
    """A config by shape, not timed: the largest tile whose tile count still covers the SMs.

    128x256 with a 2x1 cluster for large products; 256x128 when ``n`` is the small side; 128x128
    (no cluster) when the big tiles would leave SMs idle.

    Args: as for :func:`config_space`.
    """
    s = _shapes(a, b)
    size = _out_itemsize(a, b, preferred_element_type)
    sms = _device.sm_count()

    def tiles(tm: int, tn: int) -> int:
        return s.launches * cdiv(s.rows, tm) * cdiv(s.n, tn)

    order = ((256, 128), (128, 256)) if s.n < s.rows else ((128, 256), (256, 128))
    for tm, tn in order:
        if tiles(tm, tn) >= sms:
            cluster = (2, 1) if tm == 128 else (1, 2)
            return deepest(tm, tn, *cluster, out_itemsize=size)
    return deepest(128, 128, 1, 1, out_itemsize=size)
