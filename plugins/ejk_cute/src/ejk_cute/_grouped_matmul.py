"""``grouped_matmul`` (mixture of experts) as the CuTe DSL Hopper grouped GEMM (``kernels.grouped_matmul``).

Rows of ``lhs`` form consecutive groups; group ``i`` is multiplied by ``rhs[i]``. The group
boundaries (sizes sanitised: negative sizes count as 0, rows past ``m`` are dropped) and each
group's work items are computed on the device before the launch (:func:`plan`); nothing of
size ``[g, m, n]`` is built, and one launch covers every group.

- forward: one persistent launch walks (group, row tile, column tile) items; rows past
  ``sum(group_sizes)`` are written as zeros by the same launch;
- ``d lhs = d out @ rhs[group]ᵀ``: the same kernel, ``rhs`` read transposed (its other
  majorness through ``TensorSpec.mode``; no copy);
- ``d rhs[i] = lhs_iᵀ @ d out_i``: a second kernel (:func:`outer`), the dense GEMM's walk over
  ``(k, n, group)`` output tiles, each reducing over its group's rows (TMA from the group's first
  row; the next group's rows in the last slice are zeroed in shared memory before the MMAs).

Residuals ``"grouped_matmul:inputs"`` (``lhs, rhs, group_sizes``), as ejk-triton's and ejk-xla's:
an ``ImplChoice`` may pair this forward with their backward and the other way round.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk.plugin import GROUPED_MATMUL_RESIDUALS, cdiv, int_in, one_of, operand_vjp
from ejk_cute import _compile, _device, _matmul, _status

__all__ = [
    "GroupedMatmulConfig",
    "capability",
    "config_space",
    "forward",
    "gradients",
    "heuristic_config",
    "outer",
    "plan",
    "product",
    "shape_reason",
    "smem_bytes",
    "vjp",
]

DTYPES = _matmul.DTYPES
OUT_DTYPES = _matmul.OUT_DTYPES
ALIGN = _matmul.ALIGN
MAX_ELEMENTS = _matmul.MAX_ELEMENTS


@attrs.frozen(kw_only=True)
class GroupedMatmulConfig:
    """Tile, cluster and pipeline depth of the CuTe grouped GEMM.

    Attributes:
        tile_m: Rows per CTA tile (two consumer warpgroups, each half the rows); a row tile never
            spans two groups, so small groups waste part of it.
        tile_n: Columns per CTA tile.
        cluster_m: CTAs per cluster: 2 takes two consecutive row tiles of one group per cluster,
            sharing ``rhs``'s slices through TMA multicast.
        stages: Depth of the shared-memory ring of ``[tile, 64]`` K-slices.
    """

    tile_m: int = attrs.field(default=128, validator=one_of(128))
    tile_n: int = attrs.field(default=256, validator=one_of(128, 256))
    cluster_m: int = attrs.field(default=1, validator=one_of(1, 2))
    stages: int = attrs.field(default=4, validator=int_in(2, 8))

    def as_matmul(self) -> _matmul.MatmulConfig:
        """The dense kernel's config of the same tile, cluster and ring (shared memory is the same)."""
        return _matmul.MatmulConfig(tile_m=self.tile_m, tile_n=self.tile_n, cluster_m=self.cluster_m, cluster_n=1,
                                    stages=self.stages)


def smem_bytes(cfg: GroupedMatmulConfig, in_itemsize: int = 2, out_itemsize: int = 2) -> int:
    """Shared memory of a config (bytes): the dense kernel's ring, epilogue buffers and barriers."""
    return _matmul.smem_bytes(cfg.as_matmul(), in_itemsize, out_itemsize)


# ----------------------------------------------------------------------------------------------
# One launch
# ----------------------------------------------------------------------------------------------


@functools.cache
def _kernel() -> Any:
    _compile.import_cutlass()
    from ejk_cute.kernels import grouped_matmul

    return grouped_matmul


def _ends(group_sizes: jax.Array, m: int) -> jax.Array:
    """``[g]`` int32: the row after each group (sizes sanitised, clipped to ``m``)."""
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    return jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)


def plan(group_sizes: jax.Array, m: int, n: int, cfg: GroupedMatmulConfig) -> tuple[jax.Array, jax.Array]:
    """The kernel's work list: ``rows`` and ``items``, int32 ``[g + 2]`` each (see ``kernels.grouped_matmul``).

    Group ``i`` owns rows ``rows[i]:rows[i + 1]`` and items ``items[i]:items[i + 1]`` (its cluster
    row tiles times ``n``'s column tiles); entry ``g`` is the tail of rows in no group, which the
    kernel writes as zeros.
    """
    zero = jnp.zeros((1,), jnp.int32)
    rows = jnp.concatenate([zero, _ends(group_sizes, m), jnp.full((1,), m, jnp.int32)])
    band = cfg.tile_m * cfg.cluster_m
    tiles = (jnp.diff(rows) + band - 1) // band * cdiv(n, cfg.tile_n)
    return rows, jnp.concatenate([zero, jnp.cumsum(tiles).astype(jnp.int32)])


def _spec(mode: tuple[int, ...]) -> Any:
    from cutlass.jax import TensorSpec

    return TensorSpec(mode=mode, divisibility=ALIGN)


def product(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, w_t: bool = False, out_dtype: Any,
            cfg: GroupedMatmulConfig) -> jax.Array:
    """``out[r] = x[r] @ w[group(r)]`` (``w[group(r)]ᵀ`` with ``w_t``); rows in no group are zeros.

    Args:
        x: ``[m, k]``, bfloat16 or float16, ``k`` a multiple of 8.
        w: ``[g, k, n]`` (``[g, n, k]`` with ``w_t``), ``x``'s dtype, both last dims multiples of 8.
        group_sizes: ``[g]`` integers.
        w_t: Read ``w`` transposed (its other majorness; no copy).
        out_dtype: bfloat16, float16 or float32.
        cfg: The kernel's config.
    """
    if x.ndim != 2 or w.ndim != 3:
        raise ValueError(f"product takes x [m, k] and w [g, k, n], got {x.shape} and {w.shape}")
    m, k = x.shape
    groups = w.shape[0]
    k_w, n = (w.shape[2], w.shape[1]) if w_t else (w.shape[1], w.shape[2])
    if k != k_w:
        raise ValueError(f"product: contraction sizes differ ({k} and {k_w})")
    if m * n == 0 or groups == 0 or k == 0:  # nothing to write, no group owns a row, or empty sums
        return jnp.zeros((m, n), out_dtype)
    rows, items = plan(group_sizes, m, n, cfg)
    kernel = _kernel()
    call = _compile.cutlass_call(
        kernel.launch, outputs=jax.ShapeDtypeStruct((1, m, n), out_dtype),
        # The kernel's b is (N, K, G): w as stored ([g, k, n]) is N-major, transposed ([g, n, k]) K-major.
        input_spec=(_spec((1, 2, 0)), _spec((1, 2, 0) if w_t else (2, 1, 0)), None, None),
        output_spec=(_spec((1, 2, 0)),),
        tile_m=cfg.tile_m, tile_n=cfg.tile_n, cluster_m=cfg.cluster_m, stages=cfg.stages,
        max_clusters=max(1, _device.sm_count() // cfg.cluster_m))
    return call(x.reshape(1, m, k), w, rows, items).reshape(m, n)  # type: ignore[no-any-return]


def outer(x: jax.Array, y: jax.Array, group_sizes: jax.Array, groups: int, *, out_dtype: Any,
          cfg: GroupedMatmulConfig) -> jax.Array:
    """``out[i] = x_iᵀ @ y_i`` over group ``i``'s rows: ``x`` ``[m, k]``, ``y`` ``[m, n]``, out ``[g, k, n]``.

    Float32 sums; an empty group's product is zeros. Both operands are read transposed (their
    M-major views; no copy).
    """
    m, k = x.shape
    n = y.shape[1]
    if groups * k * n == 0 or m == 0:
        return jnp.zeros((groups, k, n), out_dtype)
    rows = jnp.concatenate([jnp.zeros((1,), jnp.int32), _ends(group_sizes, m)])
    call = _compile.cutlass_call(
        _kernel().launch_outer, outputs=jax.ShapeDtypeStruct((groups, k, n), out_dtype),
        input_spec=(_spec((2, 1, 0)), _spec((2, 1, 0)), None), output_spec=(_spec((1, 2, 0)),),
        tile_m=cfg.tile_m, tile_n=cfg.tile_n, cluster_m=cfg.cluster_m, stages=cfg.stages,
        max_clusters=max(1, _device.sm_count() // cfg.cluster_m))
    return call(x.reshape(1, m, k), y.reshape(1, m, n), rows)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# The implementation and its VJP
# ----------------------------------------------------------------------------------------------


def _resolve(cfg: GroupedMatmulConfig | None, lhs: Any, rhs: Any, group_sizes: Any,
             preferred_element_type: Any = None) -> GroupedMatmulConfig:
    if cfg is None:
        return heuristic_config(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)
    return cfg


def forward(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
    cfg: GroupedMatmulConfig | None = None,
) -> jax.Array:
    """Row-grouped matmul: consecutive row groups of ``lhs``, group ``i`` times ``rhs[i]``.

    Args:
        lhs: ``[m, k]``, bfloat16 or float16.
        rhs: ``[g, k, n]``, ``lhs``'s dtype.
        group_sizes: ``[g]`` integers (non-negative, ``sum <= m``); rows past the sum are zeros.
        precision: Accepted for the op's signature: 16-bit products are exact in float32 at every precision.
        preferred_element_type: The output dtype; ``None`` means ``lhs.dtype``.
        cfg: Tiles; ``None`` means :func:`heuristic_config`.

    Returns:
        ``[m, n]`` in ``preferred_element_type`` (float32 accumulation, one rounding).
    """
    del precision
    out_dtype = lhs.dtype if preferred_element_type is None else preferred_element_type
    cfg = _resolve(cfg, lhs, rhs, group_sizes, out_dtype)
    return product(lhs, rhs, group_sizes, out_dtype=out_dtype, cfg=cfg)


def gradients(
    operands: tuple[jax.Array, jax.Array, jax.Array],
    d_out: jax.Array,
    *,
    cfg: GroupedMatmulConfig | None = None,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
) -> tuple[jax.Array, jax.Array, None]:
    """``(d lhs, d rhs, None)`` in the dtypes of ``lhs`` and ``rhs``; ``group_sizes`` (integers) has none.

    ``d lhs`` runs the grouped kernel on ``rhs`` transposed, ``d rhs`` the ragged-reduction kernel (:func:`outer`).
    """
    del precision, preferred_element_type
    lhs, rhs, group_sizes = operands
    cfg = _resolve(cfg, lhs, rhs, group_sizes)
    dy = d_out.astype(lhs.dtype)
    d_lhs = product(dy, rhs, group_sizes, w_t=True, out_dtype=lhs.dtype, cfg=cfg)
    d_rhs = outer(lhs, dy, group_sizes, rhs.shape[0], out_dtype=rhs.dtype, cfg=cfg)
    return d_lhs, d_rhs, None


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(forward, gradients, GROUPED_MATMUL_RESIDUALS)


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def shape_reason(lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = None) -> str | None:
    """Why the kernel cannot take these operands (dtypes, TMA alignment, sizes), else ``None``; no device check."""
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if jnp.dtype(x.dtype).name not in DTYPES:
            return f"{name} of dtype {jnp.dtype(x.dtype).name} not supported (bfloat16 or float16 only)"
    if jnp.dtype(lhs.dtype) != jnp.dtype(rhs.dtype):
        return (f"lhs and rhs must share a dtype (got {jnp.dtype(lhs.dtype).name} and "
                f"{jnp.dtype(rhs.dtype).name})")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        return f"group_sizes of dtype {jnp.dtype(group_sizes.dtype).name} not supported (integers only)"
    if preferred_element_type is not None and jnp.dtype(preferred_element_type).name not in OUT_DTYPES:
        return f"preferred_element_type {jnp.dtype(preferred_element_type).name} not supported"
    m, k = (int(d) for d in lhs.shape)
    groups, n = int(rhs.shape[0]), int(rhs.shape[2])
    for dim, size in (("k", k), ("n", n)):
        if size % ALIGN:
            return f"{dim} = {size} is not a multiple of {ALIGN} (TMA needs 16-byte aligned rows)"
    largest = max(m * k, m * n, groups * k * n, 1)
    if largest >= MAX_ELEMENTS:
        return f"an operand or output has {largest} elements; the kernel indexes with int32 (fewer than 2**31)"
    return None


def capability(lhs: Any, rhs: Any, group_sizes: Any, *, precision: Any = None,
               preferred_element_type: Any = None) -> str | None:
    """Why this implementation cannot run a call, or ``None`` when it can (abstract arguments suffice).

    Needs nvidia-cutlass-dsl and an sm_90+ NVIDIA GPU; bfloat16 or float16 operands of one dtype
    (every precision: their products are exact in float32), integer group sizes, any output
    dtype of the op, ``k`` and ``n`` multiples of 8 (TMA's 16-byte row alignment; ``m`` and the
    group sizes are free: empty groups, rows past the sum), and no operand or output of 2**31
    elements or more.
    """
    del precision
    return _status.runtime_reason() or shape_reason(lhs, rhs, group_sizes, preferred_element_type)


#: (tile_m, tile_n): 128x256 for large groups, 128x128 where 256 columns leave SMs idle.
TILES = ((128, 256), (128, 128))
#: cluster_m: 2 shares rhs's slices between two row tiles of one group (TMA multicast).
CLUSTERS = (1, 2)
_MAX_STAGES = 6


def deepest(tile_m: int, tile_n: int, cluster_m: int, out_itemsize: int = 2) -> GroupedMatmulConfig:
    """The config of this tile and cluster with the deepest ring that fits shared memory (at most 6 stages)."""
    dense = _matmul.deepest(tile_m, tile_n, cluster_m, 1, out_itemsize=out_itemsize)
    return GroupedMatmulConfig(tile_m=tile_m, tile_n=tile_n, cluster_m=cluster_m,
                               stages=min(dense.stages, _MAX_STAGES))


def _out_itemsize(lhs: Any, preferred_element_type: Any) -> int:
    return int(jnp.dtype(lhs.dtype if preferred_element_type is None else preferred_element_type).itemsize)


def config_space(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                 **_: Any) -> list[GroupedMatmulConfig]:
    """Autotuning candidates: every tile x cluster with its deepest fitting ring, the heuristic's first.

    Args:
        lhs: ``[m, k]`` (anything with ``.shape`` and ``.dtype``).
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]``.
        preferred_element_type: The output dtype (its size counts in the epilogue's shared memory).
        **_: Other static arguments of the op, ignored.
    """
    size = _out_itemsize(lhs, preferred_element_type)
    first = heuristic_config(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)
    space = [deepest(*t, c, out_itemsize=size) for t in TILES for c in CLUSTERS]
    return [first, *(c for c in space if c != first)]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                     **_: Any) -> GroupedMatmulConfig:
    """A config by shape, not timed: 128x256 tiles when their count (at equal groups) covers the SMs, else 128x128.

    Row tiles never straddle groups, so the tile count is ``g · cdiv(m / g, 128)`` row tiles
    times the column tiles. The 2x1 cluster (``rhs`` multicast) is chosen when the average group
    has at least two row tiles, so both CTAs of a cluster mostly have rows to multiply.

    Args: as for :func:`config_space`.
    """
    del group_sizes
    m, groups, n = int(lhs.shape[0]), max(int(rhs.shape[0]), 1), int(rhs.shape[2])
    size = _out_itemsize(lhs, preferred_element_type)
    average = max(cdiv(m, groups), 1)
    row_tiles = groups * cdiv(average, 128)
    tile_n = 256 if row_tiles * cdiv(n, 256) >= _device.sm_count() else 128
    cluster = 2 if average >= 2 * 128 else 1
    return deepest(128, tile_n, cluster, out_itemsize=size)
