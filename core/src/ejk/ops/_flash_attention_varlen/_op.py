"""``ejk.flash_attention_varlen``: attention over packed variable-length sequences."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, run_op
from ejk.ops._check_common import as_array
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._flash_attention_varlen._check import (
    check_flash_attention_varlen_args,
    check_flash_attention_varlen_values,
)
from ejk.ops._flash_attention_varlen._ranges import sanitize_offsets

__all__ = ["DEFINITION", "KERNEL", "FlashAttentionVarlenKernel", "flash_attention_varlen",
           "flash_attention_varlen_call"]


class FlashAttentionVarlenKernel(OpKernel):
    """Dispatches ``flash_attention_varlen`` to the registered implementations."""

    op_id = "flash_attention_varlen"
    version = "1"
    array_names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "sinks")
    positional = 5

    def normalize(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return flash_attention_varlen_call(*args, **kwargs)

    def tuning_args(self, inv: Invocation[ImplChoice], seed: int = 0) -> tuple[Any, ...]:
        """Random inputs, and offsets that pack every token into the N sequences with random lengths
        (zeros, the default for integers, would make every row padding: no work to time)."""
        q, k, v, cu_q, cu_k, sinks = super().tuning_args(inv, seed)
        seqs = cu_q.shape[0] - 1
        rng = np.random.default_rng(seed)
        weights = rng.dirichlet(np.ones(seqs)) if seqs else np.zeros(0)

        def offsets(tokens: int, dtype: Any) -> jax.Array:
            cuts = np.floor(np.cumsum(weights) * tokens).astype(np.int64)
            if seqs:
                cuts[-1] = tokens
            return jnp.asarray(np.concatenate([[0], cuts]), dtype)

        return q, k, v, offsets(q.shape[0], cu_q.dtype), offsets(k.shape[0], cu_k.dtype), sinks


KERNEL = FlashAttentionVarlenKernel()


@eager_fast_path(KERNEL, get_default_executor, values=check_flash_attention_varlen_values, whole=True)
def flash_attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    precision: str | jax.lax.Precision | None = "highest",
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> jax.Array:
    """Softmax attention of packed variable-length sequences, without a materialised mask.

    Sequence ``s`` owns query rows ``cu_seqlens_q[s]:cu_seqlens_q[s+1]`` and key rows
    ``cu_seqlens_k[s]:cu_seqlens_k[s+1]``; its queries see only its keys, as
    :func:`ejk.flash_attention` on that sequence alone would.

    Args:
        q: ``[Tq, Hq, D]`` query tokens of every sequence, concatenated.
        k: ``[Tk, Hkv, D]``; ``Hq`` a multiple of ``Hkv`` (q head h uses kv head ``h // (Hq // Hkv)``).
        v: ``[Tk, Hkv, Dv]``.
        cu_seqlens_q: ``[N+1]`` int32 offsets into ``q``: start at 0, non-decreasing, end ``<= Tq``.
            Rows past the last offset are padding: zero output and zero gradient.
        cu_seqlens_k: ``[N+1]`` int32 offsets into ``k`` / ``v`` (the same length as
            ``cu_seqlens_q``); key rows past the last offset are never seen.
        max_seqlen_q: Optional static upper bound of the query lengths (checked when the offsets
            are concrete); a hint kernels may use, ejk's own do not need it.
        max_seqlen_k: The same for the key lengths.
        causal: Per sequence, bottom-right aligned: key ``p`` of a sequence is visible to its query
            ``r`` iff ``p <= r + Sk_s - Sq_s`` (``Sq_s``, ``Sk_s`` its lengths).
        softmax_scale: ``None`` (``1/sqrt(D)``) or a finite number > 0.
        sliding_window: ``w`` or ``(left, right)``, per sequence: visible iff
            ``-left <= p - (r + Sk_s - Sq_s) <= right``; with ``causal`` the right side is 0.
        logits_soft_cap: ``cap * tanh(logits / cap)`` on the logits (not on the sink).
        sinks: Optional ``[Hq]`` float logits, one per query head, computed in float32: each row's
            softmax denominator gains ``exp(sinks[h])`` (the sink has no value):
            ``out = Σ_j e^{s_j} v_j / (Σ_j e^{s_j} + e^{sinks[h]})``. Differentiable.
        precision: Of the float32 products (``"highest"``, the default, as for ``ejk.matmul``;
            ``"high"``, ``"default"`` (TF32 on NVIDIA GPUs), a ``jax.lax.Precision``, or ``None`` for
            JAX's default); bfloat16 / float16 inputs are unaffected.
        platform: ``"auto"`` or a platform name to force, e.g. ``"xla"``.
        cfg: Explicit config (an :class:`~ejk.ops.ImplChoice` or an implementation's own config).

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``. Rows that see no key (padding, empty key sequences,
        causal rows before their first key) are zeros.

    Offsets are traced values: a new packing of the same shapes neither retraces nor
    recompiles. Concrete offsets that break the rules above are a ``ValueError``; offsets known
    only at run time are read as ``cummax(clip(cu, 0, T))``: an offset past the packed length is
    the packed length and an offset below its predecessor repeats it (that sequence is empty),
    so wrong offsets never read out of bounds.
    """
    arrays, static = flash_attention_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, sinks=sinks, precision=precision,
    )
    q, k, v, cu_q, cu_k, sinks = arrays
    arrays = (q, k, v, sanitize_offsets(cu_q, q.shape[0]), sanitize_offsets(cu_k, k.shape[0]), sinks)
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


def flash_attention_varlen_call(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    precision: str | jax.lax.Precision | None = "highest",
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Validate ``flash_attention_varlen``'s arguments; return the kernel's (arrays, static kwargs)."""
    op = "flash_attention_varlen"
    q, k, v = as_array(op, "q", q), as_array(op, "k", k), as_array(op, "v", v)
    cu_q, cu_k = as_array(op, "cu_seqlens_q", cu_seqlens_q), as_array(op, "cu_seqlens_k", cu_seqlens_k)
    sinks = None if sinks is None else as_array(op, "sinks", sinks)
    static = check_flash_attention_varlen_args(
        q, k, v, cu_q, cu_k, sinks=sinks, causal=causal, softmax_scale=softmax_scale,
        sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, precision=precision,
    )
    return (q, k, v, cu_q, cu_k, sinks), static


_HERE = __package__

DEFINITION = define_op(
    KERNEL, flash_attention_varlen,
    reference=f"{_HERE}._reference:reference_flash_attention_varlen",
    check=f"{_HERE}._conformance:check_flash_attention_varlen",
    shard_rule=f"{_HERE}._shard:varlen_rule",
    bench=f"{_HERE}._bench:BENCH",
    samples=f"{_HERE}._samples:samples",
    output=f"{_HERE}._reference:reference_output",
)
