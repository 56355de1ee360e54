"""Argument checks shared by the operations' validators (scalars and sliding windows)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

__all__ = ["is_int", "is_real", "normalize_window", "optional_positive"]


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
