"""The residual format the flash-attention kernels share, and the log-sum-exp it holds."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

__all__ = ["FLASH_LSE_RESIDUALS", "FLASH_RESIDUALS", "LSE2_INDEX", "fold_sinks", "natural_lse", "sinks_backward",
           "sinks_cotangent", "with_natural_lse"]

#: ``ejk.VJP.residuals`` of the flash kernels whose backward any of them can run:
#: ``(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse2)`` with ``lse2`` the base-2
#: log-sum-exp ``[B, Hq, Sq]`` float32, ``+inf`` for rows that see no key. A call with ``sinks``
#: appends them: ``(..., out, lse2, sinks)``, and its ``lse2`` includes the sink (the log of the
#: full denominator), so a backward kernel's ``P = 2^(s·log2 e − lse2)`` and
#: ``dS = P ∘ (dP − D)`` are unchanged; :func:`sinks_backward` adds the sinks' cotangent.
FLASH_RESIDUALS = "flash_attention:inputs+out+lse2"
#: Where ``lse2`` sits in :data:`FLASH_RESIDUALS`, with or without sinks.
LSE2_INDEX = 7
#: The same residuals for ``ejk.flash_attention_lse`` (its backward also takes the lse cotangent).
FLASH_LSE_RESIDUALS = "flash_attention_lse:inputs+out+lse2"

_LN2 = math.log(2.0)


def natural_lse(lse2: Any) -> Any:
    """A base-2 log-sum-exp of :data:`FLASH_RESIDUALS` (``+inf`` for rows that see no key) as
    ``ejk.flash_attention_lse`` returns it: natural, ``-inf`` for those rows."""
    import jax.numpy as jnp

    return jnp.where(lse2 == jnp.inf, -jnp.inf, lse2 * _LN2)


def fold_sinks(out: Any, lse2: Any, sinks: Any) -> tuple[Any, Any]:
    """Add the sinks to a finished attention result: ``(out, lse2)`` of a call without them (base-2
    lse ``[B, Hq, Sq]``, ``+inf`` for rows that see no key) → those of the same call with ``sinks``
    ``[Hq]``. Each row is scaled by ``Σ e^s / (Σ e^s + e^sink)``; empty rows stay zeros / ``+inf``.

    For a kernel that cannot add the sink to its own final normalisation (one more pass over
    ``out``); differentiable, but kernels use it inside their VJP forward and :func:`sinks_backward`."""
    import jax.numpy as jnp

    sink2 = sinks.astype(jnp.float32)[None, :, None] * (1.0 / _LN2)  # base 2
    seen = lse2 != jnp.inf
    row = jnp.where(seen, lse2, 0.0)
    full = jnp.logaddexp2(row, sink2)
    scale = jnp.where(seen, jnp.exp2(row - full), 0.0)  # [B, Hq, Sq]
    scaled = out.astype(jnp.float32) * jnp.swapaxes(scale, 1, 2)[..., None]
    return scaled.astype(out.dtype), jnp.where(seen, full, jnp.inf)


def sinks_cotangent(sinks: Any, out: Any, lse2: Any, d_out: Any, d_lse: Any = None, *, delta: Any = None) -> Any:
    """The cotangent of ``sinks`` ``[Hq]``: ``Σ_rows e^(sink − lse) · (d_lse − rowsum(d_out ∘ out))`` with
    the lse including the sink (``lse2``, base 2; rows that see no key, ``+inf``, contribute 0), in
    ``sinks.dtype``. ``delta`` ``[B, Hq, Sq]``, when a backward kernel computed it already, is
    ``rowsum(d_out ∘ out) − d_lse`` (then ``out``, ``d_out`` and ``d_lse`` are not read: no extra pass)."""
    import jax.numpy as jnp

    dtype = jnp.promote_types(jnp.float32, lse2.dtype if delta is not None else out.dtype)
    if delta is None:
        delta = jnp.sum(d_out.astype(dtype) * out.astype(dtype), axis=-1)  # [B, Sq, Hq]
        delta = jnp.swapaxes(delta, 1, 2)
        if d_lse is not None:
            delta = delta - d_lse.astype(dtype)
    delta = delta.astype(dtype)
    seen = lse2 != jnp.inf
    sink2 = sinks.astype(dtype)[None, :, None] * (1.0 / _LN2)
    p_sink = jnp.where(seen, jnp.exp2(sink2 - jnp.where(seen, lse2, 0.0)), 0.0)
    return (-jnp.sum(p_sink * jnp.where(seen, delta, 0.0), axis=(0, 2))).astype(sinks.dtype)


def sinks_backward(backward: Callable[..., Any], *, delta: bool = False) -> Callable[..., Any]:
    """A :data:`FLASH_RESIDUALS` backward that returns one cotangent per array argument up to ``bias``
    made into one that also takes calls with ``sinks``: it runs ``backward`` on the residuals without
    the sinks (their ``lse2`` includes the sink, which is all the kernel needs) and appends the sinks'
    cotangent (``None`` for a call without sinks). Keyword arguments (``d_lse`` included) pass through.

    ``delta=True``: ``backward`` takes ``return_delta: bool`` and, when it is ``True``, appends the
    ``[B, Hq, Sq]`` float32 ``rowsum(d_out ∘ out) − d_lse`` its kernels computed anyway, from which
    the sinks' cotangent follows without another pass over ``out`` and ``d_out``."""

    @functools.wraps(backward)
    def backward_with_sinks(residuals: tuple[Any, ...], cotangent: Any, **kwargs: Any) -> tuple[Any, ...]:
        if len(residuals) == LSE2_INDEX + 1:
            return (*backward(residuals, cotangent, **kwargs), None)
        base, sinks = tuple(residuals[:LSE2_INDEX + 1]), residuals[LSE2_INDEX + 1]
        out, lse2 = base[LSE2_INDEX - 1], base[LSE2_INDEX]
        from ejk.parallel._vma import cotangent_like

        if delta:
            *grads, rows = backward(base, cotangent, **kwargs, return_delta=True)
            return (*grads, cotangent_like(sinks_cotangent(sinks, out, lse2, None, delta=rows), sinks))
        grads = tuple(backward(base, cotangent, **kwargs))
        return (*grads, cotangent_like(sinks_cotangent(sinks, out, lse2, cotangent, kwargs.get("d_lse")), sinks))

    return backward_with_sinks


def with_natural_lse(forward_with_residuals: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    """The ``flash_attention_lse`` VJP forward of a ``flash_attention`` one that saves :data:`FLASH_RESIDUALS`:
    ``((out, natural lse), residuals)``, with the same kernels and residuals."""

    @functools.wraps(forward_with_residuals)
    def lse_forward_with_residuals(*args: Any, **kwargs: Any) -> tuple[tuple[Any, Any], Any]:
        out, residuals = forward_with_residuals(*args, **kwargs)
        return (out, natural_lse(residuals[LSE2_INDEX])), residuals

    lse_forward_with_residuals.__name__ = lse_forward_with_residuals.__qualname__ = "lse_forward_with_residuals"
    lse_forward_with_residuals.__doc__ = (f"``((out, lse), residuals)`` of :func:`{forward_with_residuals.__name__}`"
                                          " for ``ejk.flash_attention_lse`` (natural lse, ``-inf`` for empty rows).")
    return lse_forward_with_residuals
