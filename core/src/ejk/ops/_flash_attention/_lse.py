"""``ejk.flash_attention_lse``: flash attention that also returns each row's log-sum-exp.

Attention split over key blocks (ring attention, split-K decoding) computes one partial result
per block and merges them by their log-sum-exps; this op gives the per-block pair through the
Executor, so the best implementation for the block's shape runs (and is tuned) like any op.
It is differentiable in both outputs: a cotangent on ``lse`` flows into ``q`` and ``k``.
"""

from __future__ import annotations

from typing import Any

import jax

from ejk.ops._base import ImplChoice, run_op
from ejk.ops._definition import define_op
from ejk.ops._flash_attention._op import FlashAttentionKernel, flash_attention_call
from ejk.ops._flash_attention._residuals import FLASH_LSE_RESIDUALS

__all__ = ["DEFINITION", "KERNEL", "FlashAttentionLseKernel", "flash_attention_lse"]


class FlashAttentionLseKernel(FlashAttentionKernel):
    """Dispatches ``flash_attention_lse``: ``flash_attention``'s arguments and checks, its own implementations."""

    op_id = "flash_attention_lse"
    version = "1"


KERNEL = FlashAttentionLseKernel()


def flash_attention_lse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    bias: jax.Array | None = None,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`ejk.flash_attention` plus the natural log-sum-exp of each row's final logits.

    Arguments and masks are those of :func:`ejk.flash_attention`.

    Returns:
        ``(out, lse)``: ``out`` ``[B, Sq, Hq, Dv]`` in ``q.dtype`` (rows that see no key are
        zeros) and ``lse`` ``[B, Hq, Sq]`` float32, ``log Σ_visible exp(logit)``, ``-inf`` for
        rows that see no key. Both are differentiable.
    """
    arrays, static = flash_attention_call(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
    )
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    KERNEL, flash_attention_lse,
    reference=f"{_HERE}._reference:reference_flash_attention_lse",
    shard_rule=f"{_HERE}._shard:attention_lse_rule",
    residuals=(FLASH_LSE_RESIDUALS,),
)
