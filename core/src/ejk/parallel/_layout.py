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

import functools
import math
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

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

    ``x`` may be sharded along ``axis`` already (a ``NamedSharding``: a concrete array, or ``Explicit``
    mesh axes under ``jax.jit``): the rows then move between the devices directly (one ``ppermute``
    per round of a schedule computed once, each device sending only the rows another needs), and the
    result keeps ``x``'s sharding. Otherwise it is a gather along ``axis``.
    """
    positions = layout_positions(layout, x.shape[_axis(x, axis)], num_shards)
    return _permute(x, positions, axis)


def from_layout(x: jax.Array, layout: Layout | str, num_shards: int, *, axis: int = 1) -> jax.Array:
    """Inverse of :func:`to_layout`: back to positions in order (sharded inputs as there)."""
    positions = layout_positions(layout, x.shape[_axis(x, axis)], num_shards)
    return _permute(x, np.argsort(positions).astype(np.int32), axis)


def _permute(x: jax.Array, source: np.ndarray, axis: int) -> jax.Array:
    """``x`` with row ``i`` of ``axis`` taken from row ``source[i]``: between shards where ``axis`` is sharded."""
    found = _sequence_sharding(x, axis)
    if found is None:
        return jnp.take(x, jnp.asarray(source), axis=axis)
    mesh, spec, axes = found
    shards = math.prod(int(mesh.shape[a]) for a in axes)
    if shards == 1 or x.shape[axis] % shards:
        return jnp.take(x, jnp.asarray(source), axis=axis)
    plan = _plan(tuple(int(i) for i in source), shards)
    name = axes[0] if len(axes) == 1 else axes
    return jax.shard_map(lambda local: _run_plan(local, plan, name, axis % x.ndim), mesh=mesh,
                         in_specs=spec, out_specs=spec)(x)


def _sequence_sharding(x: jax.Array, axis: int) -> tuple[Any, Any, tuple[str, ...]] | None:
    """``(mesh, spec, mesh axes of `axis`)`` when ``x``'s sharding is known now and splits ``axis``."""
    traced = isinstance(x, jax.core.Tracer)
    try:
        sharding = jax.typeof(x).sharding if traced else getattr(x, "sharding", None)
    except Exception:
        return None
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(tuple(sharding.spec)))
    part = spec[axis % x.ndim]
    axes = (part,) if isinstance(part, str) else tuple(part or ())
    kinds = dict(zip(sharding.mesh.axis_names, sharding.mesh.axis_types, strict=True))
    allowed = (AxisType.Explicit,) if traced else (AxisType.Explicit, AxisType.Auto)
    if not axes or any(kinds.get(a) not in allowed for a in axes):
        return None
    return sharding.mesh, P(*spec), axes


@attrs.frozen
class _Plan:
    """How a permutation of a sequence sharded into ``shards`` equal blocks moves between devices.

    ``rounds``: per round, the ``(source, destination)`` device pairs of one ``ppermute`` and, per
    source device, the local rows it sends (``[shards, width]``; padded with row 0). ``gather``: per
    device, its output rows as indices into its local rows followed by each round's received rows.
    """

    rounds: tuple[tuple[tuple[tuple[int, int], ...], np.ndarray], ...]
    gather: np.ndarray


@functools.lru_cache(maxsize=64)
def _plan(source: tuple[int, ...], shards: int) -> _Plan:
    block = len(source) // shards
    moves: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (src, dst) -> [(src local row, dst local row)]
    gather = np.zeros((shards, block), np.int32)
    for out_row, in_row in enumerate(source):
        src, dst = in_row // block, out_row // block
        if src == dst:
            gather[dst, out_row % block] = in_row % block
        else:
            moves.setdefault((src, dst), []).append((in_row % block, out_row % block))
    rounds = []
    offset = block
    pending = sorted(moves, key=lambda pair: (-len(moves[pair]), pair))
    while pending:  # greedy matchings: each device sends to one and receives from one device per round
        used_src: set[int] = set()
        used_dst: set[int] = set()
        pairs = []
        for pair in pending:
            if pair[0] not in used_src and pair[1] not in used_dst:
                pairs.append(pair)
                used_src.add(pair[0])
                used_dst.add(pair[1])
        pending = [pair for pair in pending if pair not in pairs]
        width = max(len(moves[pair]) for pair in pairs)
        send = np.zeros((shards, width), np.int32)
        for src, dst in pairs:
            for i, (src_row, dst_row) in enumerate(moves[src, dst]):
                send[src, i] = src_row
                gather[dst, dst_row] = offset + i
        rounds.append((tuple(pairs), send))
        offset += width
    return _Plan(rounds=tuple(rounds), gather=gather)


def _run_plan(local: jax.Array, plan: _Plan, name: Any, axis: int) -> jax.Array:
    """One device's part of :func:`_permute` (inside ``shard_map``)."""
    device = jax.lax.axis_index(name)
    pool = [local]
    for pairs, send in plan.rounds:
        rows = jnp.take(local, jnp.asarray(send)[device], axis=axis)
        pool.append(jax.lax.ppermute(rows, name, perm=pairs))
    merged = pool[0] if len(pool) == 1 else jnp.concatenate(pool, axis=axis)
    return jnp.take(merged, jnp.asarray(plan.gather)[device], axis=axis)
