"""Validation and normalisation of ``flash_attention_varlen`` arguments.

Shapes, dtypes and static values are always checked (tracers and ``jax.ShapeDtypeStruct`` too);
the offsets' values are checked where they are concrete. Every problem is a ``ValueError``
naming the argument, what it got and what it needs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ejk.ops._check_arrays import concrete, require_floating, require_integer, require_ndim, shape_of
from ejk.ops._check_common import dtype_name, is_int, matmul_precision, normalize_window, optional_positive
from ejk.ops._check_common import softmax_scale as resolve_scale

__all__ = ["check_flash_attention_varlen_args", "check_flash_attention_varlen_values", "resolve_precision"]

_OP = "flash_attention_varlen"


def _fail(message: str) -> ValueError:
    return ValueError(f"{_OP}: {message}")


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    tq, hq, d = require_ndim(_OP, "q", q, 3, "[Tq, Hq, D]")
    tk, hkv, kd = require_ndim(_OP, "k", k, 3, f"[Tk, Hkv, D={d}]")
    if kd != d:
        raise _fail(f"k has shape {(tk, hkv, kd)} but needs [Tk, Hkv, D={d}] (the head dim of q {(tq, hq, d)})")
    if hkv == 0 or hq % hkv:
        raise _fail(f"k has shape {(tk, hkv, kd)} but needs a number of kv heads that divides the {hq} q heads")
    vs = require_ndim(_OP, "v", v, 3, f"[Tk={tk}, Hkv={hkv}, Dv]")
    if vs[:2] != (tk, hkv):
        raise _fail(f"v has shape {vs} but needs [Tk={tk}, Hkv={hkv}, Dv] (tokens and heads of k)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_floating(_OP, name, x)
    dtypes = tuple(dtype_name(x.dtype) for x in (q, k, v))
    if len(set(dtypes)) != 1:
        raise _fail(f"q, k, v have dtypes {dtypes} but need one common dtype (cast k and v to q.dtype)")


def _check_offsets(cu_q: Any, cu_k: Any, tq: int, tk: int) -> None:
    (nq,) = require_ndim(_OP, "cu_seqlens_q", cu_q, 1, "[N+1] int32 offsets")
    (nk,) = require_ndim(_OP, "cu_seqlens_k", cu_k, 1, "[N+1] int32 offsets")
    if nq < 1:
        raise _fail("cu_seqlens_q has shape (0,) but needs [N+1] with N >= 0 (at least the leading 0)")
    if nk != nq:
        raise _fail(f"cu_seqlens_k has shape ({nk},) but needs ({nq},), the shape of cu_seqlens_q "
                    "(one offset per sequence boundary, the same sequences for queries and keys)")
    for name, x in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        require_integer(_OP, name, x)
    _check_offset_values(cu_q, cu_k, tq, tk)


def _check_offset_values(cu_q: Any, cu_k: Any, tq: int, tk: int) -> None:
    """Where concrete, each offsets array starts at 0, never decreases and ends at most at its tokens."""
    for name, x, tokens, rows in (("cu_seqlens_q", cu_q, tq, "q"), ("cu_seqlens_k", cu_k, tk, "k")):
        host = concrete(x)
        if host is None:
            continue
        host = host.astype(np.int64)
        if host[0] != 0:
            raise _fail(f"{name} starts at {int(host[0])} but needs to start at 0")
        steps = np.diff(host)
        (bad,) = np.nonzero(steps < 0)
        if bad.size:
            i = int(bad[0])
            raise _fail(f"{name} decreases at [{i + 1}] ({int(host[i])} then {int(host[i + 1])}) but needs "
                        "non-decreasing offsets")
        if host[-1] > tokens:
            raise _fail(f"{name} ends at {int(host[-1])} but needs an end <= {tokens} (the rows of {rows})")


def _check_sinks(sinks: Any, hq: int) -> None:
    if sinks is None:
        return
    shape = require_ndim(_OP, "sinks", sinks, 1, f"[Hq={hq}]")
    if shape != (hq,):
        raise _fail(f"sinks has shape {shape} but needs [Hq={hq}] (one logit per query head)")
    require_floating(_OP, "sinks", sinks)


def _check_max_seqlen(name: str, value: Any, cu: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value) or value < 1:
        raise _fail(f"{name} is {value!r} but needs None or an int >= 1 (a static upper bound of the lengths)")
    host = concrete(cu)
    if host is not None and host.size > 1:
        longest = int(np.max(np.diff(host.astype(np.int64))))
        if longest > value:
            raise _fail(f"{name} is {value} but the longest sequence of the offsets has {longest} tokens; "
                        "pass a bound >= every length or None")
    return int(value)


def check_flash_attention_varlen_values(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *,
                                        max_seqlen_q: Any = None, max_seqlen_k: Any = None, **_: Any) -> None:
    """The value checks of a call already validated once (the eager fast path): the offsets, and the
    lengths they give against ``max_seqlen_q`` / ``max_seqlen_k``."""
    _check_offset_values(cu_seqlens_q, cu_seqlens_k, shape_of(q)[0], shape_of(k)[0])
    _check_max_seqlen("max_seqlen_q", max_seqlen_q, cu_seqlens_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k, cu_seqlens_k)


def resolve_precision(precision: Any, dtype: Any) -> str:
    """The products' precision as one name: the user's for float32 inputs; ``"default"`` for
    bfloat16 / float16, whose products are exact in float32 accumulation."""
    lhs, rhs = matmul_precision(_OP, precision)
    if lhs != rhs:
        raise _fail(f"precision is {precision!r} but needs one precision for every product (not a pair "
                    "that differs)")
    return lhs if dtype_name(dtype) == "float32" else "default"


def check_flash_attention_varlen_args(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, sinks: Any, causal: Any,
    softmax_scale: Any, sliding_window: Any, logits_soft_cap: Any, max_seqlen_q: Any, max_seqlen_k: Any,
    precision: Any,
) -> dict[str, Any]:
    """Validates user-level ``flash_attention_varlen`` arguments; returns the static keyword arguments.

    Returns:
        ``causal``, ``softmax_scale`` (resolved), ``sliding_window`` (``(left, right)`` clamped to
        ``(Tk - 1, Tq - 1)``, right 0 when causal, or ``None``), ``logits_soft_cap``,
        ``max_seqlen_q``, ``max_seqlen_k`` and ``precision`` (one name, see :func:`resolve_precision`).

    Raises:
        ValueError: naming the argument, what it got and what it needs.
    """
    _check_qkv(q, k, v)
    tq, hq, d = shape_of(q)
    tk = shape_of(k)[0]
    _check_offsets(cu_seqlens_q, cu_seqlens_k, tq, tk)
    _check_sinks(sinks, hq)
    if not isinstance(causal, bool | np.bool_):
        raise _fail(f"causal is {causal!r} but needs a bool")
    cap = optional_positive(_OP, "logits_soft_cap", logits_soft_cap)
    window = normalize_window(_OP, "sliding_window", sliding_window, causal=bool(causal),
                              max_left=tk - 1, max_right=tq - 1)
    return {
        "causal": bool(causal),
        "softmax_scale": resolve_scale(_OP, softmax_scale, d),
        "sliding_window": window,
        "logits_soft_cap": cap,
        "max_seqlen_q": _check_max_seqlen("max_seqlen_q", max_seqlen_q, cu_seqlens_q),
        "max_seqlen_k": _check_max_seqlen("max_seqlen_k", max_seqlen_k, cu_seqlens_k),
        "precision": resolve_precision(precision, q.dtype),
    }
