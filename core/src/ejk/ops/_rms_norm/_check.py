"""Validation of ``rms_norm`` arguments."""

from __future__ import annotations

import math
from typing import Any

from ejk.ops._check_arrays import dtype_of, require_array, require_floating, require_ndim, shape_of
from ejk.ops._check_common import is_real

__all__ = ["check_rms_norm_args"]

_OP = "rms_norm"


def check_rms_norm_args(x: Any, scale: Any, *, eps: Any, residual: Any = None) -> float:
    """Validate ``x [..., D]``, ``scale [D]``, ``eps`` and ``residual`` (``None`` or ``x``'s shape and dtype);
    returns ``eps`` as a float.

    Raises:
        ValueError: naming the argument, what it got and what it needs.
    """
    require_array(_OP, "x", x, "[..., D]")
    shape = shape_of(x)
    if not shape:
        raise ValueError(f"{_OP}: x has shape () but needs [..., D] (at least 1 dimension: the normalised one)")
    d = shape[-1]
    s_shape = require_ndim(_OP, "scale", scale, 1, f"[D={d}]")
    if s_shape[0] != d:
        raise ValueError(f"{_OP}: scale has shape {s_shape} but needs [D={d}] (the last dimension of x, "
                         f"whose shape is {shape})")
    require_floating(_OP, "x", x)
    require_floating(_OP, "scale", scale)
    if residual is not None:
        require_array(_OP, "residual", residual, f"x's shape {shape}")
        if shape_of(residual) != shape:
            raise ValueError(f"{_OP}: residual has shape {shape_of(residual)} but needs x's shape {shape} "
                             "(it is added to x before the normalisation)")
        if dtype_of(residual) != dtype_of(x):
            raise ValueError(f"{_OP}: residual has dtype {dtype_of(residual).name} but needs x's dtype "
                             f"{dtype_of(x).name} (the sum is returned in it); cast one of them")
    if not is_real(eps) or not 0 < float(eps) < math.inf:
        raise ValueError(f"{_OP}: eps is {eps!r} but needs a finite number > 0 (e.g. 1e-6)")
    return float(eps)
