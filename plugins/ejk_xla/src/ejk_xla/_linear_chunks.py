"""Chunks of linear recurrences (``gla``, ``ssd``): where every chunk's tokens come from, and the
state passing between chunks.

A batch of ``B`` rows of ``T`` tokens is cut into ``ceil(T / C)`` chunks per row. Packed sequences
(``cu_seqlens [N+1]``, one row) are cut per sequence, so no chunk crosses a boundary: sequence ``n``
owns ``ceil(len_n / C)`` consecutive chunks, at most ``(T + N·(C-1)) // C`` in all (a static bound;
the spare chunks hold no token). Tokens past a sequence's end are zeros, which leave a state unchanged
(zero keys and values, zero log decay).

Between chunks the states follow ``h_c = a_c ⊙ h_{c-1} + b_c`` (``a_c`` the chunk's total decay,
``b_c`` what its tokens add), restarted from the sequence's initial state at its first chunk: one
``lax.associative_scan`` over the chunks (log depth, no sequential loop).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["ChunkLayout", "chunk_layout", "chunk_size", "final_states", "from_chunks", "operand_vjp_of",
           "pass_states", "to_chunks"]


def chunk_size(tokens: int, cap: int) -> int:
    """``cap``, or the smallest power of two holding ``tokens`` when that is smaller (one decoding
    token is one chunk of 1)."""
    size = 1
    while size < min(tokens, cap):
        size *= 2
    return min(size, cap)


class ChunkLayout(NamedTuple):
    """Where the chunks' tokens come from.

    ``rows`` x ``chunks`` chunks of ``size`` tokens; ``first [rows, chunks]`` marks a sequence's first
    chunk and ``seq [rows, chunks]`` the index of the sequence's state. Packed layouts (``rows == 1``) also
    give ``token [chunks, size]`` (the token at each place, ``valid`` where one is), ``slot [T]`` (each
    token's place in the flattened chunks), ``last [N]`` (each sequence's last chunk) and ``nonempty [N]``.
    """

    rows: int
    chunks: int
    size: int
    first: jax.Array
    seq: jax.Array
    token: jax.Array | None = None
    valid: jax.Array | None = None
    slot: jax.Array | None = None
    last: jax.Array | None = None
    nonempty: jax.Array | None = None


def chunk_layout(batch: int, tokens: int, size: int, cu_seqlens: jax.Array | None) -> ChunkLayout:
    """The chunks of ``batch`` rows of ``tokens`` tokens, or of the sequences ``cu_seqlens`` packs."""
    if cu_seqlens is None:
        chunks = -(-tokens // size)
        first = jnp.broadcast_to(jnp.arange(chunks) == 0, (batch, chunks))
        seq = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, chunks))
        return ChunkLayout(batch, chunks, size, first, seq)
    cu = cu_seqlens.astype(jnp.int32)
    n = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum((lens + size - 1) // size)])
    chunks = (tokens + n * (size - 1)) // size
    c = jnp.arange(chunks)
    seq = jnp.minimum(jnp.searchsorted(starts[1:], c, side="right"), n - 1)
    local = c - starts[seq]
    used = c < starts[-1]
    token = (cu[seq] + local * size)[:, None] + jnp.arange(size)
    valid = used[:, None] & (token < cu[seq + 1][:, None])
    t = jnp.arange(tokens)
    owner = jnp.minimum(jnp.searchsorted(cu[1:], t, side="right"), n - 1)
    offset = t - cu[owner]
    slot = (starts[owner] + offset // size) * size + offset % size
    return ChunkLayout(1, chunks, size, (used & (local == 0))[None], seq[None], token=jnp.where(valid, token, 0),
                       valid=valid, slot=slot, last=jnp.maximum(starts[1:] - 1, 0), nonempty=lens > 0)


def to_chunks(x: jax.Array, layout: ChunkLayout) -> jax.Array:
    """``[B, T, ...]`` → ``[chunks, rows, size, ...]``, zeros where no token is."""
    if layout.token is None:
        b, t = x.shape[:2]
        pad = layout.chunks * layout.size - t
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(b, layout.chunks, layout.size, *x.shape[2:]), 1, 0)
    assert layout.valid is not None
    mask = layout.valid.reshape(layout.valid.shape + (1,) * (x.ndim - 2))
    return jnp.where(mask, x[0][layout.token], 0).astype(x.dtype)[:, None]


def from_chunks(y: jax.Array, layout: ChunkLayout, tokens: int) -> jax.Array:
    """``[chunks, rows, size, ...]`` → ``[B, T, ...]`` (the inverse of :func:`to_chunks` on its tokens)."""
    y = jnp.moveaxis(y, 0, 1).reshape(layout.rows, layout.chunks * layout.size, *y.shape[3:])
    if layout.slot is None:
        return y[:, :tokens]
    return y[:, layout.slot]


def pass_states(decay: jax.Array, added: jax.Array, layout: ChunkLayout,
                initial: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The state entering and leaving every chunk.

    Args:
        decay: ``[chunks, rows, ...]`` each chunk's total decay (broadcasting against the state).
        added: ``[chunks, rows, ...]`` the state each chunk's tokens add, from a zero state.
        layout: The chunks.
        initial: ``[N, ...]`` the sequences' initial states.

    Returns:
        ``(entering, leaving)``, each ``[chunks, rows, ...]`` float32.
    """
    first = jnp.moveaxis(layout.first, 1, 0).reshape(layout.first.shape[::-1] + (1,) * (added.ndim - 2))
    start = initial[jnp.moveaxis(layout.seq, 1, 0)]
    a = jnp.where(first, 0.0, decay)
    b = added + jnp.where(first, decay * start, 0.0)

    def combine(x: tuple[jax.Array, jax.Array], y: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        return x[0] * y[0], y[0] * x[1] + y[1]

    _, leaving = jax.lax.associative_scan(combine, (a, b))
    before = jnp.concatenate([jnp.zeros_like(leaving[:1]), leaving[:-1]])
    return jnp.where(first, start, before), leaving


def final_states(leaving: jax.Array, layout: ChunkLayout, initial: jax.Array) -> jax.Array:
    """``[N, ...]``: the state after each row's (or sequence's) last chunk; an empty one keeps its initial state."""
    if layout.chunks == 0:
        return initial
    if layout.last is None:
        return leaving[-1]
    assert layout.nonempty is not None
    keep = layout.nonempty.reshape((-1,) + (1,) * (initial.ndim - 1))
    return jnp.where(keep, leaving[layout.last, 0], initial)



def operand_vjp_of(forward: Any, names: tuple[str, ...], integer: str, residuals: str) -> Any:
    """The :class:`ejk.VJP` of ``forward(*arrays, **static)`` (an output and a final state) whose residuals are
    its array operands in the op's order ``names`` (keyword ones included): the backward is JAX's VJP of
    ``forward`` recomputed from them, with ``None`` for absent operands and the integer one ``integer``."""
    from ejk.plugin import VJP, cotangent_like

    def fwd(*positional: Any, cfg: Any = None, **named: Any) -> tuple[Any, tuple[Any, ...]]:
        arrays = (*positional, *(named.pop(n) for n in names[len(positional):]))
        return forward(*arrays, **named, cfg=cfg), arrays

    def bwd(operands: tuple[Any, ...], d_out: Any, *, cfg: Any = None, **static: Any) -> tuple[Any, ...]:
        skip = names.index(integer)
        live = [i for i, x in enumerate(operands) if x is not None and i != skip]

        def of_live(*values: Any) -> Any:
            merged = list(operands)
            for i, x in zip(live, values, strict=True):
                merged[i] = x
            return forward(*merged, **static, cfg=cfg)

        _, vjp = jax.vjp(of_live, *(operands[i] for i in live))
        found = dict(zip(live, vjp(tuple(d_out)), strict=True))
        return tuple(None if i not in found else cotangent_like(found[i], operands[i]) for i in range(len(operands)))

    fwd.__name__, bwd.__name__ = "forward_with_residuals", "backward"
    return VJP(fwd=fwd, bwd=bwd, residuals=residuals)
