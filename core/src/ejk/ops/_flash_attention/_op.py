"""``ejk.flash_attention``: fused softmax attention, forward and backward, GQA/MQA."""

from __future__ import annotations

from typing import Any

import jax

from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._flash_attention._check import check_flash_attention_args
from ejk.ops._flash_attention._residuals import FLASH_RESIDUALS

__all__ = ["DEFINITION", "KERNEL", "FlashAttentionKernel", "flash_attention", "flash_attention_call"]


class FlashAttentionKernel(OpKernel):
    """Dispatches ``flash_attention`` to the registered implementations."""

    op_id = "flash_attention"
    version = "1"
    array_names = ("q", "k", "v", "q_segment_ids", "kv_segment_ids", "bias")
    positional = 3

    def normalize(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return flash_attention_call(*args, **kwargs)


KERNEL = FlashAttentionKernel()


@eager_fast_path(KERNEL, get_default_executor)  # validation reads shapes, dtypes, statics only
def flash_attention(
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
) -> jax.Array:
    """Softmax attention ``softmax(scale · q kᵀ [soft cap] + bias, masked) v`` without materialising it.

    Layout ``[batch, seq, heads, head_dim]`` as in ``jax.nn.dot_product_attention``.

    Args:
        q: ``[B, Sq, Hq, D]``.
        k: ``[B, Sk, Hkv, D]``; ``Hq`` must be a multiple of ``Hkv`` (q head h uses kv head
            ``h // (Hq // Hkv)``).
        v: ``[B, Sk, Hkv, Dv]``.
        causal: Key j is visible to query i iff ``j <= i + Sk - Sq`` (bottom-right aligned).
            For ``Sq != Sk`` this differs from ``jax.nn.dot_product_attention(is_causal=True)``,
            which aligns top-left (key j visible iff ``j <= i``); the two agree when ``Sq == Sk``.
        softmax_scale: Logit scale: ``None`` (``1/sqrt(D)``) or a finite number > 0, as for every op.
        sliding_window: ``(left, right)`` or ``w`` for ``(w, w)``: key j visible iff
            ``-left <= j - (i + Sk - Sq) <= right``. With ``causal=True`` the right side is
            dropped (``(3, 7)`` means ``(3, 0)``). Any size is allowed: a side longer than the
            sequences means the whole sequence.
        logits_soft_cap: Applies ``cap * tanh(logits / cap)`` before the bias.
        q_segment_ids: ``[B, Sq]`` int; with ``kv_segment_ids`` ``[B, Sk]``: attend only
            within equal ids.
        bias: Broadcastable to ``[B, Hq, Sq, Sk]``, added to the logits after the soft cap.
        platform: ``"auto"`` (the chooser picks among every available implementation) or a
            platform name to force, e.g. ``"xla"``.
        cfg: Explicit config (an :class:`~ejk.ops.ImplChoice` or an implementation's own
            config); it always wins and is never persisted as tuned.

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q.dtype``. Query rows that see no key are zeros.
    """
    arrays, static = flash_attention_call(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
    )
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


def flash_attention_call(
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
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Validate ``flash_attention``'s arguments; return the kernel's (arrays, static kwargs)."""
    op = "flash_attention"
    q, k, v = as_array(op, "q", q), as_array(op, "k", k), as_array(op, "v", v)
    q_segment_ids, kv_segment_ids, bias = (None if x is None else as_array(op, name, x) for name, x in (
        ("q_segment_ids", q_segment_ids), ("kv_segment_ids", kv_segment_ids), ("bias", bias)))
    scale, window = check_flash_attention_args(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
    )
    static = {
        "causal": bool(causal),
        "softmax_scale": float(scale),
        "sliding_window": window,
        "logits_soft_cap": None if logits_soft_cap is None else float(logits_soft_cap),
    }
    return (q, k, v, q_segment_ids, kv_segment_ids, bias), static


_HERE = __package__

DEFINITION = define_op(
    KERNEL, flash_attention,
    reference=f"{_HERE}._reference:reference_flash_attention",
    check=f"{_HERE}._conformance:check_flash_attention",
    shard_rule=f"{_HERE}._shard:attention_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    residuals=(FLASH_RESIDUALS,),
)
