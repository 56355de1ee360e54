"""Validation of ``ssd`` arguments."""

from __future__ import annotations

from typing import Any

from ejk.ops._check_arrays import require_array, require_floating, require_ndim, shape_of
from ejk.ops._gla._check import check_cu_seqlens, check_packed_values, check_state

__all__ = ["check_ssd_args", "check_ssd_values"]


def check_ssd_values(x: Any, *_: Any, cu_seqlens: Any = None, **__: Any) -> None:
    """``ssd``'s value checks of a call already validated once (the eager fast path)."""
    check_packed_values("ssd", x, cu_seqlens)


def check_ssd_args(x: Any, dt: Any, A: Any, B: Any, C: Any, *, D: Any, dt_bias: Any, dt_softplus: Any,  # noqa: N803
                   initial_state: Any, cu_seqlens: Any) -> None:
    """Validate ``ssd``'s arguments.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "ssd"
    b, t, h, p = require_ndim(op, "x", x, 4, "[b, T, H, P]")
    got = require_ndim(op, "dt", dt, 3, f"[b, T, H] = {(b, t, h)}")
    if got != (b, t, h):
        raise ValueError(f"{op}: dt has shape {got} but needs [b, T, H] = {(b, t, h)} (x's first three dimensions)")
    bshape = require_ndim(op, "B", B, 4, f"[b, T, G, N] = [{b}, {t}, G, N]")
    if bshape[:2] != (b, t):
        raise ValueError(f"{op}: B has shape {bshape} but needs [b, T, G, N] = [{b}, {t}, G, N] (x's b and T)")
    groups, n = bshape[2], bshape[3]
    if groups == 0 or h % groups:
        raise ValueError(f"{op}: B has {groups} groups but needs a number of groups G that divides the H={h} heads "
                         "(head h reads group h // (H // G))")
    cshape = require_ndim(op, "C", C, 4, f"[b, T, G, N] = {bshape}")
    if cshape != bshape:
        raise ValueError(f"{op}: C has shape {cshape} but needs B's shape [b, T, G, N] = {bshape}")
    for name, vec in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if vec is None and name != "A":
            continue
        require_array(op, name, vec, f"[H] = [{h}]")
        if shape_of(vec) != (h,):
            raise ValueError(f"{op}: {name} has shape {shape_of(vec)} but needs [H] = [{h}] (one value per head)")
    for name, arr in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias)):
        if arr is not None:
            require_floating(op, name, arr)
    if not isinstance(dt_softplus, bool):
        raise ValueError(f"{op}: dt_softplus is {dt_softplus!r} but needs a bool")
    states = check_cu_seqlens(op, cu_seqlens, b, t)
    check_state(op, "initial_state", initial_state, (states, h, p, n),
                "[N, H, P, N_state] (N = b, or the number of sequences with cu_seqlens)")
