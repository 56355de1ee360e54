"""``flash_attention`` / ``flash_attention_lse`` per shard: batch and heads, no communication.

Kv heads split with the query heads when they divide, else a single kv head stays whole. The
sequence is never split (that is :func:`ejk.ring_attention`'s job inside ``shard_map``): it is
gathered first.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import AxesOf, Rule, ShardPlan, Size, divides, head_axes, spec

__all__ = ["attention_lse_rule", "attention_rule"]


def _attention(lse: bool) -> Rule:
    def rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
        q, k, v, q_seg, kv_seg, bias, *rest = arrays
        sinks = rest[0] if rest else None
        batch = divides(size, axes_of(q, 0), q.shape[0])
        heads, kv_heads = head_axes(axes_of, size, q, 2, k, 2)
        if set(heads) & set(batch):
            heads, kv_heads = (), ()
        specs: list[Any] = [spec(batch, None, heads, None), spec(batch, None, kv_heads, None),
                            spec(batch, None, kv_heads, None), spec(batch, None), spec(batch, None)]
        bias_spec = None
        if bias is not None:
            bias_spec = spec(batch if bias.shape[0] > 1 else None, heads if bias.shape[1] > 1 else None, None, None)
        specs = [s if x is not None else None for s, x in zip(specs, (q, k, v, q_seg, kv_seg), strict=True)]
        out = spec(batch, None, heads, None)
        sinks_spec = [None if sinks is None else spec(heads)] if rest else []  # one sink per query head
        return ShardPlan((*specs, bias_spec, *sinks_spec), (out, spec(batch, heads, None)) if lse else out)

    return rule


attention_rule = _attention(lse=False)
attention_lse_rule = _attention(lse=True)
