"""``ragged_paged_attention`` per shard: query heads (kv heads with them) and query tokens.

A token shard runs the sequences' rows it holds: their query ranges are clipped to its block and
their context lengths shortened to the block's last row, so every row keeps its position (causal,
windows) and sees the same keys; no communication. The page pool is never split (page tables
index it globally).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ejk.ops._shard_plan import Axes, AxesOf, Call, ShardPlan, Size, divides, head_axes, spec

__all__ = ["paged_rule"]


def paged_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    q, k_pages, *_ = arrays
    heads, kv_heads = head_axes(axes_of, size, q, 1, k_pages, 2)
    tokens = divides(size, axes_of(q, 0), q.shape[0])
    if set(tokens) & set(heads):
        tokens = ()
    pages = spec(None, None, kv_heads, None)
    sinks = arrays[7] if len(arrays) > 7 else None
    in_specs = (spec(tokens, heads, None), pages, pages, *[spec(*([None] * x.ndim)) for x in arrays[3:7]],
                *([] if len(arrays) <= 7 else [None if sinks is None else spec(heads)]))
    return ShardPlan(in_specs, spec(tokens, heads, None), _token_block(tokens) if tokens else None)


def _token_block(tokens: Axes) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        def local(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array,
                  page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, *rest: Any) -> jax.Array:
            rows = q.shape[0]
            first = jax.lax.axis_index(tokens) * rows
            cu = jnp.clip(cu_q_lens, first, first + rows)  # each sequence's rows inside this block
            q_lens = cu[1:] - cu[:-1]
            # A row's position is kv_len - (cu[s+1] - row): end the context at the block's last row.
            lens = jnp.clip(kv_lens - (cu_q_lens[1:] - cu[1:]), q_lens, kv_lens).astype(kv_lens.dtype)
            out: jax.Array = call(q, k_pages, v_pages, lens, page_indices, (cu - first).astype(cu_q_lens.dtype),
                                  num_seqs, *rest)
            return out

        return local

    return body
