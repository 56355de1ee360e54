"""The work list of the grouped matmul kernels, computed on the device from ``group_sizes``.

Rows are cut into aligned tiles of ``block_m`` rows. A *work item* is one (group, row tile) pair
whose rows intersect: a tile that straddles a group boundary is visited once per group (each
visit keeps only its group's rows), and items are ordered by group, so by row tile too. Empty
groups get no item (``visit_empty=False``: they cost nothing) or one item with no row
(``visit_empty=True``, for the ``d rhs`` kernel, which must write their zero gradient). With
``zero_group``, the rows past ``sum(group_sizes)`` form a last pseudo-group ``g`` whose items
write zeros. The list has a static length (an upper bound); items past ``count`` repeat the last
real one, so a grid over the bound revisits the same blocks and issues no new copy.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ejk.plugin import cdiv

__all__ = ["Work", "offsets", "work_list"]


class Work(NamedTuple):
    """``group[w]``, ``tile[w]`` (int32 ``[W]``), row ``offsets`` ``[g + 2]`` and the real ``items`` ``[1]``."""

    group: jax.Array
    tile: jax.Array
    offsets: jax.Array
    items: jax.Array


def offsets(group_sizes: jax.Array, m: int) -> jax.Array:
    """``[g + 2]`` int32: group ``i`` owns rows ``offsets[i]:offsets[i + 1]``; the last entry is ``m``.

    Negative sizes count as 0 and rows past ``m`` are dropped, so any input is well defined.
    """
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)
    zero = jnp.zeros((1,), jnp.int32)
    return jnp.concatenate([zero, ends, jnp.full((1,), m, jnp.int32)])


def bound(m: int, groups: int, block_m: int, zero_group: bool) -> int:
    """The static length of the work list."""
    return cdiv(m, block_m) + groups + int(zero_group)


def work_list(group_sizes: jax.Array, m: int, block_m: int, *, zero_group: bool, visit_empty: bool) -> Work:
    """The work list for ``m`` rows in tiles of ``block_m`` (see the module docstring)."""
    groups = group_sizes.shape[0]
    offs = offsets(group_sizes, m)
    n = groups + int(zero_group)
    tiles = max(cdiv(m, block_m), 1)
    starts, stops = offs[:n], offs[1:n + 1]
    first = jnp.minimum(starts // block_m, tiles - 1)
    last = (stops - 1) // block_m
    nonempty = stops > starts
    per_group = jnp.where(nonempty, last - first + 1, 1 if visit_empty else 0).astype(jnp.int32)
    ends = jnp.cumsum(per_group)
    count = ends[-1] if n else jnp.int32(0)
    w = jnp.arange(bound(m, groups, block_m, zero_group), dtype=jnp.int32)
    w = jnp.minimum(w, jnp.maximum(count - 1, 0))  # items past the count repeat the last one
    group = jnp.clip(jnp.searchsorted(ends, w, side="right"), 0, max(n - 1, 0)).astype(jnp.int32)
    local = w - (ends[group] - per_group[group])
    tile = jnp.clip(first[group] + local, 0, tiles - 1).astype(jnp.int32)
    return Work(group, tile, offs, jnp.reshape(count, (1,)).astype(jnp.int32))
