"""``mla_paged_attention`` per shard: sequences (the batch) and query heads.

Every query head reads the one latent head, so heads split freely; a batch shard runs its
sequences with their rows of ``kv_lens`` and ``page_indices``. The page pool is never split (page
tables index it globally). No communication.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import AxesOf, ShardPlan, Size, divides, spec

__all__ = ["mla_rule"]


def mla_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    q = arrays[0]
    batch = divides(size, axes_of(q, 0), q.shape[0])
    heads = divides(size, axes_of(q, 2), q.shape[2])
    if set(batch) & set(heads):
        heads = ()
    out = spec(batch, None, heads, None)
    return ShardPlan((out, spec(None, None, None), spec(batch), spec(batch, None)), out)
