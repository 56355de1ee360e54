"""Checks of array arguments shared by the ops' validators: shapes, dtypes and concrete values.

Shape and dtype checks only need ``.shape`` and ``.dtype``, so they work on tracers and
``jax.ShapeDtypeStruct``; checks on *values* run only where the values are concrete (not inside
``jax.jit``/``vmap``/``grad`` tracing), because a traced value cannot be read. Every error is a
:class:`ValueError` naming the operation, the argument, what it got and what it needs.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejk.ops._check_common import float_dtype_problem

__all__ = [
    "INTEGER",
    "concrete",
    "dtype_of",
    "listed",
    "require_array",
    "require_floating",
    "require_integer",
    "require_ndim",
    "shape_of",
]

INTEGER = "an integer dtype (int32)"
MAX_LISTED = 4  # offending entries quoted in an error message


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of an array-like (arrays, tracers, ShapeDtypeStructs, Python scalars, lists)."""
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def dtype_of(x: Any) -> np.dtype[Any]:
    dtype = getattr(x, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(x).dtype


def concrete(x: Any) -> np.ndarray[Any, Any] | None:
    """The value of ``x`` as a NumPy array, or ``None`` when it is traced or abstract."""
    if isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)):
        return None
    if isinstance(x, (jax.Array, np.ndarray, np.generic, numbers.Number, list, tuple)):
        return np.asarray(x)
    return None


def require_array(op: str, name: str, x: Any, needs: str) -> None:
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{op}: {name} is {x!r} but needs an array {needs}")


def require_ndim(op: str, name: str, x: Any, ndim: int, needs: str) -> tuple[int, ...]:
    require_array(op, name, x, needs)
    shape = shape_of(x)
    if len(shape) != ndim:
        raise ValueError(f"{op}: {name} has shape {shape} but needs {needs} ({ndim} dimensions)")
    return shape


def require_floating(op: str, name: str, x: Any) -> None:
    dtype = dtype_of(x)
    needs = float_dtype_problem(dtype)
    if needs is not None:
        raise ValueError(f"{op}: {name} has dtype {dtype} but needs {needs}")


def require_integer(op: str, name: str, x: Any) -> None:
    dtype = dtype_of(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{op}: {name} has dtype {dtype} but needs {INTEGER}")


def listed(indices: np.ndarray[Any, Any], values: np.ndarray[Any, Any]) -> str:
    """``"[2]=-1, [5]=-3"`` for the first few offending entries."""
    shown = ", ".join(f"[{int(i)}]={int(v)}" for i, v in zip(indices[:MAX_LISTED], values[:MAX_LISTED], strict=False))
    more = len(indices) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")
