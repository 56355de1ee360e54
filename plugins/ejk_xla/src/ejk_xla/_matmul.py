"""XLA ``matmul``: one ``lax.dot_general`` with float32 accumulation.

XLA already picks its own tiling for a dense matmul, so there is nothing worth autotuning
here: the config space has one element. The config carries one user-facing knob, the
precision of the products, which changes numerics (e.g. TF32 on NVIDIA GPUs, fewer bf16
passes on TPUs) and is therefore never chosen by autotuning.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["MatmulConfig", "config_space", "heuristic_config", "matmul"]

_PRECISIONS = {
    "default": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST,
}


@attrs.frozen(kw_only=True)
class MatmulConfig:
    """Config of the XLA matmul.

    Attributes:
        precision: ``"highest"`` (full float32 products for float32 inputs), ``"high"`` or
            ``"default"`` (the backend's fast path, e.g. TF32). Accumulation is always float32.
    """

    precision: str = attrs.field(default="highest", validator=attrs.validators.in_(tuple(_PRECISIONS)))


def matmul(a: jax.Array, b: jax.Array, *, cfg: MatmulConfig | None = None) -> jax.Array:
    """``a @ b`` with float32 accumulation.

    Args:
        a: ``[..., m, k]``.
        b: ``[k, n]``.
        cfg: The config; ``None`` means ``MatmulConfig()``.

    Returns:
        ``[..., m, n]`` in ``result_type(a, b)``.
    """
    cfg = MatmulConfig() if cfg is None else cfg
    out_dtype = jnp.result_type(a, b)
    if a.dtype != b.dtype:  # dot_general wants one operand dtype
        a, b = a.astype(out_dtype), b.astype(out_dtype)
    out = lax.dot_general(
        a,
        b,
        dimension_numbers=(((a.ndim - 1,), (0,)), ((), ())),
        precision=_PRECISIONS[cfg.precision],
        preferred_element_type=jnp.float32,
    )
    return out.astype(out_dtype)


def config_space(a: Any, b: Any, **_: Any) -> list[MatmulConfig]:
    """The autotuning candidates: only the default (precision is not a tuning knob).

    Args:
        a: ``[..., m, k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[k, n]``.

    Returns:
        ``[MatmulConfig()]``.
    """
    del a, b
    return [MatmulConfig()]


def heuristic_config(a: Any, b: Any, **_: Any) -> MatmulConfig:
    """The config used without tuning: full precision.

    Args:
        a: ``[..., m, k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[k, n]``.

    Returns:
        ``MatmulConfig()``.
    """
    del a, b
    return MatmulConfig()
