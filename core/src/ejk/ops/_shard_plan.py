"""What a shard rule returns: the ``shard_map`` specs of a call and, optionally, its per-shard body.

A rule (an op definition's ``shard_rule``, see :mod:`ejk.ops._sharded`) looks at how a call's arrays are sharded and
answers with a :class:`ShardPlan`: ``in_specs`` / ``out_specs`` for ``jax.shard_map`` and, where
a shard cannot simply run the op on its blocks (expert-parallel grouped matmul, a split
contraction, token-split paged attention), a ``body`` that adapts the call and combines the
partial results with collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from jax.sharding import PartitionSpec as P

__all__ = ["AxesOf", "Axes", "Body", "Call", "Rule", "ShardPlan", "Size", "divides", "head_axes", "spec"]

Axes = tuple[str, ...]
#: ``axes_of(x, dim)``: the splittable mesh axes one dim of an input is sharded over (``()``: unsplit).
AxesOf = Callable[[Any, int], Axes]
#: ``size(axes)``: how many shards those mesh axes make.
Size = Callable[[Axes], int]
#: The per-shard call of the op: ``call(*arrays, **static_overrides)`` (overrides replace the
#: op's static arguments, e.g. ``preferred_element_type=float32`` for partial sums).
Call = Callable[..., Any]
#: ``body(call, static) -> local``: the function ``shard_map`` runs on each shard's blocks (the
#: same arguments as ``call``); ``static`` is the op's static arguments.
Body = Callable[[Call, Mapping[str, Any]], Callable[..., Any]]


@attrs.frozen
class ShardPlan:
    """How one call runs per shard.

    Attributes:
        in_specs: One ``PartitionSpec`` per array argument (``None`` for absent arrays).
        out_specs: The output's spec (a tuple of them for several outputs).
        body: Adapts the call per shard (``None``: run the op on the blocks as they are).
    """

    in_specs: tuple[Any, ...]
    out_specs: Any
    body: Body | None = None


#: ``rule(arrays, axes_of, size) -> ShardPlan | (in_specs, out_specs) | None`` (``None``: the op
#: cannot be wrapped, call it as is). A rule whose specs depend on the op's static arguments takes
#: them as a ``static`` keyword (a mapping): ``rule(arrays, axes_of, size, static=...)``.
Rule = Callable[[tuple[Any, ...], AxesOf, Size], "ShardPlan | tuple[tuple[Any, ...], Any] | None"]


def spec(*dims: Axes | None) -> P:
    """A ``PartitionSpec`` from per-dim axes (``()`` / ``None``: unsplit)."""
    return P(*[None if not d else (d[0] if len(d) == 1 else d) for d in dims])


def divides(size: Size, axes: Axes, *extents: int) -> Axes:
    """``axes`` when they split every extent evenly (and some extent is nonzero), else ``()``."""
    if not axes or not any(extents):
        return ()
    return axes if all(e % size(axes) == 0 for e in extents) else ()


def head_axes(axes_of: AxesOf, size: Size, q: Any, q_dim: int, kv: Any, kv_dim: int) -> tuple[Axes, Axes]:
    """Axes splitting query heads and kv heads so that head ``h`` still uses kv head ``h // G``."""
    axes = axes_of(q, q_dim)
    parts = size(axes)
    if not axes or q.shape[q_dim] % parts:
        return (), ()
    if kv.shape[kv_dim] % parts == 0:
        return axes, axes
    return (axes, ()) if kv.shape[kv_dim] == 1 else ((), ())
