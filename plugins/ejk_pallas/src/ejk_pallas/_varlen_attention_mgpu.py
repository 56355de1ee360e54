"""``flash_attention_varlen`` on the Mosaic GPU flash attention forward (``pallas/gpu:mosaic``).

The packed sequences become the forward kernel's segments (``_flash_attention_mgpu._forward_impl``) on one
batch row: a token's id is its sequence's index (query rows past the last offset get an id no key has, so
they are zeros; keys past it one no query has), and each query row carries its sequence's offset on the
key axis, ``cu_k[s+1] - cu_q[s+1]``, so the causal / window test is bottom-right aligned per sequence
(``j <= i + cu_k[s+1] - cu_q[s+1]`` is ``p <= r + Sk_s - Sq_s`` for row ``r`` and key ``p`` of sequence
``s``). The forward takes each row's visible keys as one range instead: its sequence's keys
``[cu_k[s], cu_k[s+1])`` cut to the causal / window band (``_segment_blocks.visible_bounds``), tested
against the column index with two compares and nothing else (no key ids are streamed: a sequence's keys
are contiguous); the key blocks each 64-row query block visits are the hull of its rows' ranges, computed
before the kernel runs (only blocks of its own sequences, inside the band, are loaded). The backward's two
kernels test ranges too: dQ each query's (the forward's), dK / dV each key's visible queries
(:func:`key_queries`, ``_segment_blocks.key_visible_bounds``).

Gradients: the Mosaic GPU backward's two kernels (dK / dV, then dQ) with the same segments, offsets and
block ranges seen from both sides, where the config's backward is the Mosaic one (``backward="auto"`` on a
GPU, ``"mosaic"``). Otherwise (``backward="triton_lowered"``, or ``"auto"`` in interpret mode, where the
Triton-lowered backward has no per-row offsets) the call runs under differentiation (``jax.custom_vjp``'s
forward rule) on another implementation of ``ejk.flash_attention_varlen`` with its own backward
(ejk-triton's where installed and able, else ejk-xla's).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

import ejk
from ejk.ops import sinks_cotangent
from ejk.plugin import cotangent_like, sanitize_offsets
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as _mg
from ejk_pallas import _flash_attention_mgpu_bwd as _bwd

__all__ = ["capability", "config_space", "flash_attention_varlen", "heuristic_config", "token_segments"]

#: Up to this many (tokens x offsets), the sequence of each token is one compare-and-count (else a binary search).
_SMALL = 1 << 24
#: Implementations (platforms of ``ejk.flash_attention_varlen``) whose gradients serve this forward, in order.
_GRADIENT_PLATFORMS = ("triton", "xla")


def token_segments(cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array, q_tokens: int,
                   k_tokens: int) -> tuple[jax.Array, jax.Array, jax.Array, tuple[jax.Array, jax.Array]]:
    """``(q_ids [Tq], k_ids [Tk], q_off [Tq], (k_lo [Tq], k_hi [Tq]))`` int32: each token's sequence index
    (``-1`` for query rows and ``-2`` for keys of no sequence), each query row's offset on the key axis,
    ``cu_k[s+1] - cu_q[s+1]``, and its sequence's keys ``[cu_k[s], cu_k[s+1])`` (empty for rows of none)."""
    cu_q = sanitize_offsets(cu_seqlens_q, q_tokens)
    cu_k = sanitize_offsets(cu_seqlens_k, k_tokens)
    n = cu_q.shape[0] - 1

    def seq_of(cu: jax.Array, tokens: int, pad: int) -> jax.Array:
        rows = jnp.arange(tokens, dtype=jnp.int32)
        method = "compare_all" if tokens * cu.shape[0] <= _SMALL else "scan_unrolled"
        seq = jnp.searchsorted(cu, rows, side="right", method=method).astype(jnp.int32) - 1
        return jnp.where((seq >= 0) & (seq < n), seq, pad)

    q_ids = seq_of(cu_q, q_tokens, -1)
    k_ids = seq_of(cu_k, k_tokens, -2)
    if n == 0:
        zeros = jnp.zeros((q_tokens,), jnp.int32)
        return q_ids, k_ids, zeros, (zeros, zeros)
    k_lo, k_hi, q_off = _sequence_ranges(q_ids, cu_k, cu_q, cu_k)
    return q_ids, k_ids, q_off, (k_lo, k_hi)


def _sequence_ranges(ids: jax.Array, cu_other: jax.Array, cu_q: jax.Array,
                     cu_k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(lo, hi, off)`` int32 per token of sequence ``ids`` (negative: none, all zeros): the sequence's range
    ``[cu_other[s], cu_other[s+1])`` on the other axis and its offset ``cu_k[s+1] - cu_q[s+1]``."""
    s = jnp.clip(ids, 0, cu_q.shape[0] - 2) + 1
    real = ids >= 0
    return tuple(jnp.where(real, x, 0).astype(jnp.int32)  # type: ignore[return-value]
                 for x in (cu_other[s - 1], cu_other[s], cu_k[s] - cu_q[s]))


def key_queries(cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array, k_ids: jax.Array, q_tokens: int,
                k_tokens: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(q_lo [Tk], q_hi [Tk], k_off [Tk])`` int32: each key's sequence's queries ``[cu_q[s], cu_q[s+1])`` and
    its offset ``cu_k[s+1] - cu_q[s+1]`` (zeros for keys of no sequence), from :func:`token_segments`'s
    ``k_ids``: the backward's key side of the ranges."""
    cu_q = sanitize_offsets(cu_seqlens_q, q_tokens)
    cu_k = sanitize_offsets(cu_seqlens_k, k_tokens)
    if cu_q.shape[0] == 1:
        zeros = jnp.zeros((k_tokens,), jnp.int32)
        return zeros, zeros, zeros
    return _sequence_ranges(k_ids, cu_q, cu_q, cu_k)


def _cfg(q: Any, k: Any, v: Any, opts: dict[str, Any]) -> _mg.MosaicFlashAttentionConfig:
    cfg: _mg.MosaicFlashAttentionConfig | None = opts["cfg"]
    if cfg is None:
        return _mg.heuristic_config(_batched(q), _batched(k), _batched(v), causal=opts["causal"],
                                    sliding_window=opts["sliding_window"])
    return cfg


def _mosaic(q: jax.Array, k: jax.Array, v: jax.Array, cu_q: jax.Array, cu_k: jax.Array, sinks: jax.Array | None,
            opts: dict[str, Any]) -> tuple[jax.Array, tuple[Any, ...]]:
    """``(out [Tq, Hq, Dv], (out4, lse2, segments))`` of the Mosaic GPU forward on one batch row."""
    tq, tk = q.shape[0], k.shape[0]
    q_ids, k_ids, q_off, (k_lo, k_hi) = token_segments(cu_q, cu_k, tq, tk)
    segments = (q_ids[None], k_ids[None], q_off[None], (k_lo[None], k_hi[None]))
    out, lse = _mg._forward_impl(
        q[None], k[None], v[None], cfg=_cfg(q, k, v, opts), causal=opts["causal"],
        softmax_scale=opts["softmax_scale"], sliding_window=opts["sliding_window"],
        logits_soft_cap=opts["logits_soft_cap"], interpret=_env.use_interpreter(), sinks=sinks, segments=segments)
    return out[0], (out, lse, segments)


def _mosaic_backward(q: Any, k: Any, v: Any, opts: dict[str, Any]) -> bool:
    """Whether the Mosaic GPU backward runs the gradients (the config's choice, see the module docstring)."""
    cfg = _cfg(q, k, v, opts)
    return _mg._mosaic_backward_refusal(cfg, int(q.shape[2]), jnp.dtype(q.dtype).itemsize) is None


def _other(q: jax.Array, k: jax.Array, v: jax.Array, cu_q: jax.Array, cu_k: jax.Array, sinks: jax.Array | None,
           opts: dict[str, Any]) -> jax.Array:
    """The same call on the first of :data:`_GRADIENT_PLATFORMS` that has an implementation for it."""
    call = functools.partial(ejk.flash_attention_varlen, q, k, v, cu_q, cu_k, sinks=sinks, causal=opts["causal"],
                             softmax_scale=opts["softmax_scale"], sliding_window=opts["sliding_window"],
                             logits_soft_cap=opts["logits_soft_cap"], precision=opts["precision"])
    for platform in _GRADIENT_PLATFORMS[:-1]:
        try:
            return call(platform=platform)
        except ejk.KernelNotFoundError:
            continue
    return call(platform=_GRADIENT_PLATFORMS[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, sinks: Any, opts: Any) -> jax.Array:
    return _mosaic(q, k, v, cu_q, cu_k, sinks, dict(opts))[0]


def _varlen_fwd(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, sinks: Any, opts: Any) -> tuple[jax.Array, Any]:
    options = dict(opts)
    if _mosaic_backward(q, k, v, options):
        out, saved = _mosaic(q, k, v, cu_q, cu_k, sinks, options)
        return out, (q, k, v, cu_q, cu_k, sinks, saved)
    out, pullback = jax.vjp(lambda q, k, v, sinks: _other(q, k, v, cu_q, cu_k, sinks, options), q, k, v, sinks)
    return out, (pullback, cu_q, cu_k)


def _varlen_bwd(opts: Any, residuals: Any, d_out: jax.Array) -> tuple[Any, ...]:
    options = dict(opts)
    if len(residuals) == 3:  # another implementation's gradients
        pullback, cu_q, cu_k = residuals
        dq, dk, dv, d_sinks = pullback(d_out)
    else:
        q, k, v, cu_q, cu_k, sinks, (out4, lse, segments) = residuals
        cfg = _cfg(q, k, v, options)
        params = _mg.interpret_params() if _env.use_interpreter() else None
        d4 = d_out[None]
        # Both kernels test ranges: each query's keys (the forward's) and each key's queries.
        key_side = key_queries(cu_q, cu_k, segments[1][0], q.shape[0], k.shape[0])
        dq, dk, dv = _bwd.backward_impl(
            q[None], k[None], v[None], out4, lse, d4, block_q=cfg.bwd_block_q, block_kv=cfg.bwd_block_kv,
            steps=cfg.bwd_max_concurrent_steps, causal=options["causal"], softmax_scale=options["softmax_scale"],
            sliding_window=options["sliding_window"], logits_soft_cap=options["logits_soft_cap"],
            interpret_params=params, fused=False, segments=(*segments, tuple(x[None] for x in key_side)))
        dq, dk, dv = dq[0], dk[0], dv[0]
        d_sinks = None if sinks is None else cotangent_like(sinks_cotangent(sinks, out4, lse, d4), sinks)
    zero = (jnp.zeros(cu_q.shape, jax.dtypes.float0), jnp.zeros(cu_k.shape, jax.dtypes.float0))
    return dq, dk, dv, *zero, d_sinks


_varlen.defvjp(_varlen_fwd, _varlen_bwd)


def flash_attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    sinks: jax.Array | None,
    causal: bool,
    softmax_scale: float,
    sliding_window: tuple[int, int] | None,
    logits_soft_cap: float | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    precision: str,
    cfg: _mg.MosaicFlashAttentionConfig | None = None,
) -> jax.Array:
    """Packed varlen attention (arguments normalised, see KERNEL_CONTRACT.md) on the Mosaic GPU forward;
    ``max_seqlen_*`` unused (the key blocks come from the offsets), ``precision`` moot (16-bit inputs).

    Returns:
        ``[Tq, Hq, Dv]`` in ``q.dtype``; rows that see no key are zeros.
    """
    del max_seqlen_q, max_seqlen_k
    tq, hq, _ = q.shape
    tk, dv = v.shape[0], v.shape[2]
    if min(tq, hq, tk, dv) == 0:
        return jnp.zeros((tq, hq, dv), q.dtype)
    opts = (("causal", causal), ("softmax_scale", float(softmax_scale)), ("sliding_window", sliding_window),
            ("logits_soft_cap", logits_soft_cap), ("precision", precision), ("cfg", cfg))
    return _varlen(q, k, v, cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32), sinks, opts)


def _batched(x: Any) -> jax.ShapeDtypeStruct:
    """An abstract ``[1, T, H, D]`` of a packed ``[T, H, D]`` (what the ``flash_attention`` gates take)."""
    return jax.ShapeDtypeStruct((1, *x.shape), x.dtype)


def capability(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> str | None:
    """Why this implementation cannot run a call, or ``None`` (abstract arguments suffice).

    Supported: what ``pallas/gpu:mosaic``'s ``flash_attention`` supports (bfloat16 / float16, one head dim of
    64 or 128 for q, k and v, GQA, causal, windows, soft cap, sinks) on packed ``[T, H, D]`` tensors; not a
    narrower v (that runs on ``flash_attention``'s ``pallas/gpu:mosaic`` only).
    """
    if _mg.narrow_v(q, v):
        return "v's head dim must equal q's on mosaic_gpu's packed sequences (a narrower v runs without them)"
    return _mg.capability(_batched(q), _batched(k), _batched(v))


def config_space(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> list[_mg.MosaicFlashAttentionConfig]:
    """The forward's candidates (:func:`_flash_attention_mgpu.config_space`) for the packed tensors."""
    return _mg.config_space(_batched(q), _batched(k), _batched(v))


def heuristic_config(q: Any, k: Any, v: Any, *_: Any, causal: bool = False,
                     sliding_window: Any = None, **__: Any) -> _mg.MosaicFlashAttentionConfig:
    """The forward's heuristic (:func:`_flash_attention_mgpu.heuristic_config`) for the packed tensors."""
    return _mg.heuristic_config(_batched(q), _batched(k), _batched(v), causal=causal, sliding_window=sliding_window)
