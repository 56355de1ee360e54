"""Per op: which sharded dims a call splits, and how the shards combine.

- ``flash_attention`` / ``flash_attention_lse``: batch and heads (kv heads with them when they
  divide, else a single kv head stays whole); no communication. The sequence is never split
  (that is :func:`ejk.ring_attention`'s job inside ``shard_map``): it is gathered first.
- ``matmul``: batch dims (of ``a`` and ``b`` alike; a broadcast size-1 dim stays whole), rows
  of ``a`` and columns of ``b``: no communication; the contraction ``k``: float32 partial
  products summed with ``psum`` (an all-reduce of the output), cast once — each device does
  ``1/d`` of the products instead of gathering ``k`` and repeating them all.
- ``grouped_matmul``: experts, columns, rows and contraction (:mod:`ejk.ops._shard_grouped`).
- ``ragged_paged_attention``: query heads (kv heads with them) and query tokens. A token shard
  runs the sequences' rows it holds: their query ranges are clipped to its block and their
  context lengths shortened to the block's last row, so every row keeps its position (causal,
  windows) and sees the same keys; no communication. The page pool is never split (page
  tables index it globally).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._shard_grouped import grouped_rule
from ejk.ops._shard_plan import Axes, AxesOf, Call, ShardPlan, Size, divides, spec

__all__ = ["SHARD_RULES", "Rule"]

#: ``rule(arrays, axes_of, size) -> ShardPlan | (in_specs, out_specs) | None`` (``None``: the op
#: cannot be wrapped, call it as is).
Rule = Callable[[tuple[Any, ...], AxesOf, Size], "ShardPlan | tuple[tuple[Any, ...], Any] | None"]


def _heads(axes_of: AxesOf, size: Size, q: Any, q_dim: int, kv: Any, kv_dim: int) -> tuple[Axes, Axes]:
    """Axes splitting query heads and kv heads so that head ``h`` still uses kv head ``h // G``."""
    axes = axes_of(q, q_dim)
    parts = size(axes)
    if not axes or q.shape[q_dim] % parts:
        return (), ()
    if kv.shape[kv_dim] % parts == 0:
        return axes, axes
    return (axes, ()) if kv.shape[kv_dim] == 1 else ((), ())


def _attention(lse: bool) -> Rule:
    def rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
        q, k, v, q_seg, kv_seg, bias = arrays
        batch = divides(size, axes_of(q, 0), q.shape[0])
        heads, kv_heads = _heads(axes_of, size, q, 2, k, 2)
        if set(heads) & set(batch):
            heads, kv_heads = (), ()
        specs: list[Any] = [spec(batch, None, heads, None), spec(batch, None, kv_heads, None),
                            spec(batch, None, kv_heads, None), spec(batch, None), spec(batch, None)]
        bias_spec = None
        if bias is not None:
            bias_spec = spec(batch if bias.shape[0] > 1 else None, heads if bias.shape[1] > 1 else None, None, None)
        specs = [s if x is not None else None for s, x in zip(specs, (q, k, v, q_seg, kv_seg), strict=True)]
        out = spec(batch, None, heads, None)
        return ShardPlan((*specs, bias_spec), (out, spec(batch, heads, None)) if lse else out)

    return rule


def _matmul(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan | None:
    a, b = arrays
    if a.ndim < 2 or b.ndim < 2:
        return None  # a vector operand: run whole
    taken: set[str] = set()

    def free(axes: Axes) -> Axes:
        if set(axes) & taken:
            return ()
        taken.update(axes)
        return axes

    batch = max(a.ndim, b.ndim) - 2
    a_dims: list[Axes] = [()] * a.ndim
    b_dims: list[Axes] = [()] * b.ndim
    out: list[Axes] = []
    for j in range(batch):  # batch dims, aligned from the right; a size-1 dim broadcasts whole
        ia, ib = j - (batch - (a.ndim - 2)), j - (batch - (b.ndim - 2))
        extent = max(a.shape[ia] if ia >= 0 else 1, b.shape[ib] if ib >= 0 else 1)
        wide = [(x, i, dims) for x, i, dims in ((a, ia, a_dims), (b, ib, b_dims)) if i >= 0 and x.shape[i] == extent]
        axes = next((found for x, i, _ in wide if (found := divides(size, axes_of(x, i), extent))), ())
        axes = free(axes) if extent > 1 else ()
        for _, i, dims in wide:
            dims[i] = axes
        out.append(axes)
    a_dims[-2] = free(divides(size, axes_of(a, a.ndim - 2), a.shape[-2]))
    b_dims[-1] = free(divides(size, axes_of(b, b.ndim - 1), b.shape[-1]))
    k = b.shape[-2]
    contract = free(divides(size, axes_of(a, a.ndim - 1), k) or divides(size, axes_of(b, b.ndim - 2), k))
    a_dims[-1] = b_dims[-2] = contract
    return ShardPlan((spec(*a_dims), spec(*b_dims)), spec(*out, a_dims[-2], b_dims[-1]),
                     _contracted(contract) if contract else None)


def _contracted(contract: Axes) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        out_dtype = np.dtype(static["preferred_element_type"])
        extra = {} if out_dtype == np.float32 else {"preferred_element_type": np.dtype(np.float32)}

        def local(a: jax.Array, b: jax.Array) -> jax.Array:
            partial: jax.Array = call(a, b, **extra)
            total: jax.Array = jax.lax.psum(partial, contract)
            return total.astype(out_dtype)

        return local

    return body


def _paged(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    q, k_pages, *_ = arrays
    heads, kv_heads = _heads(axes_of, size, q, 1, k_pages, 2)
    tokens = divides(size, axes_of(q, 0), q.shape[0])
    if set(tokens) & set(heads):
        tokens = ()
    pages = spec(None, None, kv_heads, None)
    in_specs = (spec(tokens, heads, None), pages, pages, *[spec(*([None] * x.ndim)) for x in arrays[3:]])
    return ShardPlan(in_specs, spec(tokens, heads, None), _token_block(tokens) if tokens else None)


def _token_block(tokens: Axes) -> Any:
    def body(call: Call, static: Mapping[str, Any]) -> Any:
        def local(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, kv_lens: jax.Array,
                  page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
            rows = q.shape[0]
            first = jax.lax.axis_index(tokens) * rows
            cu = jnp.clip(cu_q_lens, first, first + rows)  # each sequence's rows inside this block
            q_lens = cu[1:] - cu[:-1]
            # A row's position is kv_len - (cu[s+1] - row): end the context at the block's last row.
            lens = jnp.clip(kv_lens - (cu_q_lens[1:] - cu[1:]), q_lens, kv_lens).astype(kv_lens.dtype)
            out: jax.Array = call(q, k_pages, v_pages, lens, page_indices, (cu - first).astype(cu_q_lens.dtype),
                                  num_seqs)
            return out

        return local

    return body


#: Per op: how a call splits. Third-party ops may add theirs (same signature).
SHARD_RULES: dict[str, Rule] = {
    "flash_attention": _attention(lse=False),
    "flash_attention_lse": _attention(lse=True),
    "matmul": _matmul,
    "grouped_matmul": grouped_rule,
    "ragged_paged_attention": _paged,
}
