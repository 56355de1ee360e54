"""XLA ``ragged_paged_attention``: loops over blocks of pages with an online softmax.

Two algorithms, chosen by :class:`PagedAttentionConfig` ``q_block``:

- **Per token** (``q_block=None``). Every query token belongs to one sequence (found from
  ``cu_q_lens``). Block ``b`` covers kv positions ``[b * L, (b + 1) * L)`` with
  ``L = pages_per_block * page`` of *every* sequence: each token gathers that block of its
  own sequence's pages, scores it, and folds it into a running float32 softmax (max, sum,
  weighted values). So at most one block of kv per token is live at a time, never a
  sequence's whole context. The loop runs only over the blocks some token can see (up to
  the longest context, and from the earliest window start), so short contexts in a large
  page table cost little. Good for decode (one or a few queries per sequence); with long
  query chunks every token gathers the same pages again.
- **Sequence tiled** (``q_block=Q``). The query rows of each live sequence are cut into
  tiles of ``Q`` rows; one loop runs over all tiles of all sequences, and for each tile a
  loop over the blocks of its sequence that the tile can see (causal bound from its last
  row, window bound from its first) gathers each block *once* for the whole tile. The
  tile is a ``Q``-row slice of ``q`` at the tile's first row, moved back where it would
  run past ``T``; rows of the slice outside the tile are masked and written back
  unchanged (a masked read-modify-write), so other sequences' rows are untouched. Good
  for prefill and chunked prefill.

Both loops have data-dependent bounds (``while`` loops): the op is not reverse-mode
differentiable, which serving-time attention does not need.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk.plugin import positive_int, varying_like

__all__ = ["PagedAttentionConfig", "config_space", "heuristic_config", "ragged_paged_attention"]

_HIGHEST = lax.Precision.HIGHEST
_TARGET_BLOCK_TOKENS = 512  # kv positions per block the heuristic aims for
_BLOCK_BYTES_BUDGET = 64 * 2**20  # float32 bytes live per loop step (see _step_bytes)
_MAX_PAGES_PER_BLOCK = 64
_INT32_MAX = int(np.iinfo(np.int32).max)
_DECODE_QUERIES = 4  # at most this many queries per sequence on average: the per-token path
_MAX_Q_BLOCK = 256
_Q_BLOCKS = (16, 64, 256)  # tile sizes config_space offers (clamped to T)
_PER_TOKEN_CANDIDATES = 4


def _optional_positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} is {value!r} but needs None or a positive int"
        )


@attrs.frozen(kw_only=True)
class PagedAttentionConfig:
    """Config of the XLA ragged paged attention.

    Attributes:
        pages_per_block: Pages gathered per loop step (clipped to ``pages_per_seq``).
            Larger blocks mean fewer steps but more memory and more masked work.
        q_block: ``None`` for the per-token algorithm, where every token gathers its own
            block (``T * pages_per_block * page * Hkv * (D + Dv)`` floats per step); else
            the sequence-tiled algorithm with tiles of this many query rows (clipped to
            ``T``) sharing each gathered block (``q_block * Hq * pages_per_block * page``
            logits plus one block of keys and values per step).
    """

    pages_per_block: int = attrs.field(default=8, validator=positive_int)
    q_block: int | None = attrs.field(default=None, validator=_optional_positive_int)


# -- shared pieces ----------------------------------------------------------------------------


class _Tokens(NamedTuple):
    """Where each query row sits (all tokens, or the rows of one tile)."""

    seq: jax.Array  # [R] its sequence (clipped into [0, S) for indexing)
    owned: jax.Array  # [R] owned by a live sequence (in a tile: by this tile)
    kv_len: jax.Array  # [R] its sequence's context length
    pos: jax.Array  # [R] its position in that context


def _block_range(tok: _Tokens, block_len: int, left: int | None) -> tuple[jax.Array, jax.Array]:
    """The blocks ``[lo, hi)`` that hold a key some owned row can see."""
    reach = jnp.where(tok.owned, jnp.minimum(tok.pos + 1, tok.kv_len), 0)  # keys [0, reach)
    hi = -(-jnp.max(reach) // block_len)
    if left is None:
        return jnp.zeros_like(hi), hi
    first = jnp.where(reach > 0, jnp.maximum(tok.pos - left, 0), _INT32_MAX)
    return jnp.minimum(jnp.min(first) // block_len, hi), hi


def _visible(tok: _Tokens, key_pos: jax.Array, left: int | None) -> jax.Array:
    """``[R, L]``: which keys at ``key_pos`` each row may attend to."""
    pos = tok.pos[:, None]
    visible = tok.owned[:, None] & (key_pos[None, :] <= pos) & (key_pos[None, :] < tok.kv_len[:, None])
    if left is not None:
        visible &= key_pos[None, :] >= pos - left
    return visible


def _soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
    return logits if cap is None else cap * jnp.tanh(logits / cap)


class _Softmax(NamedTuple):
    """Running online-softmax state, float32: max and sum ``[R, Hkv, G]``, values ``[R, Hkv, G, Dv]``."""

    row_max: jax.Array
    row_sum: jax.Array
    acc: jax.Array


def _empty_softmax(rows: int, hkv: int, groups: int, dv: int) -> _Softmax:
    return _Softmax(
        row_max=jnp.full((rows, hkv, groups), -jnp.inf, jnp.float32),
        row_sum=jnp.zeros((rows, hkv, groups), jnp.float32),
        acc=jnp.zeros((rows, hkv, groups, dv), jnp.float32),
    )


def _fold(
    state: _Softmax, logits: jax.Array, visible: jax.Array, weigh: Callable[[jax.Array], jax.Array]
) -> _Softmax:
    """Fold logits ``[R, Hkv, G, L]`` into the state; ``weigh`` maps the weights to ``[R, Hkv, G, Dv]``."""
    logits = jnp.where(visible[:, None, None, :], logits, -jnp.inf)
    new_max = jnp.maximum(state.row_max, jnp.max(logits, axis=-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # rows that saw nothing yet
    weights = jnp.exp(logits - safe_max[..., None])
    rescale = jnp.exp(state.row_max - safe_max)
    return _Softmax(
        row_max=new_max,
        row_sum=rescale * state.row_sum + jnp.sum(weights, axis=-1),
        acc=rescale[..., None] * state.acc + weigh(weights),
    )


def _finish(state: _Softmax, sink: jax.Array | None = None) -> jax.Array:
    """``[R, Hkv, G, Dv]`` float32 attention output; rows that saw no key are zeros. ``sink``
    (``[Hkv, G]`` float32 logits) adds ``e^sink`` to the denominator of every row that saw a key.

    A NaN in the row's query or in a visible key or value makes ``row_sum`` / ``acc`` NaN and
    propagates to the output (as in flash attention); only an exact zero sum means "no key".
    """
    if sink is not None:
        seen = state.row_sum != 0
        old = jnp.where(seen, state.row_max, 0.0)
        top = jnp.where(seen, jnp.maximum(old, sink), 0.0)
        rescale = jnp.exp(old - top)
        state = _Softmax(row_max=top,
                         row_sum=jnp.where(seen, rescale * state.row_sum + jnp.exp(sink - top), 0.0),
                         acc=rescale[..., None] * state.acc)
    empty = state.row_sum == 0
    return jnp.where(empty[..., None], 0.0, state.acc / jnp.where(empty, 1.0, state.row_sum)[..., None])


def _page_table(page_indices: jax.Array, num_pages: int, pages_per_block: int) -> jax.Array:
    """The table padded to whole blocks, entries clipped into ``[0, P)`` (unused ones may be garbage)."""
    pages_per_seq = page_indices.shape[1]
    num_blocks = -(-pages_per_seq // pages_per_block)
    table = jnp.pad(page_indices.astype(jnp.int32), ((0, 0), (0, num_blocks * pages_per_block - pages_per_seq)))
    return jnp.clip(table, 0, num_pages - 1)


def _live(num_seqs: jax.Array, seqs: int) -> jax.Array:
    return jnp.clip(jnp.reshape(num_seqs, ()).astype(jnp.int32), 0, seqs)


# -- per token ----------------------------------------------------------------------------------


def _token_layout(kv_lens: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, tokens: int) -> _Tokens:
    seqs = kv_lens.shape[0]
    live = _live(num_seqs, seqs)
    cu = cu_q_lens.astype(jnp.int32)
    # Ends of dead sequences move past every token, so only live ones can own rows and
    # garbage in the padding cannot break the sorted search.
    ends = jnp.where(jnp.arange(1, seqs + 1) <= live, cu[1:], _INT32_MAX)
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(ends, t, side="right").astype(jnp.int32)  # first sequence ending past t
    clipped = jnp.minimum(seq, seqs - 1)
    start = cu[clipped]
    kv_len = kv_lens.astype(jnp.int32)[clipped]
    q_len = cu[clipped + 1] - start
    return _Tokens(
        seq=clipped,
        owned=(seq < live) & (t >= start),
        kv_len=kv_len,
        pos=kv_len - q_len + (t - start),
    )


def _fold_block(
    state: _Softmax, logits: jax.Array, visible: jax.Array, values: jax.Array, precision: Any = _HIGHEST
) -> _Softmax:
    """Fold one block of logits ``[T, Hkv, G, L]`` and values ``[T, L, Hkv, Dv]`` into the state."""
    values = jnp.where(visible[:, :, None, None], values, 0.0)  # garbage in unused slots stays out

    def weigh(weights: jax.Array) -> jax.Array:
        return jnp.einsum("thgl,tlhd->thgd", weights, values, precision=precision)

    return _fold(state, logits, visible, weigh)


def _precision_of(q: jax.Array, precision: str) -> Any:
    """The products' precision: the call's for float32 inputs; full for the float32 casts of others."""
    return lax.Precision(precision) if q.dtype == jnp.float32 else _HIGHEST


def _sink_rows(sinks: jax.Array | None, hkv: int) -> jax.Array | None:
    """``sinks [Hq]`` as float32 ``[Hkv, G]`` (q head h = kv head h // G, group h % G)."""
    return None if sinks is None else sinks.astype(jnp.float32).reshape(hkv, -1)


@functools.partial(jax.jit, static_argnames=("scale", "left", "cap", "pages_per_block", "precision"))
def _paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    sinks: jax.Array | None,
    *,
    scale: float,
    left: int | None,
    cap: float | None,
    pages_per_block: int,
    precision: str = "highest",
) -> jax.Array:
    tokens, hq, d = q.shape
    num_pages, page, hkv, _ = k_pages.shape
    dv = v_pages.shape[-1]
    block_len = pages_per_block * page
    table = _page_table(page_indices, num_pages, pages_per_block)
    tok = _token_layout(kv_lens, cu_q_lens, num_seqs, tokens)
    qf = q.astype(jnp.float32).reshape(tokens, hkv, hq // hkv, d)

    def step(block: jax.Array, state: _Softmax) -> _Softmax:
        pages = lax.dynamic_slice_in_dim(table, block * pages_per_block, pages_per_block, axis=1)[tok.seq]
        keys = k_pages[pages].reshape(tokens, block_len, hkv, d).astype(jnp.float32)
        values = v_pages[pages].reshape(tokens, block_len, hkv, dv).astype(jnp.float32)
        logits = _soft_cap(scale * jnp.einsum("thgd,tlhd->thgl", qf, keys, precision=dots), cap)
        key_pos = block * block_len + jnp.arange(block_len, dtype=jnp.int32)
        return _fold_block(state, logits, _visible(tok, key_pos, left), values, dots)

    dots = _precision_of(q, precision)
    lo, hi = _block_range(tok, block_len, left)
    init = varying_like(_empty_softmax(tokens, hkv, hq // hkv, dv), q, k_pages, v_pages, tok)
    state = lax.fori_loop(lo, hi, step, init)
    return _finish(state, _sink_rows(sinks, hkv)).reshape(tokens, hq, dv).astype(q.dtype)


# -- sequence tiled -----------------------------------------------------------------------------


class _Tile(NamedTuple):
    """One tile of query rows: the ``q_block``-row slice of ``q`` at ``start`` and its rows."""

    start: jax.Array  # first row of the slice, in [0, T - q_block]
    seq: jax.Array  # its sequence
    rows: _Tokens  # [q_block] the slice's rows; ``owned`` marks this tile's rows


class _TileCounts(NamedTuple):
    """How the tiles of all live sequences line up in one loop."""

    ends: jax.Array  # [S] one past each sequence's last tile index (cumulative)
    counts: jax.Array  # [S] tiles per sequence (0 for dead ones)


def _tile_counts(cu: jax.Array, live: jax.Array, q_block: int) -> _TileCounts:
    seqs = cu.shape[0] - 1
    q_lens = jnp.maximum(cu[1:] - cu[:-1], 0)
    counts = jnp.where(jnp.arange(seqs) < live, -(-q_lens // q_block), 0)
    return _TileCounts(ends=jnp.cumsum(counts, dtype=jnp.int32), counts=counts)


def _tile_layout(
    item: jax.Array, tiles: _TileCounts, cu: jax.Array, kv_lens: jax.Array, q_block: int, tokens: int
) -> _Tile:
    """Tile number ``item`` of the loop over all sequences' tiles."""
    seqs = kv_lens.shape[0]
    seq = jnp.minimum(jnp.searchsorted(tiles.ends, item, side="right"), seqs - 1).astype(jnp.int32)
    first_tile = tiles.ends[seq] - tiles.counts[seq]
    seq_start, seq_end = cu[seq], cu[seq + 1]
    tile_start = seq_start + (item - first_tile) * q_block
    start = jnp.clip(tile_start, 0, tokens - q_block)  # the slice stays inside [0, T)
    r = start + jnp.arange(q_block, dtype=jnp.int32)
    kv_len = kv_lens[seq]
    owned = (r >= tile_start) & (r < jnp.minimum(tile_start + q_block, seq_end))
    return _Tile(
        start=start,
        seq=seq,
        rows=_Tokens(
            seq=jnp.broadcast_to(seq, (q_block,)),
            owned=owned,
            kv_len=jnp.broadcast_to(kv_len, (q_block,)),
            pos=kv_len - (seq_end - seq_start) + (r - seq_start),
        ),
    )


def _dot(spec: str, a: jax.Array, b: jax.Array, precision: str = "highest") -> jax.Array:
    """``einsum`` with float32 accumulation (at ``precision`` for float32 inputs)."""
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32,
                      precision=lax.Precision(precision) if a.dtype == jnp.float32 else None)


class _TileSpec(NamedTuple):
    """Static settings of the tiled kernel."""

    scale: float
    left: int | None
    cap: float | None
    pages_per_block: int
    q_block: int
    precision: str = "highest"


def _attend_tile(
    q_tile: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    table_row: jax.Array,
    rows: _Tokens,
    spec: _TileSpec,
    init: _Softmax,
    sink: jax.Array | None = None,
) -> jax.Array:
    """``[q_block, Hkv, G, Dv]`` float32: one tile ``[q_block, Hkv, G, D]`` over its sequence's blocks."""
    _, page, hkv, d = k_pages.shape
    dv = v_pages.shape[-1]
    block_len = spec.pages_per_block * page

    def step(block: jax.Array, state: _Softmax) -> _Softmax:
        pages = lax.dynamic_slice_in_dim(table_row, block * spec.pages_per_block, spec.pages_per_block)
        keys = k_pages[pages].reshape(block_len, hkv, d)  # gathered once for the whole tile
        values = v_pages[pages].reshape(block_len, hkv, dv)
        logits = _soft_cap(spec.scale * _dot("thgd,lhd->thgl", q_tile, keys, spec.precision), spec.cap)
        key_pos = block * block_len + jnp.arange(block_len, dtype=jnp.int32)
        in_context = key_pos < rows.kv_len[0]
        values = jnp.where(in_context[:, None, None], values, jnp.zeros((), values.dtype))  # garbage stays out

        def weigh(weights: jax.Array) -> jax.Array:
            return _dot("thgl,lhd->thgd", weights.astype(values.dtype), values, spec.precision)

        return _fold(state, logits, _visible(rows, key_pos, spec.left), weigh)

    lo, hi = _block_range(rows, block_len, spec.left)
    return _finish(lax.fori_loop(lo, hi, step, init), sink)


@functools.partial(jax.jit, static_argnames=("spec",))
def _paged_attention_tiled(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    sinks: jax.Array | None,
    *,
    spec: _TileSpec,
) -> jax.Array:
    tokens, hq, d = q.shape
    num_pages, _, hkv, _ = k_pages.shape
    dv = v_pages.shape[-1]
    groups, q_block = hq // hkv, spec.q_block
    inputs = (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    table = _page_table(page_indices, num_pages, spec.pages_per_block)
    cu, lens = cu_q_lens.astype(jnp.int32), kv_lens.astype(jnp.int32)
    tiles = _tile_counts(cu, _live(num_seqs, lens.shape[0]), q_block)
    sink = _sink_rows(sinks, hkv)

    def tile_step(item: jax.Array, out: jax.Array) -> jax.Array:
        tile = _tile_layout(item, tiles, cu, lens, q_block, tokens)
        q_tile = lax.dynamic_slice_in_dim(q, tile.start, q_block).reshape(q_block, hkv, groups, d)
        init = varying_like(_empty_softmax(q_block, hkv, groups, dv), *inputs)
        new = _attend_tile(q_tile, k_pages, v_pages, table[tile.seq], tile.rows, spec, init, sink)
        new = new.reshape(q_block, hq, dv).astype(out.dtype)
        old = lax.dynamic_slice_in_dim(out, tile.start, q_block)
        mixed = jnp.where(tile.rows.owned[:, None, None], new, old)  # other sequences' rows stay
        return lax.dynamic_update_slice_in_dim(out, mixed, tile.start, axis=0)

    init = varying_like(jnp.zeros((tokens, hq, dv), q.dtype), *inputs)
    out: jax.Array = lax.fori_loop(0, tiles.ends[-1], tile_step, init)
    return out


# -- entry point --------------------------------------------------------------------------------


def ragged_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    sinks: jax.Array | None = None,
    precision: str = "highest",
    cfg: PagedAttentionConfig | None = None,
) -> jax.Array:
    """Causal attention of ragged query chunks over a paged KV cache.

    Arguments arrive validated and normalised (see ``docs/KERNEL_CONTRACT.md``).

    Args:
        q: ``[T, Hq, D]``.
        k_pages: ``[P, page, Hkv, D]``.
        v_pages: ``[P, page, Hkv, Dv]``.
        kv_lens: ``[S]`` int32.
        page_indices: ``[S, pages_per_seq]`` int32.
        cu_q_lens: ``[S+1]`` int32: sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]``,
            the last positions of its context (bottom-right aligned).
        num_seqs: int32 scalar: the live sequences (may be traced).
        softmax_scale: Logit scale (already resolved).
        sliding_window: ``(left, 0)`` or ``None``: query at ``i`` sees keys ``[i - left, i]``.
        logits_soft_cap: ``cap * tanh(logits / cap)`` when given.
        sinks: ``[Hq]`` sink logits (each seen row's denominator gains ``e^sink``) or ``None``.
        precision: ``"default"``, ``"high"`` or ``"highest"``: of the float32 products.
        cfg: The config; ``None`` means :func:`heuristic_config` for these shapes.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``; rows of no live sequence, and rows that see no key,
        are zeros.
    """
    cfg = heuristic_config(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs) if cfg is None else cfg
    tokens, hq, _ = q.shape
    seqs, pages_per_seq = page_indices.shape
    if min(tokens, hq, seqs, pages_per_seq) == 0:
        return jnp.zeros((tokens, hq, v_pages.shape[-1]), q.dtype)
    arrays = (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, jnp.asarray(num_seqs), sinks)
    scale = float(softmax_scale)
    left = None if sliding_window is None else int(sliding_window[0])
    cap = None if logits_soft_cap is None else float(logits_soft_cap)
    pages_per_block = min(cfg.pages_per_block, pages_per_seq)
    out: jax.Array
    if cfg.q_block is None:
        out = _paged_attention(*arrays, scale=scale, left=left, cap=cap, pages_per_block=pages_per_block,
                               precision=str(precision))
    else:
        spec = _TileSpec(scale=scale, left=left, cap=cap, pages_per_block=pages_per_block,
                         q_block=min(cfg.q_block, tokens), precision=str(precision))
        out = _paged_attention_tiled(*arrays, spec=spec)
    return out


# -- configs ------------------------------------------------------------------------------------


def _step_bytes(q: Any, k_pages: Any, v_pages: Any, pages_per_block: int, q_block: int | None) -> int:
    """Float32 bytes live in one loop step.

    Per token: one block of gathered keys and values for every token. Tiled: the tile's
    logits ``q_block * Hq * L`` plus one gathered block of keys and values.
    """
    tokens, hq = q.shape[0], q.shape[1]
    _, page, hkv, d = k_pages.shape
    block_len = pages_per_block * page
    kv = block_len * hkv * (d + v_pages.shape[-1])
    return int(4 * (tokens * kv if q_block is None else q_block * hq * block_len + kv))


def _block_sizes(q: Any, k_pages: Any, v_pages: Any, pages_per_seq: int, q_block: int | None) -> list[int]:
    """Powers of two pages per block up to ``pages_per_seq`` (at most 64) within the memory budget.

    The smallest is kept even when it does not fit.
    """
    cap = min(max(pages_per_seq, 1), _MAX_PAGES_PER_BLOCK)
    sizes = [1 << i for i in range(7) if 1 << i <= cap]
    fitting = [s for s in sizes if _step_bytes(q, k_pages, v_pages, s, q_block) <= _BLOCK_BYTES_BUDGET]
    return fitting or sizes[:1]


def _target_index(sizes: list[int], page: int) -> int:
    """The largest of ``sizes`` with at most 512 kv positions per block (else the smallest)."""
    small = [i for i, s in enumerate(sizes) if s * max(page, 1) <= _TARGET_BLOCK_TOKENS]
    return small[-1] if small else 0


def _is_decode(q: Any, page_indices: Any) -> bool:
    """At most four queries per sequence on average (``T / S``)."""
    return bool(q.shape[0] <= _DECODE_QUERIES * max(page_indices.shape[0], 1))


def _heuristic_q_block(q: Any, page_indices: Any) -> int:
    """The next power of two at or above the average query length, at most 256 and ``T``."""
    tokens = max(int(q.shape[0]), 1)
    average = -(-tokens // max(int(page_indices.shape[0]), 1))
    return min(1 << (average - 1).bit_length(), _MAX_Q_BLOCK, tokens)


def _per_token_space(q: Any, k_pages: Any, v_pages: Any, page_indices: Any) -> list[PagedAttentionConfig]:
    """Up to four block sizes around the heuristic's (one smaller, two larger where possible)."""
    sizes = _block_sizes(q, k_pages, v_pages, page_indices.shape[1], None)
    target = _target_index(sizes, k_pages.shape[1])
    lo = max(0, min(target - 1, len(sizes) - _PER_TOKEN_CANDIDATES))
    return [PagedAttentionConfig(pages_per_block=s) for s in sizes[lo:lo + _PER_TOKEN_CANDIDATES]]


def _tiled_space(q: Any, k_pages: Any, v_pages: Any, page_indices: Any) -> list[PagedAttentionConfig]:
    """Tiles of 16, 64 and 256 rows and the heuristic's (clamped to ``T``), each with its target block.

    The tile the heuristic would pick (the smallest one for decode-like shapes) also gets
    the block sizes next to its target.
    """
    tokens = max(q.shape[0], 1)
    chosen = _heuristic_q_block(q, page_indices)
    q_blocks = {min(b, tokens) for b in _Q_BLOCKS} | ({chosen} if not _is_decode(q, page_indices) else set())
    focus = min(q_blocks) if _is_decode(q, page_indices) else chosen
    space = []
    for q_block in sorted(q_blocks):
        sizes = _block_sizes(q, k_pages, v_pages, page_indices.shape[1], q_block)
        target = _target_index(sizes, k_pages.shape[1])
        picks = sizes[max(target - 1, 0):target + 2] if q_block == focus else [sizes[target]]
        space += [PagedAttentionConfig(pages_per_block=s, q_block=q_block) for s in picks]
    return space


def config_space(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any,
    **_: Any
) -> list[PagedAttentionConfig]:
    """Autotuning candidates of both algorithms, powers of two pages per block (at most 64).

    Per token: up to four block sizes around about 512 kv positions per block. Tiled:
    tiles of 16, 64 and 256 rows (clamped to ``T``) and the heuristic's, each with its
    block of about 512 positions, and the heuristic's tile also with the sizes next to it.
    Blocks whose step would pass the memory budget are left out, except the smallest.

    Args:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs: The operation's
            arrays (anything with ``.shape`` and ``.dtype``).

    Returns:
        At most ten distinct configs; :func:`heuristic_config`'s is among them.
    """
    del kv_lens, cu_q_lens, num_seqs
    return _per_token_space(q, k_pages, v_pages, page_indices) + _tiled_space(q, k_pages, v_pages, page_indices)


def heuristic_config(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any,
    **_: Any
) -> PagedAttentionConfig:
    """Per token for decode-like shapes, else tiles of about the average query length.

    With ``T / S <= 4`` the per-token algorithm; else tiles of the next power of two at or
    above ``T / S`` rows (at most 256 and ``T``). Either way the largest block of at most
    512 kv positions that fits the memory budget.

    Args:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs: The operation's
            arrays (anything with ``.shape`` and ``.dtype``).

    Returns:
        A config from :func:`config_space`.
    """
    del kv_lens, cu_q_lens, num_seqs
    q_block = None if _is_decode(q, page_indices) else _heuristic_q_block(q, page_indices)
    sizes = _block_sizes(q, k_pages, v_pages, page_indices.shape[1], q_block)
    return PagedAttentionConfig(pages_per_block=sizes[_target_index(sizes, k_pages.shape[1])], q_block=q_block)
