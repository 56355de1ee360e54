"""XLA ``matmul``: ``jnp.matmul`` shapes, one ``dot_general`` with float32 accumulation.

XLA already picks its own tiling for a dense matmul, so there is nothing worth autotuning
here: the config class has no fields and the config space has one element. ``precision`` and
``preferred_element_type`` change numerics, so they are arguments of ``ejk.matmul`` (passed
here resolved), never part of a tuning config.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp

__all__ = ["MatmulConfig", "config_space", "heuristic_config", "matmul"]


@attrs.frozen(kw_only=True)
class MatmulConfig:
    """Config of the XLA matmul: no fields (XLA tiles a dense matmul itself).

    It exists so that ``cfg=MatmulConfig()`` names this implementation. The precision of
    the products and the output dtype are arguments of ``ejk.matmul``
    (``precision=``, ``preferred_element_type=``), not config fields.
    """


def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
    cfg: MatmulConfig | None = None,
) -> jax.Array:
    """``a @ b`` as ``jnp.matmul`` (broadcast batch dimensions, 1-D operands), float32 accumulation.

    ``ejk.matmul`` always passes ``precision`` and ``preferred_element_type`` resolved; the
    defaults here (ejk's defaults) serve direct calls.

    Args:
        a: ``[..., m, k]`` or ``[k]``.
        b: ``[..., k, n]`` or ``[k]``.
        precision: A pair of ``jax.lax.Precision`` names (lhs, rhs), or one for both.
        preferred_element_type: The output dtype; ``None`` means ``result_type(a, b)``.
        cfg: Unused (the config has no fields); ``None`` means ``MatmulConfig()``.

    Returns:
        ``jnp.matmul(a, b)``'s shape in ``preferred_element_type``.
    """
    del cfg
    dtype = jnp.result_type(a, b)
    out_dtype = dtype if preferred_element_type is None else preferred_element_type
    if a.dtype != b.dtype:  # dot_general wants one operand dtype
        a, b = a.astype(dtype), b.astype(dtype)
    out = jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32)
    return out.astype(out_dtype)


def config_space(a: Any, b: Any, **_: Any) -> list[MatmulConfig]:
    """The autotuning candidates: only ``MatmulConfig()`` (XLA tiles a dense matmul itself).

    Args:
        a: ``[..., m, k]`` or ``[k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[..., k, n]`` or ``[k]``.

    Returns:
        ``[MatmulConfig()]``.
    """
    del a, b
    return [MatmulConfig()]


def heuristic_config(a: Any, b: Any, **_: Any) -> MatmulConfig:
    """The config used without tuning.

    Args:
        a: ``[..., m, k]`` or ``[k]`` (anything with ``.shape`` and ``.dtype``).
        b: ``[..., k, n]`` or ``[k]``.

    Returns:
        ``MatmulConfig()``.
    """
    del a, b
    return MatmulConfig()
