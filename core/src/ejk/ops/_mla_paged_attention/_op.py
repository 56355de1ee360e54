"""``ejk.mla_paged_attention``: decode attention over a paged cache of one shared latent head (MLA)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._mla_paged_attention._check import check_mla_paged_attention_args, check_mla_paged_attention_values

__all__ = ["DEFINITION", "KERNEL", "MlaPagedAttentionKernel", "mla_paged_attention"]


class MlaPagedAttentionKernel(OpKernel):
    """Dispatches ``mla_paged_attention``; tunes on long, ragged contexts over scattered pages."""

    op_id = "mla_paged_attention"
    version = "1"
    array_names = ("q", "kv_pages", "kv_lens", "page_indices")
    positional = 4

    def normalize(self, q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, *, v_head_dim: Any,
                  softmax_scale: float | None = None,
                  causal: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
        op = self.op_id
        q, kv_pages, kv_lens, page_indices = (
            as_array(op, name, x) for name, x in zip(self.array_names, (q, kv_pages, kv_lens, page_indices),
                                                     strict=True)
        )
        dv, scale, causal = check_mla_paged_attention_args(
            q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim, softmax_scale=softmax_scale, causal=causal,
        )
        return (q, kv_pages, kv_lens, page_indices), {"v_head_dim": dv, "softmax_scale": scale, "causal": causal}

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        q, kv_pages, kv_lens, page_indices = super().tuning_args(inv, seed)
        rng = np.random.default_rng(seed)
        num_pages, page = kv_pages.shape[:2]
        batch, pages_per_seq = page_indices.shape
        capacity = pages_per_seq * page
        lens = rng.integers(capacity // 2, capacity + 1, size=batch)  # long, ragged contexts
        table = rng.permutation(max(num_pages, batch * pages_per_seq))[: batch * pages_per_seq] % max(num_pages, 1)
        jnp = jax.numpy
        return (q, kv_pages, jnp.asarray(lens, kv_lens.dtype),
                jnp.asarray(table.reshape(batch, pages_per_seq), page_indices.dtype))


KERNEL = MlaPagedAttentionKernel()


@eager_fast_path(KERNEL, get_default_executor, values=check_mla_paged_attention_values)
def mla_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    *,
    v_head_dim: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Multi-head latent attention (DeepSeek's MLA, weights absorbed) over a paged latent cache.

    Every query head attends to one shared latent head: a position's ``Dk`` dims are its key
    (e.g. 576 = 512 latent + 64 rotary in DeepSeek-V3) and its first ``v_head_dim`` dims its
    value. For decode (``Sq = 1``) and multi-token prediction (``Sq`` of 2 to 4).

    Args:
        q: ``[B, Sq, Hq, Dk]``: the absorbed queries of each sequence's last ``Sq`` positions.
        kv_pages: ``[P, page, Dk]``: the latent cache, one head per position.
        kv_lens: ``[B]`` int32: context length of each sequence (its new positions included).
        page_indices: ``[B, pages_per_seq]`` int32: the pages of each sequence, in order; only the
            first ``ceil(kv_len / page)`` of a row are read.
        v_head_dim: Value dims, at most ``Dk`` (512 in DeepSeek-V3).
        softmax_scale: Default ``1/sqrt(Dk)``; DeepSeek models pass their own
            (``1/sqrt(192)``, times the YaRN factor where they use one).
        causal: Query ``i`` sees keys ``j <= kv_len - Sq + i`` (bottom-right aligned); ``False``:
            every query sees the whole context.
        platform: ``"auto"`` or a platform name to force.
        cfg: Explicit config; always wins.

    Returns:
        ``[B, Sq, Hq, v_head_dim]`` in ``q.dtype``. A query that sees no key (``kv_len = 0``, or
        ``kv_len < Sq`` for the first queries under ``causal``) gives zeros. NaN in a query
        propagates to its row, NaN in a cached position a row sees to that row (and may reach the
        sequence's other rows: its value is multiplied by their zero weight); NaN in positions past a
        sequence's context never does.
    """
    arrays, static = KERNEL.normalize(q, kv_pages, kv_lens, page_indices, v_head_dim=v_head_dim,
                                      softmax_scale=softmax_scale, causal=causal)
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    KERNEL, mla_paged_attention,
    reference=f"{_HERE}._reference:reference_mla_paged_attention",
    check=f"{_HERE}._conformance:check_mla_paged_attention",
    shard_rule=f"{_HERE}._shard:mla_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    output=f"{_HERE}._reference:reference_output",
)
