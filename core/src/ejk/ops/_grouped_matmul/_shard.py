"""``grouped_matmul`` per shard: experts, columns, rows and the contraction.

``lhs [m, k]`` rows are sorted by group, ``rhs [g, k, n]`` holds one matrix per group (expert),
``group_sizes [g]`` says how many consecutive rows each group owns. Each sharded dim splits a
different way (any combination, over distinct mesh axes):

- **columns** (``rhs`` dim 2): every shard computes its columns; no communication.
- **experts** (``rhs`` dim 0, expert parallelism): a shard holds ``g / d`` consecutive experts
  and computes only their rows. From ``group_sizes`` (replicated, a runtime value) it finds where
  its groups' rows start, rolls ``lhs`` so that they come first, runs the op on its experts and
  rolls the result back: rows of other shards' groups are zeros in its partial output. The
  partials have disjoint rows, so summing them is exact in any dtype:

  * ``lhs`` replicated over the expert axes: ``psum`` (an all-reduce of ``[m, n]``); the output
    is replicated like ``lhs``;
  * ``lhs`` rows sharded over the same axes as the experts: ``lhs`` is all-gathered inside the
    shard, and the partials are combined by ``psum_scatter`` (a reduce-scatter: half the traffic
    of an all-reduce), so the output stays row-sharded like ``lhs``.

  Gathering ``rhs`` instead would move ``g·k·n`` weights and repeat every expert's product on
  every device; splitting by experts divides the products by ``d``.
- **rows** (``lhs`` dim 0 over other axes, ``rhs`` replicated there): each shard's local group
  sizes are the groups' row ranges clipped to its block (groups are consecutive, so a block's
  grouped rows are a prefix of it and any boundary works); no communication in the forward pass.
- **contraction** (``k``): float32 partial products summed with ``psum``, then cast once.

With an activation (``"swiglu"``) the columns are not split (a shard's block of ``rhs``'s ``2n``
columns would hold gate columns without their up columns): they are gathered. Experts and rows
split as above (a row in no group of the shard is zero, and so is its activation); a split
contraction sums the plain float32 products first and applies the activation to the sum.

Experts not divisible by the shard count cannot be laid out by JAX at all (it refuses uneven
shardings); an axis the rule cannot use is dropped and that dim is gathered first (the plain path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._grouped_matmul._activation import gated_output
from ejk.ops._shard_plan import Axes, AxesOf, Call, ShardPlan, Size, divides, spec

__all__ = ["grouped_rule", "local_group_sizes"]


def local_group_sizes(group_sizes: jax.Array, rows: int, first_row: Any, first_group: Any,
                      groups: int) -> tuple[jax.Array, jax.Array]:
    """Sizes of groups ``first_group .. first_group + groups`` within rows ``[first_row, first_row + rows)``.

    Returns:
        ``(sizes [groups], offset)``: each group's rows inside the block and the block row where
        the first of them starts (their rows are consecutive from there).
    """
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    starts = ends - group_sizes.astype(jnp.int32)
    if groups != group_sizes.shape[0]:
        starts = jax.lax.dynamic_slice_in_dim(starts, first_group, groups)
        ends = jax.lax.dynamic_slice_in_dim(ends, first_group, groups)
    lo = jnp.clip(starts - first_row, 0, rows)
    hi = jnp.clip(ends - first_row, 0, rows)
    offset = lo[0] if groups else jnp.zeros((), jnp.int32)
    return (hi - lo).astype(group_sizes.dtype), offset


def grouped_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size, *,
                 static: Mapping[str, Any] | None = None) -> ShardPlan:
    lhs, rhs, _ = arrays
    (m, k), (g, _, n) = lhs.shape, rhs.shape
    gated = (static or {}).get("activation") is not None
    taken: set[str] = set()

    def pick(axes: Axes) -> Axes:
        if set(axes) & taken:
            return ()
        taken.update(axes)
        return axes

    cols = () if gated else pick(divides(size, axes_of(rhs, 2), n))
    experts = pick(divides(size, axes_of(rhs, 0), g))
    row_axes = divides(size, axes_of(lhs, 0), m)
    scatter = bool(experts) and row_axes == experts
    rows = experts if scatter else pick(row_axes)
    contract = pick(divides(size, axes_of(lhs, 1), k) or divides(size, axes_of(rhs, 1), k))
    in_specs = (spec(rows, contract), spec(experts, contract, cols), spec(None))
    out = spec(rows, cols)
    if not (experts or rows or contract):
        return ShardPlan(in_specs, out)
    return ShardPlan(in_specs, out, _body(experts, () if scatter else rows, contract, scatter))


def _body(experts: Axes, rows: Axes, contract: Axes, scatter: bool) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        out_dtype = np.dtype(static["preferred_element_type"])
        activation = static.get("activation") if contract else None  # applied after the sum
        partial = bool(contract) and (out_dtype != np.float32 or activation is not None)  # float32 partials
        overrides: dict[str, Any] = {"preferred_element_type": np.dtype(np.float32)} if partial else {}
        if activation is not None:
            overrides["activation"] = None

        def local(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
            if scatter:
                lhs = jax.lax.all_gather(lhs, experts, axis=0, tiled=True)
            m, g = lhs.shape[0], rhs.shape[0]
            first_row = jax.lax.axis_index(rows) * m if rows else 0
            first_group = jax.lax.axis_index(experts) * g if experts else 0
            sizes, offset = local_group_sizes(group_sizes, m, first_row, first_group, g)
            if experts:  # this shard's groups first; the rows past them come out zero
                lhs = jnp.roll(lhs, -offset, axis=0)
            out: jax.Array = call(lhs, rhs, sizes, **overrides)
            if experts:
                out = jnp.roll(out, offset, axis=0)
            if scatter:
                out = jax.lax.psum(out, contract) if contract else out
                out = jax.lax.psum_scatter(out, experts, scatter_dimension=0, tiled=True)
            elif experts or contract:
                out = jax.lax.psum(out, contract + experts)
            return gated_output(out, activation).astype(out_dtype)

        return local

    return body
