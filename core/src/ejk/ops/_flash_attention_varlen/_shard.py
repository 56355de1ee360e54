"""``flash_attention_varlen`` per shard: query heads (kv heads with them when they divide), no communication.

The packed token axis is never split (a sequence may straddle any cut): it is gathered first.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import AxesOf, ShardPlan, Size, head_axes, spec

__all__ = ["varlen_rule"]


def varlen_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    q, k, *_, sinks = arrays
    heads, kv_heads = head_axes(axes_of, size, q, 1, k, 1)
    specs = (spec(None, heads, None), spec(None, kv_heads, None), spec(None, kv_heads, None), spec(None),
             spec(None), None if sinks is None else spec(heads))
    return ShardPlan(specs, spec(None, heads, None))
