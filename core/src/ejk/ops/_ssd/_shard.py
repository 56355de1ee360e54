"""``ssd`` per shard: batch rows and heads (groups of ``B`` / ``C`` with them when they divide, else a
single group stays whole), no communication; the tokens are gathered."""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import AxesOf, ShardPlan, Size, divides, head_axes, spec

__all__ = ["ssd_rule"]


def ssd_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    x, _, _, B, _, D, dt_bias, initial_state, cu_seqlens = arrays  # noqa: N806
    batch = () if cu_seqlens is not None else divides(size, axes_of(x, 0), x.shape[0])
    heads, groups = head_axes(axes_of, size, x, 2, B, 2)
    if set(heads) & set(batch):
        heads, groups = (), ()
    per_head = spec(heads)
    tokens = spec(batch, None, heads, None)
    state = spec(batch, heads, None, None)
    in_specs = (tokens, spec(batch, None, heads), per_head, spec(batch, None, groups, None),
                spec(batch, None, groups, None), None if D is None else per_head,
                None if dt_bias is None else per_head, None if initial_state is None else state,
                None if cu_seqlens is None else spec(None))
    return ShardPlan(in_specs, (tokens, state))
