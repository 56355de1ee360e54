"""``gated_delta_rule`` per shard: batch rows and heads, no communication.

Every head and every batch row runs its own recurrence, so a shard of either computes its
outputs and final states alone. With ``cu_seqlens`` (batch 1) only heads split; the time axis is
never split (the recurrence runs through it): a sharded ``T`` is gathered first.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import Axes, AxesOf, ShardPlan, Size, divides, spec

__all__ = ["gated_delta_rule_rule"]


def gated_delta_rule_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan | None:
    q, *_, initial_state, cu_seqlens = arrays
    batch, _, heads, _ = q.shape
    rows: Axes = () if cu_seqlens is not None else divides(size, axes_of(q, 0), batch)
    cols: Axes = divides(size, axes_of(q, 2), heads)
    if set(rows) & set(cols):
        cols = ()
    if not rows and not cols:
        return None
    x4 = spec(rows, (), cols, ())
    x3 = spec(rows, (), cols)
    state = spec(rows, cols, (), ())
    return ShardPlan((x4, x4, x4, x3, x3, None if initial_state is None else state,
                      None if cu_seqlens is None else spec(())), (x4, state))
