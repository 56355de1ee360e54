"""XLA ``ragged_paged_attention``: a loop over blocks of pages with an online softmax.

Every query token belongs to one sequence (found from ``cu_q_lens``). Block ``b`` covers
kv positions ``[b * L, (b + 1) * L)`` with ``L = pages_per_block * page`` of *every*
sequence: each token gathers that block of its own sequence's pages, scores it, and folds
it into a running float32 softmax (max, sum, weighted values). So at most one block of kv
per token is live at a time, never a sequence's whole context. The loop runs only over
the blocks some token can see (up to the longest context, and from the earliest window
start), so short contexts in a large page table cost little.

The loop has data-dependent bounds (a ``while`` loop): the op is not reverse-mode
differentiable, which serving-time attention does not need.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk_xla._vma import varying_like

__all__ = ["PagedAttentionConfig", "config_space", "heuristic_config", "ragged_paged_attention"]

_HIGHEST = lax.Precision.HIGHEST
_TARGET_BLOCK_TOKENS = 512  # kv positions per block the heuristic aims for
_BLOCK_BYTES_BUDGET = 64 * 2**20  # float32 k and v of one block, for all tokens
_MAX_PAGES_PER_BLOCK = 64
_INT32_MAX = int(np.iinfo(np.int32).max)


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} is {value!r} but needs a positive int")


@attrs.frozen(kw_only=True)
class PagedAttentionConfig:
    """Config of the XLA ragged paged attention.

    Attributes:
        pages_per_block: Pages gathered per token and loop step (clipped to
            ``pages_per_seq``). Larger blocks mean fewer steps but more memory
            (``T * pages_per_block * page * Hkv * (D + Dv)`` floats) and more masked work.
    """

    pages_per_block: int = attrs.field(default=8, validator=_positive_int)


class _Tokens(NamedTuple):
    """Where each query token sits."""

    seq: jax.Array  # [T] its sequence (clipped into [0, S) for indexing)
    owned: jax.Array  # [T] owned by a live sequence
    kv_len: jax.Array  # [T] its sequence's context length
    pos: jax.Array  # [T] its position in that context


def _token_layout(kv_lens: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array, tokens: int) -> _Tokens:
    seqs = kv_lens.shape[0]
    live = jnp.clip(jnp.reshape(num_seqs, ()).astype(jnp.int32), 0, seqs)
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


def _block_range(tok: _Tokens, block_len: int, left: int | None) -> tuple[jax.Array, jax.Array]:
    """The blocks ``[lo, hi)`` that hold a key some owned token can see."""
    reach = jnp.where(tok.owned, jnp.minimum(tok.pos + 1, tok.kv_len), 0)  # keys [0, reach)
    hi = -(-jnp.max(reach) // block_len)
    if left is None:
        return jnp.zeros_like(hi), hi
    first = jnp.where(reach > 0, jnp.maximum(tok.pos - left, 0), _INT32_MAX)
    return jnp.minimum(jnp.min(first) // block_len, hi), hi


class _Softmax(NamedTuple):
    """Running online-softmax state, float32: max and sum ``[T, Hkv, G]``, values ``[T, Hkv, G, Dv]``."""

    row_max: jax.Array
    row_sum: jax.Array
    acc: jax.Array


def _fold_block(
    state: _Softmax, logits: jax.Array, visible: jax.Array, values: jax.Array
) -> _Softmax:
    """Fold one block of logits ``[T, Hkv, G, L]`` and values ``[T, L, Hkv, Dv]`` into the state."""
    logits = jnp.where(visible[:, None, None, :], logits, -jnp.inf)
    new_max = jnp.maximum(state.row_max, jnp.max(logits, axis=-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # rows that saw nothing yet
    weights = jnp.exp(logits - safe_max[..., None])
    rescale = jnp.exp(state.row_max - safe_max)
    values = jnp.where(visible[:, :, None, None], values, 0.0)  # garbage in unused slots stays out
    update = jnp.einsum("thgl,tlhd->thgd", weights, values, precision=_HIGHEST)
    return _Softmax(
        row_max=new_max,
        row_sum=rescale * state.row_sum + jnp.sum(weights, axis=-1),
        acc=rescale[..., None] * state.acc + update,
    )


@functools.partial(jax.jit, static_argnames=("scale", "left", "cap", "pages_per_block"))
def _paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    scale: float,
    left: int | None,
    cap: float | None,
    pages_per_block: int,
) -> jax.Array:
    tokens, hq, d = q.shape
    num_pages, page, hkv, _ = k_pages.shape
    dv = v_pages.shape[-1]
    pages_per_seq = page_indices.shape[1]
    block_len = pages_per_block * page
    num_blocks = -(-pages_per_seq // pages_per_block)
    table = jnp.pad(page_indices.astype(jnp.int32), ((0, 0), (0, num_blocks * pages_per_block - pages_per_seq)))
    table = jnp.clip(table, 0, num_pages - 1)  # unused entries may be garbage
    tok = _token_layout(kv_lens, cu_q_lens, num_seqs, tokens)
    qf = q.astype(jnp.float32).reshape(tokens, hkv, hq // hkv, d)

    def step(block: jax.Array, state: _Softmax) -> _Softmax:
        pages = lax.dynamic_slice_in_dim(table, block * pages_per_block, pages_per_block, axis=1)[tok.seq]
        keys = k_pages[pages].reshape(tokens, block_len, hkv, d).astype(jnp.float32)
        values = v_pages[pages].reshape(tokens, block_len, hkv, dv).astype(jnp.float32)
        logits = scale * jnp.einsum("thgd,tlhd->thgl", qf, keys, precision=_HIGHEST)
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        key_pos = block * block_len + jnp.arange(block_len, dtype=jnp.int32)
        visible = tok.owned[:, None] & (key_pos[None, :] <= tok.pos[:, None]) & (key_pos[None, :] < tok.kv_len[:, None])
        if left is not None:
            visible &= key_pos[None, :] >= tok.pos[:, None] - left
        return _fold_block(state, logits, visible, values)

    lo, hi = _block_range(tok, block_len, left)
    init = varying_like(_Softmax(
        row_max=jnp.full((tokens, hkv, hq // hkv), -jnp.inf, jnp.float32),
        row_sum=jnp.zeros((tokens, hkv, hq // hkv), jnp.float32),
        acc=jnp.zeros((tokens, hkv, hq // hkv, dv), jnp.float32),
    ), q, k_pages, v_pages, tok)
    state = lax.fori_loop(lo, hi, step, init)
    seen = state.row_sum > 0
    out = jnp.where(seen[..., None], state.acc / jnp.where(seen, state.row_sum, 1.0)[..., None], 0.0)
    return out.reshape(tokens, hq, dv).astype(q.dtype)


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
    out: jax.Array = _paged_attention(
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, jnp.asarray(num_seqs),
        scale=float(softmax_scale),
        left=None if sliding_window is None else int(sliding_window[0]),
        cap=None if logits_soft_cap is None else float(logits_soft_cap),
        pages_per_block=min(cfg.pages_per_block, pages_per_seq),
    )
    return out


def _block_bytes(q: Any, k_pages: Any, v_pages: Any, pages_per_block: int) -> int:
    """Float32 bytes of one block of gathered keys and values for all tokens."""
    tokens = q.shape[0]
    _, page, hkv, d = k_pages.shape
    return int(4 * tokens * pages_per_block * page * hkv * (d + v_pages.shape[-1]))


def config_space(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any
) -> list[PagedAttentionConfig]:
    """Autotuning candidates: powers of two pages per block up to ``pages_per_seq`` (at most 64).

    Blocks whose gathered keys and values would pass the memory budget are left out,
    except the smallest.

    Args:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs: The operation's
            arrays (anything with ``.shape`` and ``.dtype``).

    Returns:
        At most seven configs.
    """
    del kv_lens, cu_q_lens, num_seqs
    pages_per_seq = max(page_indices.shape[1], 1)
    sizes = [1 << i for i in range(7) if 1 << i <= min(pages_per_seq, _MAX_PAGES_PER_BLOCK)]
    fitting = [s for s in sizes if _block_bytes(q, k_pages, v_pages, s) <= _BLOCK_BYTES_BUDGET] or sizes[:1]
    return [PagedAttentionConfig(pages_per_block=s) for s in fitting]


def heuristic_config(
    q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any
) -> PagedAttentionConfig:
    """About 512 kv positions per block, fewer when the gathered block would be too large.

    Args:
        q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs: The operation's
            arrays (anything with ``.shape`` and ``.dtype``).

    Returns:
        The largest candidate of :func:`config_space` with at most 512 positions per block.
    """
    page = max(k_pages.shape[1], 1)
    space = config_space(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    small = [c for c in space if c.pages_per_block * page <= _TARGET_BLOCK_TOKENS] or space[:1]
    return small[-1]
