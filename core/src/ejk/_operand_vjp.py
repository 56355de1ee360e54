"""A custom VJP whose residuals are the call's array operands, as the matmul kernels' are.

A matmul-like implementation saves nothing but its inputs and computes the gradients with its own
kernel: :func:`saving_operands` turns its forward into the VJP forward, :func:`operand_cotangents`
its gradient function into the VJP backward (each cotangent summed over the mesh axes its operand
does not vary along, so it works under ``shard_map``)::

    forward_with_residuals = saving_operands(forward)
    backward = operand_cotangents(gradients)
    vjp = ejk.VJP(fwd=forward_with_residuals, bwd=backward, residuals=MATMUL_RESIDUALS)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ejk.parallel._vma import cotangent_like

__all__ = ["GROUPED_MATMUL_RESIDUALS", "MATMUL_RESIDUALS", "operand_cotangents", "saving_operands"]

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
