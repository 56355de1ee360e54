"""Validation of ``gla`` arguments, and the checks of packed sequences and recurrent states that
``ssd`` shares."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ejk.ops._check_arrays import concrete, listed, require_floating, require_integer, require_ndim, shape_of
from ejk.ops._check_common import is_real

__all__ = ["check_cu_seqlens", "check_gla_args", "check_gla_step_args", "check_gla_values", "check_offsets_values",
           "check_packed_values", "check_state", "linear_scale"]


def linear_scale(op: str, value: Any, head_dim: int) -> float:
    """``None`` (then ``head_dim ** -0.5``) or a finite number > 0.

    Raises:
        ValueError: ``"<op>: scale is <value> but needs a finite number > 0 or None …"``.
    """
    if value is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if not is_real(value) or not (0 < float(value) < math.inf):
        raise ValueError(f"{op}: scale is {value!r} but needs a finite number > 0 or None (K ** -0.5); "
                         "flip the sign of q instead of the scale")
    return float(value)


def check_cu_seqlens(op: str, cu_seqlens: Any, batch: int, tokens: int) -> int:
    """Check ``cu_seqlens`` (``[N+1]`` int offsets of packed sequences, batch 1); returns the number of
    states the op reads and writes: ``N`` with ``cu_seqlens``, else ``batch``.

    Values are checked where they are concrete (outside ``jit``): ``cu_seqlens[0] == 0``,
    non-decreasing, ``cu_seqlens[-1] == T``.

    Raises:
        ValueError: naming ``cu_seqlens`` (or the batch size it needs) and the fix.
    """
    if cu_seqlens is None:
        return batch
    shape = require_ndim(op, "cu_seqlens", cu_seqlens, 1, "[N+1] int32: the offsets of N packed sequences")
    require_integer(op, "cu_seqlens", cu_seqlens)
    if shape[0] < 2:
        raise ValueError(f"{op}: cu_seqlens has shape {shape} but needs [N+1] with N >= 1 sequences "
                         f"(e.g. [0, T] for one sequence of T={tokens} tokens)")
    if batch != 1:
        raise ValueError(f"{op}: cu_seqlens packs sequences along the tokens of batch row 0, but the batch size is "
                         f"{batch}: concatenate the sequences into shape [1, total_tokens, ...]")
    check_offsets_values(op, cu_seqlens, tokens)
    return int(shape[0]) - 1


def check_packed_values(op: str, tokens_of: Any, cu_seqlens: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): a given ``cu_seqlens``
    against the tokens (dimension 1) of ``tokens_of``."""
    if cu_seqlens is not None:
        check_offsets_values(op, cu_seqlens, int(shape_of(tokens_of)[1]))


def check_gla_values(q: Any, *_: Any, cu_seqlens: Any = None, **__: Any) -> None:
    """``gla``'s value checks of a call already validated once (the eager fast path)."""
    check_packed_values("gla", q, cu_seqlens)


def check_offsets_values(op: str, cu_seqlens: Any, tokens: int) -> None:
    """Where ``cu_seqlens`` is concrete: from 0 to ``T = tokens``, never decreasing."""
    values = concrete(cu_seqlens)
    if values is not None:
        values = values.astype(np.int64)
        if values[0] != 0 or values[-1] != tokens:
            raise ValueError(f"{op}: cu_seqlens is [{values[0]}, ..., {values[-1]}] but must start at 0 and end at "
                             f"T={tokens} (the number of packed tokens)")
        bad = np.flatnonzero(np.diff(values) < 0)
        if bad.size:
            raise ValueError(f"{op}: cu_seqlens must be non-decreasing (sequence lengths >= 0), but it decreases "
                             f"after {listed(bad, values[bad])}")


def check_state(op: str, name: str, state: Any, needs: tuple[int, ...], what: str) -> None:
    """``None`` or a floating ``state`` of shape ``needs`` (``what`` names the dimensions)."""
    if state is None:
        return
    got = require_ndim(op, name, state, len(needs), what)
    if got != needs:
        raise ValueError(f"{op}: {name} has shape {got} but needs {what} = {needs} (one state per batch row, or "
                         "per packed sequence with cu_seqlens)")
    require_floating(op, name, state)


def check_gla_args(q: Any, k: Any, v: Any, g: Any, *, scale: Any, initial_state: Any, cu_seqlens: Any) -> float:
    """Validate ``gla``'s arguments; returns the resolved scale.

    Raises:
        ValueError: naming the argument, its shape, dtype or value, and what it needs.
    """
    op = "gla"
    b, t, h, dk = require_ndim(op, "q", q, 4, "[B, T, H, K]")
    for name, x in (("k", k), ("g", g)):
        got = require_ndim(op, name, x, 4, f"[B, T, H, K] = {(b, t, h, dk)}")
        if got != (b, t, h, dk):
            raise ValueError(f"{op}: {name} has shape {got} but needs q's shape [B, T, H, K] = {(b, t, h, dk)}")
    vshape = require_ndim(op, "v", v, 4, f"[B, T, H, V] = [{b}, {t}, {h}, V]")
    if vshape[:3] != (b, t, h):
        raise ValueError(f"{op}: v has shape {vshape} but needs [B, T, H, V] = [{b}, {t}, {h}, V] (q's B, T, H)")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        require_floating(op, name, x)
    dtypes = {np.dtype(x.dtype).name for x in (q, k, v)}
    if len(dtypes) > 1:
        raise ValueError(f"{op}: q, k and v have dtypes {np.dtype(q.dtype).name}, {np.dtype(k.dtype).name}, "
                         f"{np.dtype(v.dtype).name} but need one dtype: cast them alike (g may be float32)")
    states = check_cu_seqlens(op, cu_seqlens, b, t)
    check_state(op, "initial_state", initial_state, (states, h, dk, vshape[3]),
                "[N, H, K, V] (N = B, or the number of sequences with cu_seqlens)")
    return linear_scale(op, scale, dk)


def check_gla_step_args(q: Any, k: Any, v: Any, g: Any, state: Any, scale: Any) -> float:
    """Validate ``gla_step``'s arguments (one token per batch row); returns the resolved scale.

    Raises:
        ValueError: naming the argument, its shape or dtype, and what it needs.
    """
    op = "gla_step"
    b, h, dk = require_ndim(op, "q", q, 3, "[B, H, K]")
    for name, x in (("k", k), ("g", g)):
        got = require_ndim(op, name, x, 3, f"[B, H, K] = {(b, h, dk)}")
        if got != (b, h, dk):
            raise ValueError(f"{op}: {name} has shape {got} but needs q's shape [B, H, K] = {(b, h, dk)}")
    vshape = require_ndim(op, "v", v, 3, f"[B, H, V] = [{b}, {h}, V]")
    if vshape[:2] != (b, h):
        raise ValueError(f"{op}: v has shape {vshape} but needs [B, H, V] = [{b}, {h}, V] (q's B, H)")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        require_floating(op, name, x)
    needs = (b, h, dk, vshape[2])
    got = require_ndim(op, "state", state, 4, f"[B, H, K, V] = {needs}")
    if got != needs:
        raise ValueError(f"{op}: state has shape {got} but needs [B, H, K, V] = {needs}")
    require_floating(op, "state", state)
    return linear_scale(op, scale, dk)


def state_count(cu_seqlens: Any, batch: int) -> int:
    """How many states a call reads and writes: ``N`` with ``cu_seqlens [N+1]``, else the batch size."""
    return batch if cu_seqlens is None else int(shape_of(cu_seqlens)[0]) - 1
