"""Argument checks shared by every operation's validator: one rule each for floating dtypes,
``softmax_scale``, sliding windows, array-likes and counts."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "as_array",
    "dtype_name",
    "float_dtype_problem",
    "is_int",
    "is_real",
    "normalize_window",
    "optional_positive",
    "scalar_count",
    "softmax_scale",
]


#: The one dtype rule of every op's floating inputs. float64 is rejected, not computed at float32
#: accuracy behind the user's back: the kernels accumulate in float32 (cast inputs to float32).
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, memoised (NumPy builds the name in Python: a few µs per eager call)."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = str(np.dtype(dtype).name)
    if len(_DTYPE_NAMES) < 256:
        try:
            _DTYPE_NAMES[dtype] = name
        except TypeError:
            pass
    return name


def float_dtype_problem(dtype: Any) -> str | None:
    """``None`` for a supported floating dtype, else what is needed (for ``"<x> has dtype … but needs …"``)."""
    name = dtype_name(dtype)
    if name in FLOAT_DTYPES:
        return None
    hint = " (float64 is not supported: cast to float32)" if name == "float64" else ""
    return f"a floating dtype: one of {', '.join(FLOAT_DTYPES)}{hint}"


def is_int(value: Any) -> bool:
    """An integral number that is not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number that is not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def normalize_window(
    op: str,
    name: str,
    window: Any,
    *,
    causal: bool,
    max_left: int | None = None,
    max_right: int | None = None,
) -> tuple[int, int] | None:
    """``None``, ``w`` or ``(left, right)`` of non-negative ints → ``(left, right)``; causal forces right = 0.

    With ``causal=True`` the right side is dropped (``(3, 7)`` means ``(3, 0)``): nothing to
    the right of a query is visible anyway. Each side is then clamped to the largest
    distance that can occur (``max_left`` / ``max_right``, from the sequence lengths), so a
    window of any size, ``2**31 - 1`` or more included, means the same as the whole
    sequence and never overflows an int32 index inside a kernel.

    Args:
        op: Operation name, for the error message.
        name: Argument name, for the error message.
        window: The user's value.
        causal: Whether attention is causal.
        max_left: Clamp for ``left`` (``Sk - 1`` for flash attention); ``None``: no clamp.
        max_right: Clamp for ``right`` (``Sq - 1`` for flash attention); ``None``: no clamp.

    Raises:
        ValueError: ``"<op>: <name> is <value> but needs non-negative ints …"``.
    """
    if window is None:
        return None
    if is_int(window):
        pair: tuple[Any, ...] = (window, window)
    elif isinstance(window, Sequence) and not isinstance(window, str) and len(window) == 2:
        pair = tuple(window)
    else:
        pair = ()
    if not pair or not all(is_int(x) and x >= 0 for x in pair):
        raise ValueError(
            f"{op}: {name} is {window!r} but needs non-negative ints: None, an int w, or a (left, right) pair"
        )
    left, right = int(pair[0]), 0 if causal else int(pair[1])
    if max_left is not None:
        left = min(left, max(int(max_left), 0))
    if max_right is not None:
        right = min(right, max(int(max_right), 0))
    return (left, right)


def optional_positive(op: str, name: str, value: Any) -> float | None:
    """``None`` or a finite number > 0, as a float.

    Raises:
        ValueError: ``"<op>: <name> is <value> but needs a finite number > 0 or None"``.
    """
    if value is None:
        return None
    if not is_real(value) or not (0 < float(value) < math.inf):
        raise ValueError(f"{op}: {name} is {value!r} but needs a finite number > 0 or None")
    return float(value)


def softmax_scale(op: str, value: Any, head_dim: int) -> float:
    """The one rule of every op: ``None`` (then ``1/sqrt(head_dim)``) or a finite number > 0.

    Raises:
        ValueError: ``"<op>: softmax_scale is <value> but needs a finite number > 0 or None …"``.
    """
    if value is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if not is_real(value) or not (0 < float(value) < math.inf):
        raise ValueError(
            f"{op}: softmax_scale is {value!r} but needs a finite number > 0 or None (1/sqrt(head_dim)); "
            "flip the sign of q instead of the scale"
        )
    return float(value)


def as_array(op: str, name: str, value: Any) -> Any:
    """Python lists / tuples and NumPy values → a JAX array (as ``jnp.asarray``); arrays, tracers
    and ``jax.ShapeDtypeStruct`` pass through unchanged.

    Raises:
        ValueError: when the value cannot be an array (ragged lists, strings inside …).
    """
    if not isinstance(value, list | tuple | np.ndarray | np.generic):
        return value
    import jax.numpy as jnp

    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{op}: {name} is {value!r:.60} but needs an array (a list converts only when it is "
                         f"rectangular and numeric): {exc}") from None


def scalar_count(op: str, name: str, value: Any) -> Any:
    """An integer count given as a Python / NumPy int or an integer array of shape ``()`` / ``(1,)``.

    ``bool``, floats (``1.7``) and strings (``"2"``) are rejected rather than truncated.

    Returns:
        The count as an int32 JAX array (or tracer).

    Raises:
        ValueError: naming the argument, what it got and what it needs.
    """
    import jax.numpy as jnp

    needs = "an int (not a bool or a float) or an integer array of shape ()"
    if isinstance(value, bool | np.bool_ | str | bytes | float | complex):
        raise ValueError(f"{op}: {name} is {value!r} but needs {needs}")
    if is_int(value):
        if not -(2**31) <= int(value) < 2**31:
            raise ValueError(f"{op}: {name} is {value!r} but needs a value that fits int32")
        return jnp.asarray(int(value), dtype=jnp.int32)
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        raise ValueError(f"{op}: {name} is {value!r:.60} but needs {needs}")
    return jnp.asarray(value, dtype=jnp.int32)
