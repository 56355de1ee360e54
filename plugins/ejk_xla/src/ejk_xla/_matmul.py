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
from jax import lax

from ejk.plugin import MATMUL_RESIDUALS, operand_vjp

__all__ = ["MatmulConfig", "config_space", "gradients", "heuristic_config", "matmul", "vjp"]

#: Operand dtypes whose GPU GEMM (cuBLAS) accumulates in float32 and rounds a same-dtype output once.
_GEMM_16BIT = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _products(precision: str | tuple[str, str], dtype: Any) -> str | tuple[str, str]:
    """The precision the dot asks XLA for: ``"default"`` for 16-bit operands, whose products are exact in the
    float32 accumulator whatever is asked, so the program is ``a @ b``'s own (XLA's GPU autotuner weighs other
    GEMM candidates for a 16-bit dot that asks for ``"highest"``); ``precision`` otherwise."""
    return "default" if jnp.dtype(dtype) in _GEMM_16BIT else precision


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
    precision = _products(precision, dtype)

    def accumulate_then_round(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32).astype(out_dtype)

    if jnp.dtype(dtype) in _GEMM_16BIT and jnp.dtype(out_dtype) == jnp.dtype(dtype):
        # cuBLAS accumulates 16-bit products in float32 and rounds its output once: asking for the 16-bit
        # output directly saves writing and re-reading a float32 product
        # (benchmarks/results/kernel_defaults_h100.md).
        def gemm(a: jax.Array, b: jax.Array) -> jax.Array:
            return jnp.matmul(a, b, precision=precision, preferred_element_type=out_dtype)

        return lax.platform_dependent(a, b, cuda=gemm, default=accumulate_then_round)  # type: ignore[no-any-return]
    return accumulate_then_round(a, b)


def gradients(
    operands: tuple[jax.Array, jax.Array],
    d_out: jax.Array,
    *,
    cfg: MatmulConfig | None = None,
    precision: str | tuple[str, str] = ("highest", "highest"),
    preferred_element_type: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """``(d a, d b)`` in the dtypes of ``a`` and ``b`` (broadcast batch dims summed, as ``jnp.matmul``'s).

    The transposed products run in the operands' common dtype promoted with the cotangent's: a
    bf16 matmul with a bf16 output keeps bf16 tensor-core products (float32 accumulation inside
    the GEMM), as ``a @ b``'s own gradient does. Autodiff of :func:`matmul` would instead see the
    float32 accumulator's cotangent and run both gradient products in float32, at about half the
    speed on an H100. A float32 output (``preferred_element_type``) keeps its float32 cotangent.
    """
    del cfg, preferred_element_type
    a, b = operands
    compute = jnp.promote_types(jnp.result_type(a, b), d_out.dtype)
    precision = _products(precision, compute)

    def product(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.matmul(x, y, precision=precision, preferred_element_type=compute)

    _, pullback = jax.vjp(product, a.astype(compute), b.astype(compute))
    da, db = pullback(d_out.astype(compute))
    return da.astype(a.dtype), db.astype(b.dtype)


#: The custom VJP: the operands are the residuals, :func:`gradients` the backward.
vjp = operand_vjp(matmul, gradients, MATMUL_RESIDUALS)


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
