"""``ejk.ragged_paged_attention``: serving-time attention over a paged KV cache."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array, attention_precision, scalar_count
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._flash_attention._check import check_sinks
from ejk.ops._flash_attention._op import ATTENTION_EXTENSIONS
from ejk.ops._matmul._op import DEFAULT_PRECISION
from ejk.ops._ragged_paged_attention._check import (
    check_ragged_paged_attention_args,
    check_ragged_paged_attention_values,
)

__all__ = ["DEFINITION", "KERNEL", "RaggedPagedAttentionKernel", "ragged_paged_attention"]


class RaggedPagedAttentionKernel(OpKernel):
    """Dispatches ``ragged_paged_attention``; tunes on realistic lengths and page tables."""

    op_id = "ragged_paged_attention"
    version = "1"
    array_names = ("q", "k_pages", "v_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs", "sinks")
    positional = 7
    extensions = ATTENTION_EXTENSIONS

    def normalize(self, q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any,
                  num_seqs: Any, *, softmax_scale: float | None = None,
                  sliding_window: int | tuple[int, int] | None = None,
                  logits_soft_cap: float | None = None, sinks: Any = None,
                  precision: Any = DEFAULT_PRECISION) -> tuple[tuple[Any, ...], dict[str, Any]]:
        op = self.op_id
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens = (
            as_array(op, name, x) for name, x in zip(self.array_names, (q, k_pages, v_pages, kv_lens, page_indices,
                                                                         cu_q_lens), strict=False)
        )
        if not isinstance(num_seqs, jax.ShapeDtypeStruct):
            num_seqs = scalar_count(op, "num_seqs", num_seqs)
        scale, window = check_ragged_paged_attention_args(
            q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
            softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        )
        sinks = None if sinks is None else as_array(op, "sinks", sinks)
        check_sinks(op, sinks, int(q.shape[1]))
        static = {
            "softmax_scale": float(scale),
            "sliding_window": window,
            "logits_soft_cap": None if logits_soft_cap is None else float(logits_soft_cap),
            "precision": attention_precision(op, precision, q.dtype),
        }
        return (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sinks), static

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sinks = super().tuning_args(inv, seed)
        rng = np.random.default_rng(seed)
        tokens, (num_pages, page_size) = q.shape[0], k_pages.shape[:2]
        seqs, pages_per_seq = page_indices.shape
        capacity = pages_per_seq * page_size
        # Spread the tokens over the sequences, and give each a long, ragged context.
        q_lens = np.full(seqs, tokens // max(seqs, 1), dtype=np.int64)
        q_lens[: tokens - int(q_lens.sum())] += 1
        lens = np.maximum(q_lens, rng.integers(capacity // 2, capacity + 1, size=seqs))
        lens = np.minimum(lens, capacity)
        table = rng.permutation(max(num_pages, seqs * pages_per_seq))[: seqs * pages_per_seq] % max(num_pages, 1)
        cu = np.concatenate([[0], np.cumsum(q_lens)])
        jnp = jax.numpy
        return (q, k_pages, v_pages, jnp.asarray(lens, kv_lens.dtype),
                jnp.asarray(table.reshape(seqs, pages_per_seq), page_indices.dtype),
                jnp.asarray(cu, cu_q_lens.dtype), jnp.asarray(seqs, num_seqs.dtype), sinks)


KERNEL = RaggedPagedAttentionKernel()


@eager_fast_path(KERNEL, get_default_executor, values=check_ragged_paged_attention_values)
def ragged_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array | int,
    *,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    precision: Any = DEFAULT_PRECISION,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Attention of ragged query chunks over a paged KV cache (decode and chunked prefill).

    Args:
        q: ``[T, Hq, D]`` query tokens of all sequences, concatenated.
        k_pages: ``[P, page, Hkv, D]``.
        v_pages: ``[P, page, Hkv, Dv]``.
        kv_lens: ``[S]`` int32: context length of each sequence.
        page_indices: ``[S, pages_per_seq]`` int32: the pages of each sequence, in order.
        cu_q_lens: ``[S+1]`` int32: sequence s owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``,
            the last positions of its context (causal, bottom-right aligned).
        num_seqs: How many leading sequences are live; the rest are ignored.
        softmax_scale: Default ``1/sqrt(D)``.
        sliding_window: ``(left, right)`` or ``w``; attention is causal, so right is 0.
        logits_soft_cap: ``cap * tanh(logits / cap)``.
        sinks: ``[Hq]`` attention-sink logits, as for :func:`ejk.flash_attention`: ``e^{sinks[h]}``
            joins each row's softmax denominator once (rows that see no key stay zeros).
        precision: Of the float32 products, as for :func:`ejk.flash_attention` (default ``"highest"``).
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows owned by no live sequence are zeros. NaN in a
        row's query or in a key or value it sees propagates to that row.
    """
    arrays, static = KERNEL.normalize(
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
        softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        sinks=sinks, precision=precision,
    )
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    KERNEL, ragged_paged_attention,
    reference=f"{_HERE}._reference:reference_ragged_paged_attention",
    check=f"{_HERE}._conformance:check_ragged_paged_attention",
    shard_rule=f"{_HERE}._shard:paged_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    output=f"{_HERE}._reference:reference_output",
)
