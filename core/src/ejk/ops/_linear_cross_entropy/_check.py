"""Validation of ``linear_cross_entropy`` arguments; ``labels`` values are checked where concrete."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ejk.ops._check_arrays import concrete, listed, require_floating, require_integer, require_ndim
from ejk.ops._check_common import is_int, is_real

__all__ = ["REDUCTIONS", "check_labels", "check_linear_cross_entropy_args", "check_linear_cross_entropy_values",
           "check_loss_options"]

#: The values of ``reduction``.
REDUCTIONS = ("mean", "sum", "none")

_OP = "linear_cross_entropy"


def check_linear_cross_entropy_args(x: Any, w: Any, labels: Any, *, ignore_index: int) -> None:
    """Validate ``x [T, H]``, ``w [H, V]`` and ``labels [T]``.

    Where ``labels`` is concrete (an eager call), every label must be ``ignore_index`` or in
    ``[0, V)``; under ``jax.jit`` the values cannot be read, and an out-of-range label is
    treated as ignored (see :func:`ejk.linear_cross_entropy`).

    Raises:
        ValueError: naming the argument, its shape, dtype or values, and what it needs.
    """
    t, h = require_ndim(_OP, "x", x, 2, "[T, H] (tokens, hidden; flatten batch and sequence first)")
    w_shape = require_ndim(_OP, "w", w, 2, f"[H={h}, V] (Flax's Dense layout; tied embeddings pass embedding.T)")
    if w_shape[0] != h:
        raise ValueError(f"{_OP}: w has shape {w_shape} but needs [H={h}, V] (its first dimension must match the "
                         f"last of x, whose shape is {(t, h)}; tied embeddings [V, H] pass embedding.T)")
    if w_shape[1] == 0:
        raise ValueError(f"{_OP}: w has shape {w_shape} but needs at least one vocabulary column (V >= 1)")
    l_shape = require_ndim(_OP, "labels", labels, 1, f"[T={t}]")
    if l_shape[0] != t:
        raise ValueError(f"{_OP}: labels has shape {l_shape} but needs [T={t}] (one label per row of x)")
    require_floating(_OP, "x", x)
    require_floating(_OP, "w", w)
    require_integer(_OP, "labels", labels)
    check_labels(labels, w_shape[1], ignore_index)


def check_linear_cross_entropy_values(x: Any, w: Any, labels: Any, *, ignore_index: Any = -100, **_: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): ``labels``."""
    check_labels(labels, int(w.shape[1]), int(ignore_index))


def check_labels(labels: Any, vocab: int, ignore_index: int) -> None:
    """Where ``labels`` is concrete: each is ``ignore_index`` or in ``[0, vocab)``."""
    values = concrete(labels)
    if values is not None and values.size:
        bad = np.nonzero((values != ignore_index) & ((values < 0) | (values >= vocab)))[0]
        if bad.size:
            raise ValueError(
                f"{_OP}: labels holds values outside [0, V={vocab}) that are not ignore_index={ignore_index}: "
                f"{listed(bad, values[bad])}; mark tokens without a target with ignore_index"
            )


def check_loss_options(*, ignore_index: Any, reduction: Any, label_smoothing: Any, z_loss: Any,
                       logit_soft_cap: Any) -> tuple[int, str, float, float, float | None]:
    """Validate the loss options; returns them normalised.

    Raises:
        ValueError: ``"linear_cross_entropy: <name> is <value> but needs …"``.
    """
    if not is_int(ignore_index):
        raise ValueError(f"{_OP}: ignore_index is {ignore_index!r} but needs an int (e.g. -100)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{_OP}: reduction is {reduction!r} but needs one of {', '.join(map(repr, REDUCTIONS))}")
    if not is_real(label_smoothing) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"{_OP}: label_smoothing is {label_smoothing!r} but needs a number in [0, 1]")
    if not is_real(z_loss) or not 0.0 <= float(z_loss) < math.inf:
        raise ValueError(f"{_OP}: z_loss is {z_loss!r} but needs a finite number >= 0 (e.g. 1e-4)")
    if logit_soft_cap is not None and (not is_real(logit_soft_cap) or not 0 < float(logit_soft_cap) < math.inf):
        raise ValueError(f"{_OP}: logit_soft_cap is {logit_soft_cap!r} but needs a finite number > 0 or None")
    cap = None if logit_soft_cap is None else float(logit_soft_cap)
    return int(ignore_index), str(reduction), float(label_smoothing), float(z_loss), cap
