"""A custom VJP whose residuals are the call's array operands, as the matmul kernels' are.

A matmul-like implementation saves nothing but its inputs and computes the gradients with its own
kernel: :func:`operand_vjp` builds its :class:`~ejk.VJP` from the forward and a gradient function,
tagged with the residual format that lets implementations of one op pair their forwards and
backwards (:data:`MATMUL_RESIDUALS`, :data:`GROUPED_MATMUL_RESIDUALS`)::

    vjp = operand_vjp(forward, gradients, MATMUL_RESIDUALS)

:func:`saving_operands` and :func:`operand_cotangents` are its two halves: a forward-only
implementation, whose backward is paired, declares ``VJP(fwd=saving_operands(forward), residuals=...)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ejk._kernel_spec import VJP
from ejk.parallel._vma import cotangent_like

__all__ = ["GROUPED_MATMUL_RESIDUALS", "MATMUL_RESIDUALS", "operand_cotangents", "operand_vjp", "saving_operands"]

#: ``ejk.VJP.residuals`` of a matmul whose residuals are its operands ``(a, b)``.
MATMUL_RESIDUALS = "matmul:inputs"
#: ``ejk.VJP.residuals`` of a grouped matmul whose residuals are its operands ``(lhs, rhs, group_sizes)``.
GROUPED_MATMUL_RESIDUALS = "grouped_matmul:inputs"


def saving_operands(forward: Callable[..., Any]) -> Callable[..., tuple[Any, tuple[Any, ...]]]:
    """The VJP forward of ``forward(*arrays, **static)``: ``(its output, arrays)``; it has ``forward``'s parameters."""

    @functools.wraps(forward)
    def forward_with_residuals(*arrays: Any, **static: Any) -> tuple[Any, tuple[Any, ...]]:
        return forward(*arrays, **static), arrays

    forward_with_residuals.__name__ = forward_with_residuals.__qualname__ = "forward_with_residuals"
    forward_with_residuals.__doc__ = f"The output of :func:`{forward.__name__}` and its array operands (the residuals)."
    return forward_with_residuals


def operand_cotangents(gradients: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    """The VJP backward of ``gradients(operands, d_out, **static)``, which returns one cotangent per operand
    (``None`` for a non-differentiable one): the same, each cotangent made to vary like its operand."""

    @functools.wraps(gradients)
    def backward(residuals: tuple[Any, ...], d_out: Any, **static: Any) -> tuple[Any, ...]:
        found = gradients(residuals, d_out, **static)
        return tuple(None if g is None else cotangent_like(g, x) for g, x in zip(found, residuals, strict=True))

    backward.__name__ = backward.__qualname__ = "backward"
    return backward


def operand_vjp(forward: Callable[..., Any], gradients: Callable[..., tuple[Any, ...]], residuals: str) -> VJP:
    """The :class:`~ejk.VJP` of ``forward`` that saves its array operands and differentiates with ``gradients``.

    Args:
        forward: The implementation, ``forward(*arrays, **static, cfg=cfg)``.
        gradients: ``gradients(operands, d_out, *, cfg, **static)``: one cotangent per array operand, in its
            dtype (``None`` for a non-differentiable one, such as integer group sizes); under ``shard_map``
            each is summed over the mesh axes its operand does not vary along.
        residuals: The residual format's tag, :data:`MATMUL_RESIDUALS` or :data:`GROUPED_MATMUL_RESIDUALS`
            for the matmul ops (equal tags let implementations run each other's backward).
    """
    return VJP(fwd=saving_operands(forward), bwd=operand_cotangents(gradients), residuals=residuals)
