"""XLA ``grouped_matmul`` (mixture-of-experts): a scan over (row tile, group) work items.

The ``m`` rows of ``lhs`` are cut into tiles of ``block_m`` rows. Groups are consecutive row
ranges, so the (tile, group) pairs that share at least one row number at most
``ceil(m / block_m) + g - 1``; they form a static-length *work list*, built from the
cumulative group offsets. A ``lax.scan`` walks the list: each item multiplies its row tile
by ``rhs[group]``, keeps the rows of that group and adds them into the float32 output
tile, cast once at the end to ``preferred_element_type``. Nothing of size ``[g, m, n]``
(or a per-row ``[m, k, n]`` gather) is ever built.

The gradient (a ``jax.custom_vjp``) reuses the work list: ``d lhs`` is the same grouped
product with each ``rhs[i]`` transposed, and ``d rhs[i] = lhs_iᵀ @ dout_i`` is accumulated
per group into a ``[g, k, n]`` float32 buffer. Both use the forward's ``precision``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk.plugin import cotangent_like, gated_output, positive_int, varying_like

__all__ = ["GroupedMatmulConfig", "config_space", "grouped_matmul", "heuristic_config"]

#: A pair of ``lax.Precision`` names (lhs, rhs), or one name for both, as ``ejk.grouped_matmul`` passes it.
Precision = str | tuple[str, str]

_BLOCK_CHOICES = (8, 16, 32, 64, 128, 256, 512)


@attrs.frozen(kw_only=True)
class GroupedMatmulConfig:
    """Config of the XLA grouped matmul.

    Attributes:
        block_m: Rows per tile (clipped to ``m``). Larger tiles mean fewer scan steps but
            more wasted work where a tile straddles several groups: the work is about
            ``(m + (g - 1) * block_m) * k * n`` multiply-adds.
    """

    block_m: int = attrs.field(default=128, validator=positive_int)


class _WorkList(NamedTuple):
    """One entry per (row tile, group) work item; padding items cover no rows."""

    tile_start: jax.Array  # first row of the tile slice (so that it fits inside [0, m))
    group: jax.Array  # which rhs matrix
    row_lo: jax.Array  # the item's rows are [row_lo, row_hi): the group's rows in this tile
    row_hi: jax.Array


def _work_list(group_sizes: jax.Array, m: int, block: int, groups: int) -> _WorkList:
    """The (tile, group) pairs that share rows, sorted by group, padded to a static length.

    Sizes are sanitised (negatives count as 0, rows past ``m`` are dropped), so any input
    gives a well-defined list of ``ceil(m / block) + groups - 1`` items.
    """
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    first_tile = starts // block
    counts = jnp.where(ends > starts, (ends - 1) // block - first_tile + 1, 0)  # tiles per group
    cum_counts = jnp.cumsum(counts)
    item = jnp.arange(-(-m // block) + groups - 1, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(cum_counts, item, side="right"), groups - 1).astype(jnp.int32)
    valid = item < cum_counts[-1]
    tile_lo = (first_tile[group] + item - (cum_counts[group] - counts[group])) * block
    return _WorkList(
        tile_start=jnp.where(valid, jnp.clip(tile_lo, 0, m - block), 0),
        group=group,
        row_lo=jnp.where(valid, jnp.maximum(starts[group], tile_lo), 0),
        row_hi=jnp.where(valid, jnp.minimum(ends[group], tile_lo + block), 0),
    )


def _row_mask(item: _WorkList, block: int) -> jax.Array:
    rows = item.tile_start + jnp.arange(block, dtype=jnp.int32)
    return (rows >= item.row_lo) & (rows < item.row_hi)


def _grouped_product(
    x: jax.Array, w: jax.Array, group_sizes: jax.Array, block: int, precision: Precision, *, transpose_w: bool
) -> jax.Array:
    """``out[r] = x[r] @ w[group(r)]`` (or ``@ w[group(r)].T``) in float32; rows in no group are 0.

    Args:
        x: ``[m, a]``.
        w: ``[g, a, b]``, or ``[g, b, a]`` with ``transpose_w``.
        group_sizes: ``[g]``.
        block: Rows per tile, ``1 <= block <= m``.
        precision: Of the products.
        transpose_w: Contract ``x`` with the last axis of each ``w[i]`` instead of the first.

    Returns:
        ``[m, b]`` float32.
    """
    m = x.shape[0]
    n_out = w.shape[1] if transpose_w else w.shape[2]
    contract_w = 1 if transpose_w else 0
    dtype = jnp.promote_types(x.dtype, w.dtype)

    def step(acc: jax.Array, item: _WorkList) -> tuple[jax.Array, None]:
        x_tile = lax.dynamic_slice_in_dim(x, item.tile_start, block).astype(dtype)
        w_group = lax.dynamic_index_in_dim(w, item.group, keepdims=False).astype(dtype)
        product = lax.dot_general(
            x_tile, w_group, (((1,), (contract_w,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        product = jnp.where(_row_mask(item, block)[:, None], product, 0.0)
        tile = lax.dynamic_slice_in_dim(acc, item.tile_start, block)
        return lax.dynamic_update_slice_in_dim(acc, tile + product, item.tile_start, 0), None

    items = _work_list(group_sizes, m, block, w.shape[0])
    out, _ = lax.scan(step, varying_like(jnp.zeros((m, n_out), jnp.float32), x, w, items), items)
    return out


def _grouped_outer(
    x: jax.Array, dy: jax.Array, group_sizes: jax.Array, block: int, groups: int, precision: Precision
) -> jax.Array:
    """``out[i] = x_iᵀ @ dy_i`` in float32, where ``x_i``, ``dy_i`` are group i's rows.

    Args:
        x: ``[m, k]``.
        dy: ``[m, n]``.
        group_sizes: ``[g]``.
        block: Rows per tile, ``1 <= block <= m``.
        groups: ``g``.
        precision: Of the products.

    Returns:
        ``[g, k, n]`` float32.
    """
    m, k = x.shape
    dtype = jnp.promote_types(x.dtype, dy.dtype)

    def step(acc: jax.Array, item: _WorkList) -> tuple[jax.Array, None]:
        mask = _row_mask(item, block)[:, None]
        x_tile = jnp.where(mask, lax.dynamic_slice_in_dim(x, item.tile_start, block), 0).astype(dtype)
        dy_tile = jnp.where(mask, lax.dynamic_slice_in_dim(dy, item.tile_start, block), 0).astype(dtype)
        update = lax.dot_general(
            x_tile, dy_tile, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        current = lax.dynamic_index_in_dim(acc, item.group, keepdims=False)
        return lax.dynamic_update_index_in_dim(acc, current + update, item.group, 0), None

    items = _work_list(group_sizes, m, block, groups)
    out, _ = lax.scan(step, varying_like(jnp.zeros((groups, k, dy.shape[1]), jnp.float32), x, dy, items), items)
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _grouped_matmul(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, block: int, precision: Precision, out_dtype: Any
) -> jax.Array:
    return _grouped_product(lhs, rhs, group_sizes, block, precision, transpose_w=False).astype(out_dtype)


def _grouped_matmul_fwd(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, block: int, precision: Precision, out_dtype: Any
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    return _grouped_matmul(lhs, rhs, group_sizes, block, precision, out_dtype), (lhs, rhs, group_sizes)


def _grouped_matmul_bwd(
    block: int, precision: Precision, out_dtype: Any, residuals: tuple[jax.Array, jax.Array, jax.Array],
    dout: jax.Array,
) -> tuple[jax.Array, jax.Array, None]:
    del out_dtype
    lhs, rhs, group_sizes = residuals
    d_lhs = _grouped_product(dout, rhs, group_sizes, block, precision, transpose_w=True).astype(lhs.dtype)
    d_rhs = _grouped_outer(lhs, dout, group_sizes, block, rhs.shape[0], precision).astype(rhs.dtype)
    # Under shard_map a replicated operand's cotangent is the sum over the axes it does not vary along.
    return cotangent_like(d_lhs, lhs), cotangent_like(d_rhs, rhs), None  # group_sizes is integer: no gradient


_grouped_matmul.defvjp(_grouped_matmul_fwd, _grouped_matmul_bwd)
_grouped_matmul_jit = jax.jit(_grouped_matmul, static_argnums=(3, 4, 5))  # one compiled program per call


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: Precision = ("highest", "highest"),
    preferred_element_type: Any = None,
    activation: str | None = None,
    cfg: GroupedMatmulConfig | None = None,
) -> jax.Array:
    """Row-grouped matmul: consecutive row groups of ``lhs``, group ``i`` times ``rhs[i]``.

    ``ejk.grouped_matmul`` always passes ``precision`` and ``preferred_element_type``
    resolved; the defaults here (ejk's defaults) serve direct calls.

    Args:
        lhs: ``[m, k]``.
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]`` integers, non-negative, ``sum <= m``; rows past the sum are
            zeros; empty groups are fine.
        precision: A pair of ``jax.lax.Precision`` names (lhs, rhs), or one for both; used by
            the forward and the backward products.
        preferred_element_type: The output dtype; ``None`` means ``lhs.dtype``.
        activation: ``None``, or ``"swiglu"`` (``ejk.grouped_matmul``'s gated output): applied to the
            float32 product in the same program, differentiated by JAX through it.
        cfg: The config; ``None`` means :func:`heuristic_config` for these shapes.

    Returns:
        ``[m, n]`` in ``preferred_element_type`` (float32 accumulation; ``[m, n / 2]`` with an
        activation). Differentiable in ``lhs`` and ``rhs`` (gradients in their dtypes);
        ``group_sizes`` gets no gradient.
    """
    cfg = heuristic_config(lhs, rhs, group_sizes) if cfg is None else cfg
    out_dtype = jnp.dtype(lhs.dtype if preferred_element_type is None else preferred_element_type)
    m = lhs.shape[0]
    groups, _, n = rhs.shape
    if m == 0 or n == 0 or groups == 0:
        return jnp.zeros((m, n if activation is None else n // 2), out_dtype)
    sizes, block = jnp.asarray(group_sizes, jnp.int32), min(cfg.block_m, m)
    if activation is None:
        out: jax.Array = _grouped_matmul_jit(lhs, rhs, sizes, block, precision, out_dtype)
        return out
    gated: jax.Array = _gated(lhs, rhs, sizes, block, precision, out_dtype, activation)
    return gated


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))  # the product and its activation: one program
def _gated(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, block: int, precision: Precision,
           out_dtype: Any, activation: str) -> jax.Array:
    z = _grouped_matmul(lhs, rhs, group_sizes, block, precision, jnp.dtype(jnp.float32))
    return gated_output(z, activation).astype(out_dtype)


def _next_power_of_two(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def config_space(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> list[GroupedMatmulConfig]:
    """Autotuning candidates: row-tile sizes from 8 up to the first power of two ``>= m``.

    Args:
        lhs: ``[m, k]`` (anything with ``.shape`` and ``.dtype``).
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]``.

    Returns:
        At most seven configs.
    """
    del rhs, group_sizes
    limit = max(_BLOCK_CHOICES[0], _next_power_of_two(lhs.shape[0]))
    return [GroupedMatmulConfig(block_m=b) for b in _BLOCK_CHOICES if b <= limit]


def heuristic_config(lhs: Any, rhs: Any, group_sizes: Any, **_: Any) -> GroupedMatmulConfig:
    """A tile about the size of an average group (8 to 256 rows, at most ``m`` rounded up).

    Tiles near the average group size keep the work list near ``2 g`` items while the
    wasted work where tiles straddle groups stays about as large as the useful work.

    Args:
        lhs: ``[m, k]`` (anything with ``.shape`` and ``.dtype``).
        rhs: ``[g, k, n]``.
        group_sizes: ``[g]``.

    Returns:
        The config.
    """
    del group_sizes
    m, groups = lhs.shape[0], max(rhs.shape[0], 1)
    block = int(np.clip(_next_power_of_two(-(-m // groups)), 8, 256))
    return GroupedMatmulConfig(block_m=min(block, _next_power_of_two(max(m, 1))))
