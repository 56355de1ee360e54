"""Validation and normalisation of ``flash_attention`` arguments.

Only shapes, dtypes and static Python values are inspected, so the checks run on tracers
and ``jax.ShapeDtypeStruct`` alike. Every problem is a ``ValueError`` that names the
argument, what it got and what it needs.
"""

from __future__ import annotations

from typing import Any, NoReturn

import jax.numpy as jnp
import numpy as np

from ejk.ops._check_common import dtype_name, float_dtype_problem, normalize_window, optional_positive
from ejk.ops._check_common import softmax_scale as resolve_scale

__all__ = ["check_flash_attention_args", "check_sinks"]

_OP = "flash_attention"


def _fail(message: str) -> NoReturn:
    raise ValueError(f"{_OP}: {message}")


def _shape_of(name: str, x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        _fail(f"{name} must be an array with .shape and .dtype, got {type(x).__name__}")
    return tuple(int(d) for d in shape)


def _dtype_name(x: Any) -> str:
    return dtype_name(x.dtype)


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    """Ranks, batch / head / head-dim agreement, GQA divisibility and float dtypes."""
    qs, ks, vs = _shape_of("q", q), _shape_of("k", k), _shape_of("v", v)
    if len(qs) != 4:
        _fail(f"q has shape {qs} but needs rank 4 [batch, seq_q, q_heads, head_dim]")
    batch, _, q_heads, head_dim = qs
    k_needs = f"[batch={batch}, seq_k, kv_heads, head_dim={head_dim}]"
    if len(ks) != 4:
        _fail(f"k has shape {ks} but needs rank 4 {k_needs}")
    if ks[0] != batch or ks[3] != head_dim:
        _fail(f"k has shape {ks} but needs {k_needs} (batch and head_dim of q {qs})")
    if ks[2] == 0 or q_heads % ks[2] != 0:
        _fail(
            f"k has shape {ks} but needs {k_needs}; q heads ({q_heads}) must be a multiple "
            f"of kv heads ({ks[2]})"
        )
    v_needs = f"[batch={batch}, seq_k={ks[1]}, kv_heads={ks[2]}, v_head_dim]"
    if len(vs) != 4:
        _fail(f"v has shape {vs} but needs rank 4 {v_needs}")
    if vs[:3] != ks[:3]:
        _fail(f"v has shape {vs} but needs {v_needs} (batch, seq and heads of k {ks})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        needs = float_dtype_problem(x.dtype)
        if needs is not None:
            _fail(f"{name} has dtype {_dtype_name(x)} but needs {needs}")
    dtypes = (_dtype_name(q), _dtype_name(k), _dtype_name(v))
    if len(set(dtypes)) != 1:
        _fail(f"q, k, v have dtypes {dtypes} but need one common dtype (cast k and v to q.dtype)")


def _check_segment_ids(q_segment_ids: Any, kv_segment_ids: Any, batch: int, q_len: int, kv_len: int) -> None:
    if (q_segment_ids is None) != (kv_segment_ids is None):
        given = "q_segment_ids" if q_segment_ids is not None else "kv_segment_ids"
        _fail(f"{given} was given alone; pass both q_segment_ids and kv_segment_ids or neither")
    if q_segment_ids is None:
        return
    for name, ids, needs in (
        ("q_segment_ids", q_segment_ids, (batch, q_len)),
        ("kv_segment_ids", kv_segment_ids, (batch, kv_len)),
    ):
        shape = _shape_of(name, ids)
        if shape != needs:
            _fail(f"{name} has shape {shape} but needs [batch, seq] = {needs}")
        if not np.issubdtype(np.dtype(ids.dtype), np.integer):
            _fail(f"{name} has dtype {_dtype_name(ids)} but needs an integer dtype (int32)")


def _check_bias(bias: Any, full: tuple[int, int, int, int]) -> None:
    if bias is None:
        return
    shape = _shape_of("bias", bias)
    needs = f"rank 4, broadcastable to [batch, q_heads, seq_q, seq_k] = {full} (each dim 1 or full)"
    if len(shape) != 4 or any(d not in (1, f) for d, f in zip(shape, full, strict=True)):
        _fail(f"bias has shape {shape} but needs {needs}")
    if not jnp.issubdtype(bias.dtype, jnp.floating):  # numpy alone does not know bfloat16
        _fail(f"bias has dtype {_dtype_name(bias)} but needs a floating dtype")


def check_sinks(op: str, sinks: Any, q_heads: int) -> None:
    """``sinks``: ``None`` or a float array ``[Hq]`` (one logit per query head).

    Raises:
        ValueError: ``"<op>: sinks has shape … but needs …"`` (or dtype).
    """
    if sinks is None:
        return
    shape = getattr(sinks, "shape", None)
    if shape is None or not hasattr(sinks, "dtype"):
        raise ValueError(f"{op}: sinks must be an array with .shape and .dtype, got {type(sinks).__name__}")
    if tuple(int(d) for d in shape) != (q_heads,):
        raise ValueError(f"{op}: sinks has shape {tuple(shape)} but needs [q_heads] = ({q_heads},): one sink "
                         "logit per query head")
    if not jnp.issubdtype(sinks.dtype, jnp.floating):
        raise ValueError(f"{op}: sinks has dtype {_dtype_name(sinks)} but needs a floating dtype (it is computed "
                         "in float32)")


def check_flash_attention_args(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    softmax_scale: float | None,
    sliding_window: int | tuple[int, int] | None,
    logits_soft_cap: float | None,
    q_segment_ids: Any,
    kv_segment_ids: Any,
    bias: Any,
    sinks: Any = None,
) -> tuple[float, tuple[int, int] | None]:
    """Validates user-level ``flash_attention`` arguments and normalises the static ones.

    Args:
        q: ``[B, Sq, Hq, D]`` (bfloat16, float16 or float32).
        k: ``[B, Sk, Hkv, D]`` with ``Hq % Hkv == 0``, same dtype as ``q``.
        v: ``[B, Sk, Hkv, Dv]``, same dtype as ``q``.
        causal: Must be a bool.
        softmax_scale: ``None`` or a finite number > 0 (the rule of every op).
        sliding_window: ``None``, an int ``w`` or ``(left, right)``; non-negative ints. With
            ``causal=True`` the right side is dropped; each side is clamped to the sequence
            lengths (``left <= Sk - 1``, ``right <= Sq - 1``), which changes nothing visible.
        logits_soft_cap: ``None`` or a finite number > 0.
        q_segment_ids: ``None`` or ``[B, Sq]`` integers; given together with ``kv_segment_ids``.
        kv_segment_ids: ``None`` or ``[B, Sk]`` integers.
        bias: ``None`` or a rank-4 float array broadcastable to ``[B, Hq, Sq, Sk]``.
        sinks: ``None`` or a float array ``[Hq]``.

    Returns:
        ``(softmax_scale, sliding_window)``: the scale resolved (``1/sqrt(D)`` for ``None``)
        and the window as ``(left, right)`` (right is 0 when causal; both clamped to the
        sequence lengths) or ``None``.

    Raises:
        ValueError: Naming the argument, the shape / dtype / value it got and what it needs.
    """
    _check_qkv(q, k, v)
    batch, q_len, q_heads, head_dim = (int(d) for d in q.shape)
    kv_len = int(k.shape[1])
    if not isinstance(causal, bool | np.bool_):
        _fail(f"causal is {causal!r} but needs a bool")
    _check_segment_ids(q_segment_ids, kv_segment_ids, batch, q_len, kv_len)
    _check_bias(bias, (batch, q_heads, q_len, kv_len))
    check_sinks(_OP, sinks, q_heads)
    optional_positive(_OP, "logits_soft_cap", logits_soft_cap)
    window = normalize_window(_OP, "sliding_window", sliding_window, causal=bool(causal),
                              max_left=kv_len - 1, max_right=q_len - 1)
    return resolve_scale(_OP, softmax_scale, head_dim), window
