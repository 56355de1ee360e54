"""Validation of ``gated_delta_rule`` and ``gated_delta_rule_step`` arguments.

Only shapes, dtypes and static Python values are inspected (plus the values of a concrete
``cu_seqlens``), so the checks run on tracers and ``jax.ShapeDtypeStruct`` alike. Every problem is
a ``ValueError`` naming the argument, what it got and what it needs.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np

from ejk.ops._check_arrays import concrete, dtype_of, require_array, require_floating, require_integer, shape_of
from ejk.ops._check_common import dtype_name, is_real

__all__ = ["check_cu_seqlens_values", "check_flag", "check_gated_delta_rule_args", "check_gated_delta_rule_values",
           "check_step_args", "resolve_scale"]

_OP = "gated_delta_rule"


def _fail(op: str, message: str) -> NoReturn:
    raise ValueError(f"{op}: {message}")


def resolve_scale(op: str, scale: Any, head_dim: int) -> float:
    """``None`` means ``head_dim ** -0.5``; otherwise a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if not is_real(scale) or not math.isfinite(float(scale)):
        _fail(op, f"scale is {scale!r} but needs a finite number or None (K ** -0.5)")
    return float(scale)


def check_flag(op: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        _fail(op, f"{name} is {value!r} but needs True or False")
    return bool(value)


def _ranked(op: str, name: str, x: Any, ndim: int, needs: str) -> tuple[int, ...]:
    require_array(op, name, x, needs)
    shape = tuple(int(d) for d in shape_of(x))
    if len(shape) != ndim:
        _fail(op, f"{name} has shape {shape} but needs {needs} ({ndim} dimensions)")
    return shape


def _check_inputs(op: str, q: Any, k: Any, v: Any, g: Any, beta: Any, lead: str) -> tuple[int, ...]:
    """Shapes and dtypes of ``q, k, v, g, beta``; returns ``q``'s shape."""
    nd = len(lead.split(", ")) + 2
    qs = _ranked(op, "q", q, nd, f"[{lead}, H, K]")
    *head, heads, dk = qs
    where = ", ".join(f"{n}={s}" for n, s in zip(lead.split(", "), head, strict=True))
    if dk < 1:
        _fail(op, f"q has shape {qs} but needs K >= 1 (its last dimension)")
    ks = _ranked(op, "k", k, nd, f"[{where}, H={heads}, K={dk}]")
    if ks != qs:
        _fail(op, f"k has shape {ks} but needs q's shape {qs}")
    vs = _ranked(op, "v", v, nd, f"[{where}, H={heads}, V]")
    if vs[:-1] != qs[:-1] or vs[-1] < 1:
        _fail(op, f"v has shape {vs} but needs [{where}, H={heads}, V] with V >= 1 (q has shape {qs})")
    for name, x in (("g", g), ("beta", beta)):
        xs = _ranked(op, name, x, nd - 1, f"[{where}, H={heads}]")
        if xs != qs[:-1]:
            _fail(op, f"{name} has shape {xs} but needs [{where}, H={heads}] (q has shape {qs})")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        require_floating(op, name, x)
    dtypes = tuple(dtype_name(dtype_of(x)) for x in (q, k, v))
    if len(set(dtypes)) != 1:
        _fail(op, f"q, k, v have dtypes {dtypes} but need one common dtype (cast k and v to q.dtype)")
    return qs


def _check_cu_seqlens(cu_seqlens: Any, batch: int, length: int) -> int:
    """The number of sequences ``N`` of ``cu_seqlens [N + 1]``; its values when concrete."""
    cs = _ranked(_OP, "cu_seqlens", cu_seqlens, 1, "[N + 1] int32")
    require_integer(_OP, "cu_seqlens", cu_seqlens)
    if cs[0] < 1:
        _fail(_OP, "cu_seqlens has shape (0,) but needs [N + 1] with N >= 0 (at least the leading 0)")
    if batch != 1:
        _fail(_OP, f"cu_seqlens is given but q has batch {batch}; packed sequences need batch 1: "
                   "concatenate them along T into [1, total, H, K]")
    check_cu_seqlens_values(cu_seqlens, length)
    return cs[0] - 1


def check_gated_delta_rule_values(q: Any, *_: Any, cu_seqlens: Any = None, **__: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): ``cu_seqlens``."""
    if cu_seqlens is not None:
        check_cu_seqlens_values(cu_seqlens, int(shape_of(q)[1]))


def check_cu_seqlens_values(cu_seqlens: Any, length: int) -> None:
    """Where ``cu_seqlens`` is concrete: from 0 to ``T = length``, never decreasing."""
    values = concrete(cu_seqlens)
    if values is not None:
        if int(values[0]) != 0 or int(values[-1]) != length:
            _fail(_OP, f"cu_seqlens is {values.tolist()!r:.80} but needs to start at 0 and end at T={length}")
        steps = np.diff(values.astype(np.int64))
        if (steps < 0).any():
            bad = int(np.argmax(steps < 0))
            _fail(_OP, f"cu_seqlens decreases at [{bad + 1}] ({int(values[bad])} -> {int(values[bad + 1])}); "
                       "it needs non-decreasing offsets (an empty sequence repeats its offset)")


def check_gated_delta_rule_args(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, cu_seqlens: Any,
                                scale: Any) -> float:
    """Validate the arguments of ``gated_delta_rule``; returns the resolved scale.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    qs = _check_inputs(_OP, q, k, v, g, beta, "B, T")
    batch, length, heads, dk = qs
    dv = int(shape_of(v)[-1])
    sequences = batch if cu_seqlens is None else _check_cu_seqlens(cu_seqlens, batch, length)
    if initial_state is not None:
        needs = f"[N={sequences}, H={heads}, K={dk}, V={dv}]"
        ss = _ranked(_OP, "initial_state", initial_state, 4, needs)
        if ss != (sequences, heads, dk, dv):
            what = "one state per batch row" if cu_seqlens is None else "one state per packed sequence"
            _fail(_OP, f"initial_state has shape {ss} but needs {needs} ({what})")
        require_floating(_OP, "initial_state", initial_state)
    return resolve_scale(_OP, scale, dk)


def check_step_args(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, scale: Any) -> float:
    """Validate the arguments of ``gated_delta_rule_step``; returns the resolved scale."""
    op = "gated_delta_rule_step"
    qs = _check_inputs(op, q, k, v, g, beta, "B")
    batch, heads, dk = qs
    dv = int(shape_of(v)[-1])
    needs = f"[B={batch}, H={heads}, K={dk}, V={dv}]"
    ss = _ranked(op, "state", state, 4, needs)
    if ss != (batch, heads, dk, dv):
        _fail(op, f"state has shape {ss} but needs {needs}")
    require_floating(op, "state", state)
    return resolve_scale(op, scale, dk)
