"""XLA ``linear_cross_entropy``: the logits' statistics over (token chunk, vocabulary chunk) tiles.

The forward pass walks the vocabulary chunks (``lax.scan``; each slice of ``w`` is taken once)
and, inside each, the token chunks (``lax.scan``): it computes a ``[block_t, block_v]`` float32
tile of logits ``x @ w`` (soft-capped when asked) and folds it into per-token running statistics
(``[T]`` vectors: an online log-sum-exp, the label's logit and the logits' sum). Only one tile
of logits lives at a time, so the temporary memory is ``block_t · block_v`` floats (plus a few
``[T]`` vectors) whatever ``T · V``.

The backward pass (a custom VJP whose residuals are ``(x, w, labels, lse)``) recomputes each tile
and its logits' cotangent ``d_lse · softmax + d_z_label · onehot(label) + d_z_sum``, walking the
vocabulary chunks outside and the token chunks inside: a chunk's ``dw`` columns are accumulated in
float32 over every token and written once in ``w.dtype``; ``dx`` is accumulated in float32.

Shapes that the blocks do not divide are handled without padding copies: the last chunk starts
earlier (it ends at ``T`` / ``V``) and masks the rows or columns an earlier chunk covered.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import LINEAR_CROSS_ENTROPY_RESIDUALS as RESIDUALS
from ejk.plugin import VJP, cdiv, cotangent_like, positive_int, varying_like

__all__ = ["LinearCrossEntropyConfig", "config_space", "heuristic_config", "linear_cross_entropy",
           "linear_cross_entropy_bwd", "linear_cross_entropy_fwd", "vjp"]

Precision = str | tuple[str, str]
Statistics = tuple[jax.Array, jax.Array, jax.Array]


@attrs.frozen(kw_only=True)
class LinearCrossEntropyConfig:
    """Config of the XLA linear cross-entropy.

    Attributes:
        block_t: Tokens per tile (clipped to ``T``).
        block_v: Vocabulary columns per tile (clipped to ``V``). A tile of logits takes
            ``4 · block_t · block_v`` bytes; the backward pass holds a few.
    """

    block_t: int = attrs.field(default=1024, validator=positive_int)
    block_v: int = attrs.field(default=8192, validator=positive_int)


def _chunk_starts(length: int, block: int) -> jax.Array:
    """Start of each chunk; the last one is moved back to end at ``length`` (``block <= length``)."""
    starts = jnp.arange(cdiv(length, block), dtype=jnp.int32) * block
    return jnp.minimum(starts, length - block)


def _fresh(start: jax.Array, block: int, nominal: jax.Array) -> jax.Array:
    """Which of a chunk's ``block`` indices from ``start`` no earlier chunk covered (those ``>= nominal``)."""
    return start + jnp.arange(block, dtype=jnp.int32) >= nominal


def _logits(x_chunk: jax.Array, w_chunk: jax.Array, cap: float | None, precision: Precision) -> jax.Array:
    """Soft-capped float32 logits of a token chunk against a column chunk (both in the compute dtype)."""
    z = jnp.matmul(x_chunk, w_chunk, precision=precision, preferred_element_type=jnp.float32)
    return z if cap is None else cap * jnp.tanh(z / cap)


@functools.partial(jax.jit, static_argnames=("block_t", "block_v", "cap", "precision"))
def _statistics(x: jax.Array, w: jax.Array, labels: jax.Array, *, block_t: int, block_v: int, cap: float | None,
                precision: Precision) -> Statistics:
    t, v = x.shape[0], w.shape[1]
    dtype = jnp.promote_types(x.dtype, w.dtype)
    row_starts = _chunk_starts(t, block_t)
    nominal_rows = jnp.arange(row_starts.shape[0], dtype=jnp.int32) * block_t
    col_starts = _chunk_starts(v, block_v)
    nominal_cols = jnp.arange(col_starts.shape[0], dtype=jnp.int32) * block_v

    def vocab_chunk(stats: tuple[jax.Array, ...], cols: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
        col, col_nominal = cols
        w_chunk = lax.dynamic_slice_in_dim(w, col, block_v, axis=1).astype(dtype)  # once per vocabulary chunk
        fresh_cols = _fresh(col, block_v, col_nominal)[None, :]
        index = col + jnp.arange(block_v, dtype=jnp.int32)[None, :]

        def token_chunk(stats: tuple[jax.Array, ...], rows: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
            row, row_nominal = rows
            old = tuple(lax.dynamic_slice_in_dim(s, row, block_t) for s in stats)
            top, total, z_label, z_sum = old
            z = _logits(lax.dynamic_slice_in_dim(x, row, block_t).astype(dtype), w_chunk, cap, precision)
            new_top = jnp.maximum(top, jnp.max(jnp.where(fresh_cols, z, -jnp.inf), axis=1))
            total = total * jnp.exp(top - new_top) + jnp.sum(
                jnp.where(fresh_cols, jnp.exp(z - new_top[:, None]), 0.0), axis=1)
            label = lax.dynamic_slice_in_dim(labels, row, block_t).astype(jnp.int32)
            z_label = z_label + jnp.sum(jnp.where(fresh_cols & (index == label[:, None]), z, 0.0), axis=1)
            z_sum = z_sum + jnp.sum(jnp.where(fresh_cols, z, 0.0), axis=1)
            # Rows an earlier token chunk covered already hold this column chunk: keep them.
            fresh_rows = _fresh(row, block_t, row_nominal)
            new = (new_top, total, z_label, z_sum)
            stats = tuple(lax.dynamic_update_slice_in_dim(s, jnp.where(fresh_rows, n, o), row, 0)
                          for s, n, o in zip(stats, new, old, strict=True))
            return stats, None

        stats, _ = lax.scan(token_chunk, stats, (row_starts, nominal_rows))
        return stats, None

    zeros = jnp.zeros((t,), jnp.float32)
    init = varying_like((jnp.full((t,), -jnp.inf, jnp.float32), zeros, zeros, zeros), x, w, labels)
    (top, total, z_label, z_sum), _ = lax.scan(vocab_chunk, init, (col_starts, nominal_cols))
    return top + jnp.log(total), z_label, z_sum


@functools.partial(jax.jit, static_argnames=("block_t", "block_v", "cap", "precision"))
def _gradients(x: jax.Array, w: jax.Array, labels: jax.Array, lse: jax.Array, d_lse: jax.Array,
               d_label: jax.Array, d_sum: jax.Array, *, block_t: int, block_v: int, cap: float | None,
               precision: Precision) -> tuple[jax.Array, jax.Array]:
    t, v = x.shape[0], w.shape[1]
    dtype = jnp.promote_types(x.dtype, w.dtype)
    row_starts = _chunk_starts(t, block_t)
    nominal_rows = jnp.arange(row_starts.shape[0], dtype=jnp.int32) * block_t
    col_starts = _chunk_starts(v, block_v)
    nominal_cols = jnp.arange(col_starts.shape[0], dtype=jnp.int32) * block_v

    def vocab_chunk(carry: tuple[jax.Array, jax.Array], item: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
        dx, dw = carry
        col, col_nominal = item
        w_chunk = lax.dynamic_slice_in_dim(w, col, block_v, axis=1).astype(dtype)
        fresh_cols = _fresh(col, block_v, col_nominal)[None, :]

        def token_chunk(inner: tuple[jax.Array, jax.Array], rows: tuple[jax.Array, jax.Array]) -> tuple[Any, None]:
            dx, dw_chunk = inner
            row, row_nominal = rows
            x_chunk = lax.dynamic_slice_in_dim(x, row, block_t).astype(dtype)
            z = _logits(x_chunk, w_chunk, cap, precision)
            take = lambda a: lax.dynamic_slice_in_dim(a, row, block_t)[:, None]  # noqa: E731
            hit = col + jnp.arange(block_v, dtype=jnp.int32)[None, :] == take(labels).astype(jnp.int32)
            dz = take(d_lse) * jnp.exp(z - take(lse)) + jnp.where(hit, take(d_label), 0.0) + take(d_sum)
            if cap is not None:
                dz = dz * (1.0 - jnp.square(z / cap))
            keep = fresh_cols & _fresh(row, block_t, row_nominal)[:, None]
            dz = jnp.where(keep, dz, 0.0).astype(dtype)
            dx_rows = lax.dynamic_slice_in_dim(dx, row, block_t) + jnp.matmul(
                dz, w_chunk.T, precision=precision, preferred_element_type=jnp.float32)
            dw_chunk = dw_chunk + jnp.matmul(x_chunk.T, dz, precision=precision,
                                             preferred_element_type=jnp.float32)
            return (lax.dynamic_update_slice_in_dim(dx, dx_rows, row, 0), dw_chunk), None

        init = varying_like(jnp.zeros((x.shape[1], block_v), jnp.float32), x, w, labels, lse, d_lse)
        (dx, dw_chunk), _ = lax.scan(token_chunk, (dx, init), (row_starts, nominal_rows))
        # Columns an earlier chunk covered were masked here: keep what that chunk wrote.
        earlier = lax.dynamic_slice_in_dim(dw, col, block_v, axis=1)
        dw = lax.dynamic_update_slice_in_dim(dw, jnp.where(fresh_cols, dw_chunk.astype(w.dtype), earlier), col, 1)
        return (dx, dw), None

    init = varying_like((jnp.zeros(x.shape, jnp.float32), jnp.zeros(w.shape, w.dtype)), x, w, labels, lse, d_lse)
    (dx, dw), _ = lax.scan(vocab_chunk, init, (col_starts, nominal_cols))
    return dx.astype(x.dtype), dw


def _blocks(x: jax.Array, w: jax.Array, cfg: LinearCrossEntropyConfig | None) -> tuple[int, int]:
    cfg = cfg if cfg is not None else heuristic_config(x, w)
    return min(cfg.block_t, x.shape[0]), min(cfg.block_v, w.shape[1])


def linear_cross_entropy_fwd(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> tuple[Statistics, tuple[jax.Array, ...]]:
    """``((lse, z_label, z_sum), (x, w, labels, lse))``: the statistics and the residuals."""
    block_t, block_v = _blocks(x, w, cfg)
    if block_t == 0:  # no tokens
        empty = jnp.zeros((0,), jnp.float32)
        return (empty, empty, empty), (x, w, labels, empty)
    stats = _statistics(x, w, labels, block_t=block_t, block_v=block_v, cap=logit_soft_cap, precision=precision)
    return stats, (x, w, labels, stats[0])


def linear_cross_entropy(
    x: jax.Array, w: jax.Array, labels: jax.Array, *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> Statistics:
    """Per-token ``(lse, z_label, z_sum)`` of ``x @ w`` (soft-capped), each ``[T]`` float32.

    ``z_label`` is 0 for a label outside ``[0, V)``. ``ejk.linear_cross_entropy`` builds the loss
    from them.
    """
    return linear_cross_entropy_fwd(x, w, labels, logit_soft_cap=logit_soft_cap, precision=precision, cfg=cfg)[0]


def linear_cross_entropy_bwd(
    residuals: tuple[jax.Array, ...], cotangents: tuple[Any, Any, Any], *, logit_soft_cap: float | None = None,
    precision: Precision = ("highest", "highest"), cfg: LinearCrossEntropyConfig | None = None,
) -> tuple[jax.Array, jax.Array, None]:
    """``(dx, dw, None)`` from the residuals and the statistics' cotangents (``None`` counts as zeros)."""
    x, w, labels, lse = residuals
    block_t, block_v = _blocks(x, w, cfg)
    if block_t == 0:
        return cotangent_like(jnp.zeros_like(x), x), cotangent_like(jnp.zeros_like(w), w), None
    d_lse, d_label, d_sum = (jnp.zeros_like(lse) if d is None else d.astype(jnp.float32) for d in cotangents)
    dx, dw = _gradients(x, w, labels, lse, d_lse, d_label, d_sum, block_t=block_t, block_v=block_v,
                        cap=logit_soft_cap, precision=precision)
    return cotangent_like(dx, x), cotangent_like(dw, w), None


#: The custom VJP: residuals ``(x, w, labels, lse)``, shared with every implementation of the tag.
vjp = VJP(fwd=linear_cross_entropy_fwd, bwd=linear_cross_entropy_bwd, residuals=RESIDUALS)


def heuristic_config(x: Any, w: Any, **_: Any) -> LinearCrossEntropyConfig:
    """2048 tokens x 8192 columns (64 MiB of float32 logits per tile) on a GPU; 256 x 2048 on a CPU.

    The GPU tile is the fastest measured one whose temporary memory stays within 5% of the unfused
    loss's (``benchmarks/results/decode_prefill_lce_h100.md``).
    """
    del x, w
    if jax.default_backend() == "cpu":
        return LinearCrossEntropyConfig(block_t=256, block_v=2048)
    return LinearCrossEntropyConfig(block_t=2048, block_v=8192)


def config_space(x: Any, w: Any, **_: Any) -> list[LinearCrossEntropyConfig]:
    """Tiles of 512 to 2048 tokens by 4096 to 16384 columns (clipped to the shape, duplicates dropped)."""
    t, v = x.shape[0], w.shape[1]
    seen: dict[tuple[int, int], LinearCrossEntropyConfig] = {}
    for block_t in (512, 1024, 2048):
        for block_v in (4096, 8192, 16384):
            key = (min(block_t, max(t, 1)), min(block_v, v))
            seen.setdefault(key, LinearCrossEntropyConfig(block_t=block_t, block_v=block_v))
    return list(seen.values())
