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


def normalize_window(op: str, name: str, window: Any, *, causal: bool) -> tuple[int, int] | None:
    """``None``, ``w`` or ``(left, right)`` of non-negative ints → ``(left, right)``; causal forces right = 0.

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
    return (int(pair[0]), 0 if causal else int(pair[1]))


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
