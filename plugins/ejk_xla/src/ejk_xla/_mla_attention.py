"""XLA ``mla_paged_attention``: a loop over blocks of pages with an online softmax.

Step ``b`` gathers kv positions ``[b · L, (b + 1) · L)`` (``L = pages_per_block · page``) of every
sequence through its page table, once for all of its ``Sq · Hq`` query rows (the latent head is
shared), scores them against all ``Dk`` dims and folds them, with their first ``Dv`` dims as
values, into a running float32 softmax. The loop ends at the longest context (a data-dependent
bound, so the op is not reverse-mode differentiable; serving-time attention needs no gradient).
Positions past a sequence's length are masked and their (possibly garbage) values zeroed; page
ids are clipped into ``[0, P)``, so table entries past a context are never an out-of-bounds read.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
from jax import lax

from ejk.plugin import positive_int, varying_like

__all__ = ["MlaAttentionConfig", "config_space", "heuristic_config", "mla_paged_attention"]

_HIGHEST = lax.Precision.HIGHEST
_TARGET_BLOCK_TOKENS = 512  # kv positions per step the heuristic aims for
_STEP_BYTES_BUDGET = 64 * 2**20  # float32 bytes of logits and gathered latents live per step
_MAX_PAGES_PER_BLOCK = 64


@attrs.frozen(kw_only=True)
class MlaAttentionConfig:
    """Config of the XLA latent paged attention.

    Attributes:
        pages_per_block: Pages gathered per loop step (clipped to ``pages_per_seq``): fewer steps,
            more memory (``B · L · Dk`` gathered latents and ``B · Sq · Hq · L`` logits).
    """

    pages_per_block: int = attrs.field(default=8, validator=positive_int)


class _State(NamedTuple):
    """Online softmax, float32: max and sum ``[B, Sq, Hq]``, values ``[B, Sq, Hq, Dv]``."""

    row_max: jax.Array
    row_sum: jax.Array
    acc: jax.Array


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``einsum`` accumulating in float32 (full float32 products for float32 operands)."""
    precision = _HIGHEST if a.dtype == jnp.float32 or b.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=precision)


@functools.partial(jax.jit, static_argnames=("dv", "scale", "causal", "pages_per_block"))
def _attend(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *, dv: int,
            scale: float, causal: bool, pages_per_block: int) -> jax.Array:
    batch, sq, hq, dk = q.shape
    num_pages, page, _ = kv_pages.shape
    pages_per_seq = page_indices.shape[1]
    block_len = pages_per_block * page
    steps = -(-pages_per_seq // pages_per_block)
    table = jnp.pad(page_indices.astype(jnp.int32), ((0, 0), (0, steps * pages_per_block - pages_per_seq)))
    table = jnp.clip(table, 0, num_pages - 1)
    lens = jnp.clip(kv_lens.astype(jnp.int32), 0, pages_per_seq * page)
    # Query i of sequence b sees keys up to last[b, i] (inclusive).
    last = lens[:, None] - 1 if not causal else lens[:, None] - sq + jnp.arange(sq, dtype=jnp.int32)[None, :]
    dtype = jnp.promote_types(q.dtype, kv_pages.dtype)
    qc = q.astype(dtype)

    def step(block: jax.Array, state: _State) -> _State:
        pages = lax.dynamic_slice_in_dim(table, block * pages_per_block, pages_per_block, axis=1)
        latent = kv_pages[pages].reshape(batch, block_len, dk).astype(dtype)  # gathered once for every head
        key = block * block_len + jnp.arange(block_len, dtype=jnp.int32)
        in_context = key[None, :] < lens[:, None]  # [B, L]
        visible = in_context[:, None, :] & (key[None, None, :] <= last[:, :, None])  # [B, Sq, L]
        logits = scale * _dot("bshd,bld->bshl", qc, latent)
        logits = jnp.where(visible[:, :, None, :], logits, -jnp.inf)
        new_max = jnp.maximum(state.row_max, jnp.max(logits, axis=-1))
        safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # rows that saw nothing yet
        weights = jnp.exp(logits - safe_max[..., None])
        rescale = jnp.exp(state.row_max - safe_max)
        values = jnp.where(in_context[:, :, None], latent[..., :dv], jnp.zeros((), dtype))  # garbage stays out
        return _State(row_max=new_max, row_sum=rescale * state.row_sum + jnp.sum(weights, axis=-1),
                      acc=rescale[..., None] * state.acc + _dot("bshl,bld->bshd", weights.astype(dtype), values))

    init = varying_like(_State(row_max=jnp.full((batch, sq, hq), -jnp.inf, jnp.float32),
                               row_sum=jnp.zeros((batch, sq, hq), jnp.float32),
                               acc=jnp.zeros((batch, sq, hq, dv), jnp.float32)), q, kv_pages, kv_lens, page_indices)
    hi = -(-jnp.max(lens) // block_len)
    state = lax.fori_loop(0, hi, step, init)
    empty = state.row_sum == 0  # no visible key; a NaN sum (NaN in q or a visible key) propagates
    out = jnp.where(empty[..., None], 0.0, state.acc / jnp.where(empty, 1.0, state.row_sum)[..., None])
    return out.astype(q.dtype)


def mla_paged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, *,
                        v_head_dim: int, softmax_scale: float, causal: bool,
                        cfg: MlaAttentionConfig | None = None) -> jax.Array:
    """Latent attention over a paged cache (see ``docs/KERNEL_CONTRACT.md``); arguments arrive validated.

    Args:
        q: ``[B, Sq, Hq, Dk]``.
        kv_pages: ``[P, page, Dk]``.
        kv_lens: ``[B]`` int32.
        page_indices: ``[B, pages_per_seq]`` int32.
        v_head_dim: Value dims (the first ones of each position).
        softmax_scale: Logit scale (already resolved).
        causal: Query ``i`` sees keys ``j <= kv_len - Sq + i``.
        cfg: The config; ``None`` means :func:`heuristic_config` for these shapes.

    Returns:
        ``[B, Sq, Hq, v_head_dim]`` in ``q.dtype``; rows that see no key are zeros.
    """
    batch, sq, hq, _ = q.shape
    pages_per_seq = page_indices.shape[1]
    if min(batch, sq, hq, pages_per_seq) == 0:
        return jnp.zeros((batch, sq, hq, v_head_dim), q.dtype)
    cfg = heuristic_config(q, kv_pages, kv_lens, page_indices) if cfg is None else cfg
    out: jax.Array = _attend(q, kv_pages, kv_lens, page_indices, dv=int(v_head_dim), scale=float(softmax_scale),
                             causal=bool(causal), pages_per_block=min(cfg.pages_per_block, pages_per_seq))
    return out


def _step_bytes(q: Any, kv_pages: Any, pages_per_block: int) -> int:
    """Float32 bytes live in one step: the gathered latents and the logits."""
    batch, sq, hq, dk = (int(n) for n in q.shape)
    block_len = pages_per_block * int(kv_pages.shape[1])
    return 4 * batch * block_len * (dk + sq * hq)


def _sizes(q: Any, kv_pages: Any, page_indices: Any) -> list[int]:
    """Powers of two pages per step up to ``pages_per_seq`` (at most 64) within the memory budget
    (the smallest kept even when it does not fit)."""
    cap = min(max(int(page_indices.shape[1]), 1), _MAX_PAGES_PER_BLOCK)
    sizes = [1 << i for i in range(7) if 1 << i <= cap]
    return [s for s in sizes if _step_bytes(q, kv_pages, s) <= _STEP_BYTES_BUDGET] or sizes[:1]


def _target(sizes: list[int], page: int) -> int:
    small = [i for i, s in enumerate(sizes) if s * max(page, 1) <= _TARGET_BLOCK_TOKENS]
    return small[-1] if small else 0


def heuristic_config(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, **_: Any) -> MlaAttentionConfig:
    """The most pages per step with at most 512 positions that fit a 64 MiB step.

    Args:
        q, kv_pages, kv_lens, page_indices: The operation's arrays (anything with ``.shape``).
    """
    sizes = _sizes(q, kv_pages, page_indices)
    return MlaAttentionConfig(pages_per_block=sizes[_target(sizes, int(kv_pages.shape[1]))])


def config_space(q: Any, kv_pages: Any, kv_lens: Any, page_indices: Any, **_: Any) -> list[MlaAttentionConfig]:
    """The heuristic's pages per step, and the sizes next to it (up to four).

    Args: as for :func:`heuristic_config`.
    """
    sizes = _sizes(q, kv_pages, page_indices)
    target = _target(sizes, int(kv_pages.shape[1]))
    picks = [sizes[target], *sizes[max(0, target - 1):target], *sizes[target + 1:target + 3]]
    return [MlaAttentionConfig(pages_per_block=s) for s in picks]
