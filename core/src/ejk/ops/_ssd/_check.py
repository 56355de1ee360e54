"""Validation of ``ssd`` arguments."""

from __future__ import annotations

from typing import Any

from ejk.ops._check_arrays import require_array, require_floating, require_ndim, shape_of
from ejk.ops._gla._check import check_cu_seqlens, check_packed_values, check_state

__all__ = ["check_ssd_args", "check_ssd_step_args", "check_ssd_values"]


def check_ssd_values(x: Any, *_: Any, cu_seqlens: Any = None, **__: Any) -> None:
    """``ssd``'s value checks of a call already validated once (the eager fast path)."""
    check_packed_values("ssd", x, cu_seqlens)


def _check_shared(op: str, lead: tuple[str, ...], x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any,  # noqa: N803
                  dt_bias: Any, dt_softplus: Any) -> tuple[int, int, int, int]:
    """The checks ``ssd`` and ``ssd_step`` share, with ``lead`` the leading dimensions (``b, T`` or ``b``):
    ``x [*lead, H, P]``, ``dt [*lead, H]``, ``B`` and ``C [*lead, G, N]`` with ``G`` dividing ``H``, ``A``,
    ``D``, ``dt_bias [H]``, floating dtypes, a bool ``dt_softplus``. Returns ``(b, H, P, N)``."""
    names, rank = ", ".join(lead), len(lead)
    *head, h, p = require_ndim(op, "x", x, rank + 2, f"[{names}, H, P]")
    got = require_ndim(op, "dt", dt, rank + 1, f"[{names}, H] = {(*head, h)}")
    if got != (*head, h):
        raise ValueError(f"{op}: dt has shape {got} but needs [{names}, H] = {(*head, h)} (x's leading dimensions "
                         "and heads)")
    where = ", ".join(str(d) for d in head)
    bshape = require_ndim(op, "B", B, rank + 2, f"[{names}, G, N] = [{where}, G, N]")
    if tuple(bshape[:rank]) != tuple(head):
        raise ValueError(f"{op}: B has shape {bshape} but needs [{names}, G, N] = [{where}, G, N] (x's {names})")
    groups, n = bshape[rank], bshape[rank + 1]
    if groups == 0 or h % groups:
        raise ValueError(f"{op}: B has {groups} groups but needs a number of groups G that divides the H={h} heads "
                         "(head h reads group h // (H // G))")
    cshape = require_ndim(op, "C", C, rank + 2, f"[{names}, G, N] = {bshape}")
    if cshape != bshape:
        raise ValueError(f"{op}: C has shape {cshape} but needs B's shape [{names}, G, N] = {bshape}")
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
    return head[0], h, p, n


def check_ssd_args(x: Any, dt: Any, A: Any, B: Any, C: Any, *, D: Any, dt_bias: Any, dt_softplus: Any,  # noqa: N803
                   initial_state: Any, cu_seqlens: Any) -> None:
    """Validate ``ssd``'s arguments.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    b, h, p, n = _check_shared("ssd", ("b", "T"), x, dt, A, B, C, D, dt_bias, dt_softplus)
    states = check_cu_seqlens("ssd", cu_seqlens, b, int(shape_of(x)[1]))
    check_state("ssd", "initial_state", initial_state, (states, h, p, n),
                "[N, H, P, N_state] (N = b, or the number of sequences with cu_seqlens)")


def check_ssd_step_args(x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, *, D: Any,  # noqa: N803
                        dt_bias: Any, dt_softplus: Any) -> None:
    """Validate ``ssd_step``'s arguments (one token per batch row).

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "ssd_step"
    needs = _check_shared(op, ("b",), x, dt, A, B, C, D, dt_bias, dt_softplus)
    got = require_ndim(op, "state", state, 4, f"[b, H, P, N] = {needs}")
    if got != needs:
        raise ValueError(f"{op}: state has shape {got} but needs [b, H, P, N] = {needs}")
    require_floating(op, "state", state)
