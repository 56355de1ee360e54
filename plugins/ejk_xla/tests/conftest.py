"""ejk-xla's test fixtures: ``emulated``, a CPU stand-in for jax's packed cuDNN attention."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import custom_batching

from ejk_xla import _cudnn_packed


def _owners(segments: Any, q_tokens: int, k_tokens: int) -> tuple[jax.Array, ...]:
    """Per query row and per key of one batch row: its segment (``-1``: none) and its place in it."""
    q_len, k_len, q_off, k_off = segments
    m = q_len.shape[0]
    q_off, k_off = q_off[:m], k_off[:m]
    on = (q_len >= 0) & (k_len >= 0)

    def owner(pos: jax.Array, off: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
        inside = on[None, :] & (pos[:, None] >= off[None, :]) & (pos[:, None] < (off + n)[None, :])
        seg = jnp.where(inside.any(1), jnp.argmax(inside, axis=1), -1)
        return seg, pos - off[jnp.clip(seg, 0, m - 1)]

    return (*owner(jnp.arange(q_tokens), q_off, q_len), *owner(jnp.arange(k_tokens), k_off, k_len))


def _unwritten(x: jax.Array, segment: jax.Array) -> jax.Array:
    """``x`` with the rows outside every segment NaN: cuDNN leaves them unwritten (seen on an H100)."""
    return jnp.where((segment >= 0)[:, None, None], x, jnp.nan)


def _emulated_row(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, *, scale: float, masked: bool,
                  window_length: int | None) -> tuple[jax.Array, jax.Array]:
    """One batch row of what jax's packed cuDNN call computes: segments from the non-negative entries,
    top-left causal masks and windows per segment, rows outside every segment left unwritten (NaN
    here). ``q`` ``[T, H, D]``, ``segments`` one row of each array."""
    q_seg, r, k_seg, p = _owners(segments, q.shape[0], k.shape[0])
    mask = (q_seg[:, None] == k_seg[None, :]) & (q_seg[:, None] >= 0)
    if masked:
        mask &= p[None, :] <= r[:, None]
    if window_length is not None:
        mask &= r[:, None] - p[None, :] < window_length
    s = jnp.einsum("qhd,khd->hqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    top = jax.lax.stop_gradient(jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.where(mask, jnp.exp(jnp.where(mask, s, top) - top), 0.0)
    total = jnp.sum(w, axis=-1, keepdims=True)
    out = jnp.einsum("hqk,khd->qhd", w / jnp.where(total > 0, total, 1.0), v.astype(jnp.float32))
    return _unwritten(out, q_seg).astype(q.dtype), (top + jnp.log(jnp.where(total > 0, total, 1.0)))[..., 0]


def _emulated_forward(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, **options: Any) -> Any:
    return jax.vmap(partial(_emulated_row, **options))(q, k, v, segments)


def _unbatchable(f: Any) -> Any:
    """``f`` refusing ``jax.vmap``, as jax's batching rule of its cuDNN call must never see ejk's segments."""
    g = custom_batching.custom_vmap(f)

    @g.def_vmap
    def _rule(axis_size: int, in_batched: Any, *args: Any) -> Any:
        raise AssertionError("the packed cuDNN call was batched: ejk must loop over a vmapped axis")

    return g


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _emulated_vjp(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, scale: float, masked: bool,
                  window_length: int | None) -> jax.Array:
    options = {"scale": scale, "masked": masked, "window_length": window_length}
    return _unbatchable(lambda *a: _emulated_forward(*a, **options)[0])(q, k, v, segments)


def _emulated_fwd(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, scale: float, masked: bool,
                  window_length: int | None) -> tuple[jax.Array, Any]:
    options = {"scale": scale, "masked": masked, "window_length": window_length}
    out, stats = _unbatchable(lambda *a: _emulated_forward(*a, **options))(q, k, v, segments)
    return out, (q, k, v, segments, stats, out)  # cuDNN's residuals: the inputs, the statistics, the output


def _emulated_bwd(scale: float, masked: bool, window_length: int | None, residuals: Any,
                  d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, segments, _, _ = residuals
    options = {"scale": scale, "masked": masked, "window_length": window_length}

    def grads(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, d_out: jax.Array) -> Any:
        inside = jax.vmap(lambda seg: _owners(seg, q.shape[1], k.shape[1]))(segments)
        q_seg, k_seg = inside[0], inside[2]
        d_out = jnp.where((q_seg >= 0)[..., None, None], d_out, 0)  # the NaN rows of the output have no say
        dq, dk, dv = jax.vjp(lambda a, b, c: jnp.nan_to_num(_emulated_forward(a, b, c, segments, **options)[0]),
                             q, k, v)[1](d_out)
        return (jax.vmap(_unwritten)(dq, q_seg), jax.vmap(_unwritten)(dk, k_seg), jax.vmap(_unwritten)(dv, k_seg))

    return (*_unbatchable(grads)(q, k, v, segments, d_out), None)


_emulated_vjp.defvjp(_emulated_fwd, _emulated_bwd)


def emulated_packed_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: Any, *, scale: float,
                              masked: bool, window_length: int | None) -> jax.Array:
    """A CPU stand-in for :func:`ejk_xla._cudnn_packed.packed_attention`: cuDNN-like residuals, and an
    error where jax's own batching rule would batch the call."""
    return _emulated_vjp(q, k, v, segments, scale, masked, window_length)


@pytest.fixture
def emulated() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cudnn_packed, "_packed_attention", emulated_packed_attention)
        yield
