"""``gla`` per shard: batch rows and heads, no communication (the recurrence runs along the tokens,
which are gathered; so are packed sequences' offsets)."""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import AxesOf, ShardPlan, Size, divides, spec

__all__ = ["gla_rule"]


def gla_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    q, _, _, _, initial_state, cu_seqlens = arrays
    batch = () if cu_seqlens is not None else divides(size, axes_of(q, 0), q.shape[0])
    heads = divides(size, axes_of(q, 2), q.shape[2])
    if set(heads) & set(batch):
        heads = ()
    tokens = spec(batch, None, heads, None)
    state = spec(batch, heads, None, None)
    return ShardPlan((tokens, tokens, tokens, tokens, None if initial_state is None else state,
                      None if cu_seqlens is None else spec(None)), (tokens, state))
