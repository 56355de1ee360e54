"""The residual format the flash-attention kernels share, and the log-sum-exp it holds."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

__all__ = ["FLASH_LSE_RESIDUALS", "FLASH_RESIDUALS", "natural_lse", "with_natural_lse"]

#: ``ejk.VJP.residuals`` of the flash kernels whose backward any of them can run:
#: ``(q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse2)`` with ``lse2`` the base-2
#: log-sum-exp ``[B, Hq, Sq]`` float32, ``+inf`` for rows that see no key.
FLASH_RESIDUALS = "flash_attention:inputs+out+lse2"
#: The same residuals for ``ejk.flash_attention_lse`` (its backward also takes the lse cotangent).
FLASH_LSE_RESIDUALS = "flash_attention_lse:inputs+out+lse2"

_LN2 = math.log(2.0)


def natural_lse(lse2: Any) -> Any:
    """A base-2 log-sum-exp of :data:`FLASH_RESIDUALS` (``+inf`` for rows that see no key) as
    ``ejk.flash_attention_lse`` returns it: natural, ``-inf`` for those rows."""
    import jax.numpy as jnp

    return jnp.where(lse2 == jnp.inf, -jnp.inf, lse2 * _LN2)


def with_natural_lse(forward_with_residuals: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    """The ``flash_attention_lse`` VJP forward of a ``flash_attention`` one that saves :data:`FLASH_RESIDUALS`:
    ``((out, natural lse), residuals)``, with the same kernels and residuals."""

    @functools.wraps(forward_with_residuals)
    def lse_forward_with_residuals(*args: Any, **kwargs: Any) -> tuple[tuple[Any, Any], Any]:
        out, residuals = forward_with_residuals(*args, **kwargs)
        return (out, natural_lse(residuals[-1])), residuals

    lse_forward_with_residuals.__name__ = lse_forward_with_residuals.__qualname__ = "lse_forward_with_residuals"
    lse_forward_with_residuals.__doc__ = (f"``((out, lse), residuals)`` of :func:`{forward_with_residuals.__name__}`"
                                          " for ``ejk.flash_attention_lse`` (natural lse, ``-inf`` for empty rows).")
    return lse_forward_with_residuals
