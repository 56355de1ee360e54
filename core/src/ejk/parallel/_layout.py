"""Sequence layouts of ring attention: which global positions each device holds.

A sequence of length ``S`` sharded over ``n`` devices is split into equal local blocks of
``c = S / n`` rows. The layout says which positions a local block holds:

- ``"contiguous"``: device ``d`` holds ``d·c … (d+1)·c - 1`` (the plain split).
- ``"zigzag"``: the sequence is cut into ``2n`` chunks; device ``d`` holds chunks ``d`` and
  ``2n-1-d``, so under a causal mask every device has the same amount of work.
- ``"striped"``: device ``d`` holds positions ``d, d+n, d+2n, …`` (also balanced).

:func:`to_layout` permutes a global sequence so that sharding it contiguously gives the
layout; :func:`from_layout` undoes it.
"""

from __future__ import annotations

from typing import Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["LAYOUTS", "Layout", "Piece", "from_layout", "layout_positions", "local_pieces", "to_layout"]

Layout = Literal["contiguous", "zigzag", "striped"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag", "striped")


@attrs.frozen
class Piece:
    """Local rows ``offset … offset+length-1`` hold global positions ``start + stride·i``."""

    offset: int
    length: int
    start: int
    stride: int


def check_layout(layout: str, local_len: int, *, name: str) -> str:
    """Validate ``layout=`` against a local length.

    Raises:
        ValueError: for an unknown layout, or ``"zigzag"`` with an odd local length.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"ring_attention: layout is {layout!r} but needs one of {', '.join(map(repr, LAYOUTS))}")
    if layout == "zigzag" and local_len % 2:
        raise ValueError(f"ring_attention: layout='zigzag' needs an even local length of {name}, got {local_len}; "
                         "pad the sequence to a multiple of 2 × the number of devices")
    return layout


def local_pieces(layout: str, device: int, num_shards: int, local_len: int) -> tuple[Piece, ...]:
    """The pieces of the local block of ``device`` (static Python ints)."""
    if layout == "contiguous":
        return (Piece(0, local_len, device * local_len, 1),)
    if layout == "zigzag":
        half = local_len // 2
        return (Piece(0, half, device * half, 1), Piece(half, half, (2 * num_shards - 1 - device) * half, 1))
    if layout == "striped":
        return (Piece(0, local_len, device, num_shards),)
    raise ValueError(f"unknown layout {layout!r}")


def layout_positions(layout: Layout | str, seq_len: int, num_shards: int) -> np.ndarray:
    """Global position of each row of a sequence in ``layout`` (a permutation of ``range(seq_len)``).

    Raises:
        ValueError: when ``seq_len`` does not split evenly (zigzag: into ``2 · num_shards`` chunks).
    """
    if num_shards < 1 or seq_len % num_shards:
        raise ValueError(f"sequence length {seq_len} must be a multiple of the number of shards {num_shards}")
    local_len = seq_len // num_shards
    check_layout(str(layout), local_len, name="the sequence")
    rows = []
    for device in range(num_shards):
        for piece in local_pieces(str(layout), device, num_shards, local_len):
            rows.append(piece.start + piece.stride * np.arange(piece.length))
    positions: np.ndarray = np.concatenate(rows).astype(np.int32)
    return positions


def _axis(x: jax.Array, axis: int) -> int:
    """``axis`` of ``x``, checked (negative counts from the end)."""
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis!r} is not an axis of an array of {x.ndim} dimensions "
                         f"(shape {tuple(x.shape)}); pass the sequence axis, e.g. axis=1")
    return int(axis)


def to_layout(x: jax.Array, layout: Layout | str, num_shards: int, *, axis: int = 1) -> jax.Array:
    """Permute the sequence ``axis`` of ``x`` (positions in order) into ``layout``.

    Sharding the result contiguously over ``num_shards`` devices gives each device its rows of
    the layout; e.g. ``q``, ``k``, ``v`` (axis 1) and segment ids ``[B, S]`` (axis 1).
    """
    positions = layout_positions(layout, x.shape[_axis(x, axis)], num_shards)
    return jnp.take(x, jnp.asarray(positions), axis=axis)


def from_layout(x: jax.Array, layout: Layout | str, num_shards: int, *, axis: int = 1) -> jax.Array:
    """Inverse of :func:`to_layout`: back to positions in order."""
    positions = layout_positions(layout, x.shape[_axis(x, axis)], num_shards)
    return jnp.take(x, jnp.asarray(np.argsort(positions)), axis=axis)
