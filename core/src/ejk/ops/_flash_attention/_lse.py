"""``ejk.flash_attention_lse``: flash attention that also returns each row's log-sum-exp.

Attention split over key blocks (ring attention, split-K decoding) computes one partial result
per block and merges them by their log-sum-exps; this op gives the per-block pair through the
Executor, so the best implementation for the block's shape runs (and is tuned) like any op.
It is differentiable in both outputs: a cotangent on ``lse`` flows into ``q`` and ``k``.

It is a variant of ``flash_attention``: every ``flash_attention`` implementation whose VJP saves
:data:`FLASH_RESIDUALS` (which hold the base-2 lse) provides it for free — its forward is that
VJP's forward, the lse read from the residuals; its backward is that VJP's backward when it takes
the lse cotangent (``ejk.VJP(extra_cotangents=("lse",))``), else (or for a forward-only one) the
backward of another implementation paired by :data:`FLASH_LSE_RESIDUALS`. An implementation
registered for ``flash_attention_lse`` itself shadows the derived one of the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import jax
import jax.numpy as jnp

from ejk._contract import fit_call
from ejk._pairing import pairing_reason
from ejk.ops._base import ImplChoice, get_default_executor, run_op
from ejk.ops._definition import define_op
from ejk.ops._eager import eager_fast_path
from ejk.ops._flash_attention._op import FlashAttentionKernel, flash_attention_call
from ejk.ops._flash_attention._residuals import FLASH_LSE_RESIDUALS, FLASH_RESIDUALS, LSE2_INDEX, with_natural_lse
from ejk.ops._matmul._op import DEFAULT_PRECISION
from ejk.ops._residuals import without_residuals
from ejk.registry import VJP, KernelSpec

__all__ = ["DEFINITION", "KERNEL", "FlashAttentionLseKernel", "flash_attention_lse"]

#: The output ``flash_attention_lse`` adds: a ``flash_attention`` backward that takes its cotangent
#: (``d_lse``, of the natural lse ``[B, Hq, Sq]``) names it in ``ejk.VJP(extra_cotangents=...)``.
LSE = "lse"


def _lse_backward(backward: Callable[..., Any]) -> Callable[..., Any]:
    """The ``flash_attention_lse`` backward of a ``flash_attention`` one that takes ``d_lse``."""

    def lse_backward(residuals: tuple[Any, ...], cotangents: tuple[jax.Array, jax.Array], *, cfg: Any = None,
                     **static: Any) -> Any:
        d_out, d_lse = cotangents
        # A row that sees no key (lse2 = +inf) gets no gradient whatever its lse cotangent, NaN included.
        d_lse = jnp.where(residuals[LSE2_INDEX] == jnp.inf, 0.0, d_lse)
        return backward(residuals, d_out, d_lse=d_lse, cfg=cfg, **static)

    lse_backward.__doc__ = f"Gradients of ``flash_attention_lse`` through {getattr(backward, '__name__', 'bwd')}."
    lse_backward.__wrapped__ = backward  # type: ignore[attr-defined]  # its keywords (extension arguments) are the backward's
    return lse_backward


def _own_gate(spec: KernelSpec) -> Callable[..., str | None] | None:
    """The plugin's own capability gate of ``spec`` (a forward-only one's is wrapped by the registry)."""
    if spec.vjp is not None and spec.vjp.paired:
        return getattr(spec.capability, "__wrapped__", None)
    return spec.capability


class FlashAttentionLseKernel(FlashAttentionKernel):
    """Dispatches ``flash_attention_lse``: ``flash_attention``'s arguments and checks, its implementations
    (registered for this op, or derived from those of ``flash_attention``)."""

    op_id = "flash_attention_lse"
    version = "1"
    variant_of = "flash_attention"

    def derive(self, spec: KernelSpec) -> KernelSpec | None:
        vjp = spec.vjp
        if vjp is None or vjp.residuals != FLASH_RESIDUALS:
            return None
        forward = with_natural_lse(vjp.fwd)
        if vjp.bwd is not None and LSE in vjp.extra_cotangents:
            lse_vjp = VJP(fwd=forward, bwd=_lse_backward(vjp.bwd), residuals=FLASH_LSE_RESIDUALS)
            return attrs.evolve(spec, algorithm=self.op_id, implementation=without_residuals(forward, "forward_lse"),
                                vjp=lse_vjp)
        # Forward only: the backward of another implementation of this op that consumes its residuals.
        own = _own_gate(spec)

        def capability(**call: Any) -> str | None:
            reason = None if own is None else own(**fit_call(own, call, self.op_id, self.extensions))
            return reason if reason is not None else self._pairing_reason(derived, call)

        if own is not None:  # as the registry marks the gate it wraps
            capability.__wrapped__ = own  # type: ignore[attr-defined]
        derived = attrs.evolve(
            spec, algorithm=self.op_id, implementation=without_residuals(forward, "forward_lse"),
            vjp=VJP(fwd=forward, residuals=FLASH_LSE_RESIDUALS, fix=vjp.fix if vjp.paired else None),
            capability=capability,
        )
        return derived

    def _pairing_reason(self, spec: KernelSpec, call: Mapping[str, Any]) -> str | None:
        return pairing_reason(self.registry, spec, call, self.implementations())


KERNEL = FlashAttentionLseKernel()


@eager_fast_path(KERNEL, get_default_executor)  # validation reads shapes, dtypes, statics only
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
    sinks: jax.Array | None = None,
    precision: Any = DEFAULT_PRECISION,
    platform: str = "auto",
    cfg: ImplChoice | Any | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`ejk.flash_attention` plus the natural log-sum-exp of each row's final logits.

    Arguments and masks are those of :func:`ejk.flash_attention` (``sinks`` and ``precision`` included).

    Returns:
        ``(out, lse)``: ``out`` ``[B, Sq, Hq, Dv]`` in ``q.dtype`` (rows that see no key are
        zeros) and ``lse`` ``[B, Hq, Sq]`` float32, ``log Σ_visible exp(logit)``, ``-inf`` for
        rows that see no key. With ``sinks`` the lse is the log of the full denominator,
        ``log(Σ_visible exp(logit) + exp(sinks[h]))``, for rows that see a key (rows that see
        none stay ``-inf``): to merge blocks of keys, compute them without sinks and add the sink
        once (as :func:`ejk.ring_attention` does). Both are differentiable.
    """
    arrays, static = flash_attention_call(
        q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
        sinks=sinks, precision=precision,
    )
    return run_op(KERNEL, arrays, static, platform, cfg)  # type: ignore[no-any-return]


_HERE = __package__

DEFINITION = define_op(
    KERNEL, flash_attention_lse,
    reference=f"{_HERE}._reference:reference_flash_attention_lse",
    check=f"{_HERE}._conformance:check_flash_attention_lse",
    shard_rule=f"{_HERE}._shard:attention_lse_rule",
    residuals=(FLASH_LSE_RESIDUALS,),
    samples=f"{_HERE}._samples:samples",
)
