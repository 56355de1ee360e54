"""``ejk.flash_attention``: fused softmax attention, forward and backward, GQA/MQA."""

from __future__ import annotations

from typing import Any

import jax

from ejk._contract import Extension
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array, attention_precision
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._flash_attention._check import check_flash_attention_args
from ejk.ops._flash_attention._residuals import FLASH_RESIDUALS
from ejk.ops._matmul._op import DEFAULT_PRECISION

__all__ = ["ATTENTION_EXTENSIONS", "DEFINITION", "KERNEL", "FlashAttentionKernel", "flash_attention",
           "flash_attention_call"]

#: The ejk-core version that added ``sinks`` and ``precision`` to the attention ops.
SINKS_SINCE = "0.2.0"
#: The arguments the attention ops gained after their first implementations: an implementation whose
#: signature does not name one runs only calls where it has its legacy value (no sinks; ``"default"``
#: precision, i.e. bfloat16 / float16 inputs or float32 ones that ask for the backend's fast path).
ATTENTION_EXTENSIONS = (Extension("sinks", legacy=None, since=SINKS_SINCE),
                        Extension("precision", legacy="default", since=SINKS_SINCE))


class FlashAttentionKernel(OpKernel):
    """Dispatches ``flash_attention`` to the registered implementations."""

    op_id = "flash_attention"
    version = "1"
    array_names = ("q", "k", "v", "q_segment_ids", "kv_segment_ids", "bias", "sinks")
    positional = 3
    extensions = ATTENTION_EXTENSIONS

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
    sinks: jax.Array | None = None,
    precision: Any = DEFAULT_PRECISION,
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
        sinks: ``[Hq]`` attention-sink logits (any float dtype, computed in float32, differentiable):
            one extra logit per head that enters each row's softmax denominator only,
            ``out = Σ_j e^{s_j} v_j / (Σ_j e^{s_j} + e^{sinks[h]})`` over the row's visible logits
            ``s_j`` (after soft cap and bias; the sink is neither capped nor biased). A row that sees
            no key is still zeros.
        precision: Of the two products (``q kᵀ`` and ``p v``) for float32 inputs, as for
            :func:`ejk.matmul` and with its default: ``"highest"`` (full float32 products),
            ``"high"``, ``"default"`` (the backend's fast path, e.g. TF32 on NVIDIA GPUs), a
            ``jax.lax.Precision`` or ``None`` (``jax_default_matmul_precision``, else
            ``"default"``). bfloat16 / float16 products are exact with float32 accumulation, so
            for those inputs it is normalised to ``"default"``.
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
        sinks=sinks, precision=precision,
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
    sinks: jax.Array | None = None,
    precision: Any = DEFAULT_PRECISION,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Validate ``flash_attention``'s arguments; return the kernel's (arrays, static kwargs)."""
    op = "flash_attention"
    q, k, v = as_array(op, "q", q), as_array(op, "k", k), as_array(op, "v", v)
    q_segment_ids, kv_segment_ids, bias, sinks = (None if x is None else as_array(op, name, x) for name, x in (
        ("q_segment_ids", q_segment_ids), ("kv_segment_ids", kv_segment_ids), ("bias", bias), ("sinks", sinks)))
    scale, window = check_flash_attention_args(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
        sinks=sinks,
    )
    static = {
        "causal": bool(causal),
        "softmax_scale": float(scale),
        "sliding_window": window,
        "logits_soft_cap": None if logits_soft_cap is None else float(logits_soft_cap),
        "precision": attention_precision(op, precision, q.dtype),
    }
    return (q, k, v, q_segment_ids, kv_segment_ids, bias, sinks), static


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
